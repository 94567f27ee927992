"""ParallelEnv rollouts that the workers record themselves: ``env.rollout(T)`` with random actions.

Route (``rollout.random_rollout``): :meth:`WorkerRollouts.storage` gives storage ``[num_envs, *B, T]`` (TorchRL's
rollout keys, time last) in shared memory; the actions for all ``T`` steps are drawn into it and the first root is
copied in; then :meth:`WorkerRollouts.run` sends ``ROLL`` (``protocol.py``): each worker steps its envs through the
span with its rows of the actions, writing its rows of each step's results straight into the storage ("next" at
``t``, the root — the reset observation where an env ended — at ``t + 1``; see ``worker.Recording``). The main
process copies no frame and wakes each worker once per span, not once per step. With ``break_when_any_done`` a
span is one step: the main process reads the done flags between steps, so no step is taken beyond the rollout.
Spans are bounded so that one lasts at most a quarter of the env's ``timeout``.

Storage is recycled by recycle.py's rule: a storage is handed out again only when no tensor, view or numpy array
of it is left; to torch the tensors handed out are plain CPU tensors (not shared ones), so one sent to another
process is copied on the way. Before a fork of this process the storages are retired (a forked child holding a
rollout keeps seeing it as it was). Each storage held costs two file descriptors while it lives (its memfd and its
mapping's), so at most :data:`MAX_LIVE` live in a process: past that, a rollout goes step by step into the
recycler's memory, and holding thousands of rollouts never runs the process out of file descriptors.

A worker replaced during a span (``max_restarts``) has its envs reset by the env; here the step it was running is
written for its envs as a failed step is (the reset observation, reward 0, truncated and done) and it runs the rest
of the span, as the step-by-step rollout does.
"""
from __future__ import annotations

import itertools
import time
import weakref

import torch
from tensordict import TensorDictBase

from .errors import SharedMemoryError
from .portability import has_memfd
from .protocol import ROLL
from .recording import rollout_template
from .recycle import holds_lazy_stacks, retire_before_fork, unheld
from .shared import MappedTensors, in_shared_memory, key_tuple

#: storages kept per env: a loop may hold one rollout while it asks for the next
KEEP = 2
#: storages alive at once in this process (kept, or held by their callers): see the module docstring
MAX_LIVE = 64
_live: list[weakref.ref] = []  # to one array of each storage made


def live_storages() -> int:
    """How many rollout storages of this process are alive (kept by an env, or held by a caller)."""
    _live[:] = [ref for ref in _live if ref() is not None]
    return len(_live)


class _Storage:
    """One rollout storage: ``mapped`` (the memory the workers write, see ``shared.MappedTensors``), ``bound`` (the
    pool's restarts when the workers were given it)."""

    def __init__(self, key: int, mapped: MappedTensors):
        self.key = key
        self.mapped = mapped
        self.bound = None
        self.steps = mapped.batch_size[-1]

    def free(self) -> bool:
        return unheld(self.mapped.arrays)


