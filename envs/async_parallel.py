"""AsyncParallelEnv: a ParallelEnv that can also step its workers asynchronously (first finished, first served).

With envs whose step time varies, a synchronous step waits for the slowest worker every time. Here the main
process sends actions to some workers and takes back the results of whichever ``batch_workers`` workers
finish first, while the others keep stepping::

    env = AsyncParallelEnv(8, make_env, batch_workers=4, envs_per_worker=2)
    env.async_reset()                       # every worker resets; none waited for
    for _ in range(1000):
        td = env.recv()                     # the envs of the first 4 workers done: batch [4 * 2]
        env.send(policy(td))                # step those envs with td["action"]; returns at once

``recv()`` returns a TensorDict of batch ``[batch_workers * envs_per_worker]`` with the root keys (the
observation to act on: after an episode end, the reset observation), ``"next"`` (what the last step returned:
observation, reward, done flags; after a reset: the reset observation, reward 0, flags False) and ``"env_ids"``
(int64, the envs' indices in ``range(num_envs)``, whole workers in the order they finished). ``send(td)``
takes back exactly such a batch (``"env_ids"`` plus the action keys). While workers are in flight, the
synchronous ``EnvBase`` API (``step``, ``reset``, ``rollout``, ``set_seed``) raises; ``recv`` the rest first.
Worker failures raise from ``recv`` as in ``ParallelEnv`` (a dead or hung worker closes the env), unless
``max_restarts`` allows replacing the worker: then its envs are reset and a later ``recv`` returns them with
``("next", "truncated")`` and ``("next", "done")`` True and reward 0 (the step that failed is lost), while the
other workers' results are kept.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .engine.errors import ArgumentError, WorkerError, failures_of
from .engine.protocol import RESET, STEP
from .engine.shared import numpy_view
from .engine.values import check_finite
from .inputs import value_checker
from .parallel import ParallelEnv
from .thread_guard import one_thread


class AsyncParallelEnv(ParallelEnv):
    """A :class:`ParallelEnv` with ``async_reset`` / ``send`` / ``recv`` (see the module docstring).

    Args:
        batch_workers: how many workers' envs one ``recv()`` returns (``1 <= batch_workers <= num_workers``).

    Every other argument as in :class:`ParallelEnv` (``max_restarts`` covers both APIs).
    """

    def __init__(self, num_workers: int, create_env_fn, create_env_kwargs=None, *, batch_workers: int, **kwargs):
        if not isinstance(batch_workers, int) or not 1 <= batch_workers <= num_workers:
            raise ValueError(
                f"AsyncParallelEnv needs 1 <= batch_workers <= num_workers ({num_workers}), got {batch_workers!r}."
            )
        super().__init__(num_workers, create_env_fn, create_env_kwargs, **kwargs)
        self._arguments["batch_workers"] = batch_workers  # (a pickle of it is built again with it: __reduce__)
        if self._non_tensor_keys or self.batch_dims != 1:
            self.close()
            raise ArgumentError(
                "AsyncParallelEnv steps unbatched envs with tensor entries only (got batch "
                f"{tuple(self.batch_size)}, non-tensor keys {self._non_tensor_keys}); use ParallelEnv for these."
            )
        self.batch_workers = batch_workers
        k = self.envs_per_worker
        self._slices = [slice(w * k, (w + 1) * k) for w in range(num_workers)]
        self._observation_keys = set(self.full_observation_spec.keys(True, True))
        self._single_action_spec = self._env_specs.action
        self._action_checks = {}  # batch size -> {action key: value check}

    def _bind_buffers(self, buffers: TensorDictBase) -> None:
        """As for every batched env (at construction and at a restart after close), plus the numpy views
        copied from per ``recv`` and the asynchronous state (nothing in flight)."""
        super()._bind_buffers(buffers)
        self._in_flight: list[int] = []  # workers sent a command, not yet received
        self._received: set[int] = set()  # workers received and not yet sent
        self._last_command = [RESET] * self.num_workers
        self._restarted: set[int] = set()  # workers replaced while in flight: their next recv is marked truncated
        # (key, array, tensor dtype) for the root and "next"
        self._root_arrays = [(key, numpy_view(leaf), leaf.dtype) for key, leaf in self.root_buffer.items(True, True)]
        self._next_arrays = [(key, numpy_view(leaf), leaf.dtype) for key, leaf in self.next_buffer.items(True, True)]
        self._action_arrays = [numpy_view(buffer) for _, buffer in self.action_buffers]

    def _forget_buffers(self) -> None:
        """As every batched env at close(), and the numpy views of the buffers go too, so that their memory is freed
        now (not when this object is collected). (Inside close(): a recv / send in flight in another thread that
        reads them ends with the "closed" error, see ``one_thread``.)"""
        self._root_arrays = self._next_arrays = self._action_arrays = []
        self._action_checks = {}
        super()._forget_buffers()

    def closed_under_error(self, call: str) -> RuntimeError:
        """As for every batched env; ``recv`` and ``send`` have nothing to continue after a close (see
        :meth:`_refuse_closed`)."""
        if call in ("recv", "send"):
            return RuntimeError(f"this {self.owner} was closed (from another thread or a signal handler?) while "
                                f"{call}() ran, so it has nothing to continue: async_reset() starts it again.")
        return super().closed_under_error(call)

    def _refuse_closed(self, call: str) -> None:
        """``recv`` and ``send`` continue what ``async_reset`` began: on a closed env (closed from another thread, a
        signal handler, or by you) there is nothing to continue, and starting it again would not bring the batches
        in flight back: the one "closed" error. ``async_reset()`` starts a closed env again."""
        if self.is_closed:
            raise RuntimeError(f"this {self.owner} is closed (from another thread or a signal handler?), so {call}() "
                               "has nothing to continue: async_reset() starts it again.")

    # ----------------------------------------------------------------- asynchronous API
    @one_thread
    def async_reset(self) -> None:
        """Start resetting every env (seeded if :meth:`set_seed` was called); returns at once."""
        self._ensure_open()
        self._ensure_none_in_flight("async_reset()")
        self._reset_mask[:] = True
        self.discard_pending_resets()
        self._start(RESET, list(range(self.num_workers)))
        self._received.clear()

    @one_thread
    def recv(self) -> TensorDictBase:
        """The envs of the first ``batch_workers`` workers that finished (see the module docstring)."""
        self._refuse_closed("recv")
        if len(self._in_flight) < self.batch_workers:
            raise RuntimeError(
                f"recv() needs {self.batch_workers} workers in flight, {len(self._in_flight)} are: call "
                "async_reset() first, and send() back every batch recv() returned."
            )
        code = STEP if any(self._last_command[w] == STEP for w in self._in_flight) else RESET
        workers: list[int] = []
        while len(workers) < self.batch_workers:
            waiting = [w for w in self._in_flight if w not in workers]
            try:
                workers += self._pool.wait_any(self.batch_workers - len(workers), waiting, code)
            except WorkerError as err:
                failed = failures_of(err)
                workers += [w for w in getattr(err, "finished", []) if w not in failed]  # done and well
                self._in_flight = [w for w in self._in_flight if w not in failed]
                try:
                    self._restart_in_flight(err)
                except BaseException:  # no longer in flight: the results of the workers done are dropped
                    self._in_flight = [w for w in self._in_flight if w not in workers]
                    raise
            except KeyboardInterrupt:
                self.close()
                raise
        for w in workers:
            self._in_flight.remove(w)
            self._received.add(w)
        return self._gather(workers)

    def _restart_in_flight(self, err: WorkerError) -> None:
        """Replace the workers behind ``err`` while ``max_restarts`` allows and start resetting them (in flight
        again: a later ``recv`` returns their envs' reset state marked ``truncated``); else close the env when a
        worker died or hung, and raise ``err``. A replacement failing in its start-up uses the same budget."""
        workers, err = self._replace_within_budget(err)
        if workers is None:
            self._close_if_fatal(err)
            raise err
        rows = self._reset_mask.reshape(self.num_workers, -1)
        rows[workers] = True
        self._start(RESET, workers)
        self._restarted.update(workers)

    @one_thread
    def send(self, tensordict: TensorDictBase) -> None:
        """Step the envs of a batch :meth:`recv` returned with its action entries; returns at once."""
        self._refuse_closed("send")
        workers = self._workers_of(tensordict)
        self._write_rows(tensordict, workers)
        for w in workers:
            self._received.discard(w)
        self._start(STEP, workers)

    @property
    def in_flight(self) -> list[int]:
        """Workers stepping or resetting asynchronously (sent, not yet received)."""
        return list(self._in_flight)

    # ----------------------------------------------------------------- internals
    def _start(self, code: int, workers: list[int]) -> None:
        for w in workers:
            self._last_command[w] = code
        self._pool.start(code, workers)
        self._in_flight.extend(workers)

    def _gather(self, workers: list[int]) -> TensorDictBase:
        """Copies of the root and next rows of ``workers``' envs, with ``"env_ids"``."""
        slices = [self._slices[w] for w in workers]
        root = {key: _rows_of(array, slices) for key, array, _ in self._root_arrays}
        next_ = {key: _rows_of(array, slices) for key, array, _ in self._next_arrays}
        k = self.envs_per_worker
        for i, w in enumerate(workers):
            if self._last_command[w] == RESET:  # nothing stepped yet: next = the reset state, reward 0
                part = slice(i * k, (i + 1) * k)
                restarted = w in self._restarted  # its step failed: truncated (and done), as ParallelEnv marks it
                self._restarted.discard(w)
                for key, array in next_.items():
                    if key in self._observation_keys:
                        array[part] = root[key][part]
                    else:
                        name = key if isinstance(key, str) else key[-1]
                        array[part] = restarted and name in ("done", "truncated")
        source = _nested({key: _as_tensor(root[key], dtype) for key, _, dtype in self._root_arrays})
        source["next"] = _nested({key: _as_tensor(next_[key], dtype) for key, _, dtype in self._next_arrays})
        source["env_ids"] = torch.from_numpy(np.concatenate([np.arange(s.start, s.stop) for s in slices]))
        out = TensorDict(source, batch_size=[len(source["env_ids"])])
        if self.check_values:
            check_finite(out.get("next"), self.owner, "step()", source["env_ids"].tolist())
        return out

    def _workers_of(self, tensordict: TensorDictBase) -> list[int]:
        """The workers whose envs ``tensordict["env_ids"]`` names; they must be whole workers that recv()
        returned and that were not sent back yet."""
        env_ids = tensordict.get("env_ids", None)
        if env_ids is None:
            raise KeyError('send() needs the "env_ids" entry of the batch recv() returned.')
        ids = (env_ids if env_ids.dim() == 1 else env_ids.reshape(-1)).tolist()
        k = self.envs_per_worker
        workers = [ids[i] // k for i in range(0, len(ids), k)]
        whole = all(0 <= w < self.num_workers and ids[i * k:(i + 1) * k] == list(range(w * k, (w + 1) * k))
                    for i, w in enumerate(workers))
        if not whole or len(set(workers)) != len(workers):
            raise ValueError(
                f"send() takes whole workers' envs in the order recv() returned them (envs_per_worker={k}); "
                f"got env_ids {ids}."
            )
        stray = [w for w in workers if w not in self._received]
        if stray:
            raise ValueError(
                f"send(): worker(s) {stray} (envs {[list(range(w * k, (w + 1) * k)) for w in stray]}) are not "
                "waiting for actions: send back only what recv() returned, once."
            )
        return workers

    def _write_rows(self, tensordict: TensorDictBase, workers: list[int]) -> None:
        """Check the actions for ``workers``' envs (shape, dtype, values); copy them into the action buffer."""
        n = len(workers) * self.envs_per_worker
        if n not in self._action_checks:
            spec = self._single_action_spec.expand(n)
            self._action_checks[n] = {key: value_checker(spec[key]) for key in self.action_keys}
        values = self.checked_actions(tensordict, n, self._action_checks[n])
        k = self.envs_per_worker
        for array, value in zip(self._action_arrays, values):
            value = numpy_view(value.detach().cpu())
            for i, w in enumerate(workers):
                array[self._slices[w]] = value[i * k:(i + 1) * k]

    def _ensure_none_in_flight(self, what: str) -> None:
        if getattr(self, "_in_flight", None):
            raise RuntimeError(
                f"AsyncParallelEnv: {what} while workers {sorted(self._in_flight)} are stepping asynchronously; "
                "recv() their results first."
            )

    def begin(self, command: str, mask: np.ndarray | None = None, call: tuple = ()) -> None:
        self._ensure_none_in_flight(f"begin({command!r})")
        super().begin(command, mask, call)

    def _run(self, fn, *args, **kwargs):
        """Every synchronous command (step, reset, rollout, set_seed) comes here: refused while workers are
        in flight; batches received and not sent back are dropped."""
        self._ensure_none_in_flight("the synchronous API (step, reset, rollout, set_seed)")
        self._received = set()
        return super()._run(fn, *args, **kwargs)


def _rows_of(array: np.ndarray, slices: list[slice]) -> np.ndarray:
    """A new array with the rows of ``array`` in ``slices``, in order."""
    return array[slices[0]].copy() if len(slices) == 1 else np.concatenate([array[s] for s in slices])


def _as_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``array`` as a tensor of ``dtype`` (numpy_view holds dtypes numpy lacks as same-size ints)."""
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _nested(flat: dict) -> dict:
    """``{key or key tuple: tensor}`` -> nested dicts (a TensorDict source)."""
    nested: dict = {}
    for key, value in flat.items():
        *path, leaf = key if isinstance(key, tuple) else (key,)
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested
