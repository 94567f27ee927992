"""ParallelEnv: envs in worker processes that exchange data through shared-memory buffers."""
from __future__ import annotations

import pickle
from typing import Callable, Sequence

import numpy as np
import torch

from .batched import BatchedEnv
from .errors import SpecMismatchError, WorkerDiedError, WorkerError, WorkerTimeoutError, failures_of
from .factories import PickledFactory, resolve_factories
from .pool import WorkerPool, exit_if_bootstrapping, resolve_start_method
from .shared import allocate_buffers
from .specs import spec_differences
from .worker import COMMAND_NAMES, RESET, STEP, run_worker


class ParallelEnv(BatchedEnv):
    """``num_workers`` processes with ``envs_per_worker`` envs each; batch size ``[num_workers * envs_per_worker]``.

    Env ``i`` lives in worker ``i // envs_per_worker``. Every env is built inside its worker, never here.

    Args:
        num_workers: number of worker processes.
        create_env_fn: a constructor returning a ``gymnasium.Env`` or an unbatched TorchRL ``EnvBase``, or a
            list of ``num_workers`` constructors (one per worker). Not an env instance.
        create_env_kwargs: keyword arguments for the constructor(s): a dict, or a list of dicts (per worker).
        envs_per_worker: envs stepped one after the other inside each worker.
        mp_start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default :func:`default_start_method`.
            The global start method is never read nor changed.
        timeout: seconds a worker may take for one command before :class:`~tdcollect.envs.errors.WorkerTimeoutError`.
        check_actions: check actions against ``action_spec`` (values too) before sending them.
        max_restarts: how many times in all a worker that died, hung or raised may be replaced by a fresh one
            (opt-in; default 0). Its envs come back reset; in the step that failed they are marked
            ``truncated`` (and ``done``) with the reset observation as ``("next", obs)`` and reward 0; the other
            workers' data is untouched. A warning is issued and ``restarts`` counts them per worker.
        spin_s: seconds the main process and the workers poll for each other before blocking (see
            ``pool.py``). Default None: 1 ms when ``num_workers + 1`` fits in the usable cores, else 0 (block
            at once: spinning on a full machine slows the workers down).

    Errors from workers arrive as :class:`~tdcollect.envs.errors.EnvWorkerError` (an exception in an env),
    :class:`~tdcollect.envs.errors.WorkerDiedError` and :class:`~tdcollect.envs.errors.WorkerTimeoutError`; after the last two
    the env is closed.
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable | Sequence[Callable],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        *,
        envs_per_worker: int = 1,
        mp_start_method: str | None = None,
        timeout: float = 120.0,
        check_actions: bool = True,
        max_restarts: int = 0,
        spin_s: float | None = None,
    ):
        exit_if_bootstrapping()
        factories = resolve_factories(create_env_fn, num_workers, create_env_kwargs, "ParallelEnv", "num_workers")
        if not isinstance(envs_per_worker, int) or envs_per_worker < 1:
            raise ValueError(f"ParallelEnv needs envs_per_worker >= 1 (an int), got {envs_per_worker!r}.")
        method = resolve_start_method(mp_start_method)
        pickled = [PickledFactory(fn, "ParallelEnv", f"worker {w}") for w, fn in enumerate(factories)]
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.start_method = method
        self.timeout = float(timeout)
        self.max_restarts = int(max_restarts)
        num_envs = num_workers * envs_per_worker
        self._pool = WorkerPool(
            run_worker,
            [(factory, envs_per_worker, w * envs_per_worker) for w, factory in enumerate(pickled)],
            start_method=method, timeout=timeout, owner="ParallelEnv", command_names=COMMAND_NAMES,
            spin_s=spin_s,
        )
        try:
            specs = self._check_specs([pickle.loads(p) for p in self._pool.receive_all("construction")])
            self._buffers_shared = allocate_buffers(specs, num_envs, shared=True)
            self._reset_tensor = torch.zeros(num_envs, dtype=torch.bool).share_memory_()
            self._reset_mask = self._reset_tensor.numpy()
            self._pool.send_all(("buffers", self._buffers_shared, self._reset_tensor))
            self._pool.receive_all("start-up")
        except BaseException:
            self._pool.stop()
            raise
        self._specs = specs
        super().__init__(specs, num_envs, self._buffers_shared, check_actions=check_actions)

    @staticmethod
    def _check_specs(specs, workers=None):
        """``specs[0]`` if every worker's specs equal it, else a SpecMismatchError naming the keys."""
        workers = list(range(len(specs))) if workers is None else workers
        reference = specs[0].as_composite()
        for w, other in zip(workers[1:], specs[1:]):
            diffs = spec_differences(reference, other.as_composite())
            if diffs:
                raise SpecMismatchError(
                    f"worker {w}'s envs have other specs than worker {workers[0]}'s: {'; '.join(diffs)}. "
                    "All constructors of one ParallelEnv must build envs with the same specs."
                )
        return specs[0]

    # ----------------------------------------------------------------- commands
    def _run_step(self) -> None:
        self._run(self._pool.run, STEP)

    def _run_reset(self, mask: np.ndarray | None) -> None:
        self._reset_mask[:] = True if mask is None else mask
        per_worker = self._reset_mask.reshape(self.num_workers, self.envs_per_worker).any(1)
        self._run(self._pool.run, RESET, np.flatnonzero(per_worker).tolist())

    def _run_set_seeds(self, seeds: list[int]) -> None:
        k = self.envs_per_worker
        self._run(self._pool.call, "set_seeds", [(seeds[w * k : (w + 1) * k],) for w in range(self.num_workers)])

    def _run(self, fn, *args):
        """Run a pool command. A failed worker is replaced while ``max_restarts`` allows (then the command's
        result stands, see the class docstring); otherwise, when a worker died or hung, or on Ctrl-C, this
        env is closed before the error propagates."""
        try:
            return fn(*args)
        except WorkerError as err:
            failures = None if self.is_closed else self._pool.replaceable(err, self.max_restarts)
            if failures is None:
                self._close_if_fatal(err)
                raise
            self._restart(failures, stepping=fn == self._pool.run and args[0] == STEP)
        except KeyboardInterrupt:
            self.close()
            raise

    def _close_if_fatal(self, err: WorkerError) -> None:
        """Close this env when a worker behind ``err`` died or hung (an exception raised by an env leaves the
        env usable)."""
        if any(isinstance(e, (WorkerDiedError, WorkerTimeoutError)) for e in failures_of(err).values()):
            self.close()

    def _restart(self, failures: dict, stepping: bool) -> None:
        """Replace the failed workers, reset their envs and, when a step failed, write that step's "next"
        for them: the reset observation, reward 0, truncated and done. On any error here the env closes."""
        workers = sorted(failures)
        try:
            for w in workers:
                self._pool.restart(w, failures[w])
                self._check_specs([self._specs, pickle.loads(self._pool.receive(w, "construction"))], [0, w])
                self._pool.conns[w].send(("buffers", self._buffers_shared, self._reset_tensor))
                self._pool.receive(w, "start-up")
            k = self.envs_per_worker
            self._reset_mask[:] = False
            for w in workers:
                self._reset_mask[w * k : (w + 1) * k] = True
            self._pool.run(RESET, workers)
        except BaseException:
            self.close()
            raise
        if stepping:
            self._write_restarted_step(torch.as_tensor(self._reset_mask))

    def _write_restarted_step(self, rows: torch.Tensor) -> None:
        for key in self.full_observation_spec.keys(True, True):
            self._next.get(key)[rows] = self._root.get(key)[rows]
        for key in self.reward_keys:
            self._next.get(key)[rows] = 0
        for key in self.done_keys:
            name = key if isinstance(key, str) else key[-1]
            self._next.get(key)[rows] = name != "terminated"

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return list(self._pool.restarts)

    def _shutdown(self) -> None:
        self._pool.stop()
        self._reset_tensor = self._reset_mask = self._buffers_shared = None

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return self._pool.pids