class WorkerRollouts:
    """The rollout storages of one ParallelEnv and the runs of ``ROLL`` into them (see the module docstring). It
    holds its env by a weak reference: no reference cycle keeps a dropped env (and its storages) alive."""

    def __init__(self, env):
        self._env = weakref.ref(env)
        self.kept: list[_Storage] = []  # least recently used first
        self.control = None  # int64 [num_workers, 3] in shared memory: each worker's (key, t0, t1)
        self._keys = itertools.count()
        self._per_step: float | None = None  # seconds a step took in the last span
        self._current: _Storage | None = None  # the storage the last storage() gave
        retire_before_fork(self)

    @property
    def env(self):
        return self._env()

    def retire(self) -> None:
        """Never fill the storages handed out so far again (the env closed, or this process forks)."""
        self.kept = []

    def forget(self) -> None:
        """Let go of every storage and the control block (the env closed): a rollout its caller still holds keeps
        its own memory, and dropping it frees it."""
        self.kept = []
        self.control = None
        self._current = None

    def storage(self, steps: int) -> TensorDictBase | None:
        """Storage for a rollout of ``steps`` steps (batch ``[*env.batch_size, steps]``) that the workers can
        record into, given to them: recycled when a kept one of that length is free, else new; None when the
        workers cannot record this env's rollouts (a leaf without a numpy dtype, heterogeneous entries)."""
        found = next((s for s in self.kept if s.steps == steps and s.free()), None)
        if found is None:
            found = self._make(rollout_template(self.env, steps))
            if found is None:
                return None
        else:
            self.kept.remove(found)
        self.kept.append(found)
        self._bind(found)
        self._current = found
        return found.mapped.tensordict()

    def _bind(self, storage: _Storage) -> None:
        """Give ``storage`` to the workers that lack it (all at first; later, those replaced since); they let go of
        the storages no longer kept."""
        payload = (storage.key, storage.mapped, self.control, [s.key for s in self.kept])
        storage.bound = self.env._bind_in_workers("bind_rollout", payload, storage.bound)

    def _make(self, template: TensorDictBase) -> _Storage | None:
        if not has_memfd() or holds_lazy_stacks(template):
            return None  # (heterogeneous entries, e.g. one per agent, have no one-piece storage)
        if live_storages() >= MAX_LIVE:
            return None
        try:
            if self.control is None:
                self.control = in_shared_memory(torch.zeros(self.env.num_workers, 3, dtype=torch.int64, device="cpu"),
                                                "the rollout's control block")
            mapped = MappedTensors(template)
        except (SharedMemoryError, TypeError, OSError):  # (TypeError: a dtype numpy lacks)
            return None
        if len(self.kept) >= KEEP:
            self.kept.pop(0)
        if mapped.arrays:
            _live.append(weakref.ref(mapped.arrays[0]))
        return _Storage(next(self._keys), mapped)

    def run(self, t0: int, t1: int) -> None:
        """Steps ``t0 .. t1 - 1`` of the rollout in the storage :meth:`storage` gave last, in spans (see the
        module docstring); then the env's buffers hold the last step, as after ``step_buffers``."""
        env = self.env
        env._touched_since_start = True  # (see BatchedEnv.update_kwargs)
        # as long as a quarter of the timeout allows at the last rollout's pace; the first spans double from one step
        span = 1 if self._per_step is None else self._longest(1 << 62)
        t = t0
        while t < t1:
            stop = min(t1, t + span)
            began = time.perf_counter()
            self._span(t, stop)
            self._per_step = (time.perf_counter() - began) / (stop - t)
            span, t = self._longest(2 * span), stop
        env._after_step(None)

    def _longest(self, span: int) -> int:
        return max(1, int(min(span, self.env.timeout / 4 / max(self._per_step, 1e-6))))  # (timeout may be inf)

    def _span(self, t0: int, t1: int) -> None:
        env = self.env
        storage = self._current
        control = self.control.numpy()
        control[:] = (storage.key, t0, t1)
        workers = list(range(env.num_workers))
        while workers:
            before = list(env._pool.restarts)
            env._run(env._pool.run, ROLL, workers, (ROLL, t1 - t0))  # (waits: see protocol.Wait)
            replaced = [w for w in workers if env._pool.restarts[w] != before[w]]
            if replaced:  # (env._run reset their envs)
                self._bind(storage)
                for w in replaced:
                    self._write_restarted_step(w, int(control[w, 1]))
                    control[w, 1] += 1
            workers = [w for w in replaced if control[w, 1] < t1]

    def _write_restarted_step(self, w: int, t: int) -> None:
        """Step ``t`` of worker ``w``'s envs as a failed step reads: the env's buffers say so (see
        ``ParallelEnv._write_restarted_step``); their rows are copied into the storage."""
        env = self.env
        storage = self._current
        rows = slice(w * env.envs_per_worker, (w + 1) * env.envs_per_worker)
        mask = torch.zeros(env.num_envs, dtype=torch.bool, device="cpu")
        mask[rows] = True
        env._write_restarted_step(mask.reshape(-1, *[1] * (env.batch_dims - 1)).expand(env.batch_size))
        tdim = env.batch_dims
        stored = storage.mapped.tensordict()
        for key, leaf in env.next_buffer.items(True, True):
            stored.get(("next", *key_tuple(key))).select(tdim, t)[rows].copy_(leaf[rows])
        if t + 1 < storage.steps:
            for key, leaf in env.root_buffer.items(True, True):
                stored.get(key).select(tdim, t + 1)[rows].copy_(leaf[rows])
