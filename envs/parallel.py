"""ParallelEnv: envs in worker processes that exchange data through shared-memory buffers."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.multiprocessing as tmp

from .batched import BatchedEnv
from .errors import (
    EnvWorkerError,
    MissingMainGuardError,
    SpecMismatchError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from .factories import PickledFactory, resolve_factories
from .shared import allocate_buffers
from .specs import spec_differences
from .worker import CALL, CLOSE, COMMAND_NAMES, RESET, STEP, run_worker

# A worker re-running an unguarded script exits with this code instead of printing a traceback.
MISSING_GUARD_EXIT = 78
START_METHODS = ("fork", "forkserver", "spawn")

_GUARD_MESSAGE = """\
ParallelEnv's worker processes (start method {method!r}) re-ran the top level of your script, which creates
the ParallelEnv again. With 'spawn' and 'forkserver', each worker imports the main module, so the code that
creates envs must sit under a main guard:

    if __name__ == "__main__":
        env = ParallelEnv(...)
        ...

Or pass mp_start_method="fork" (Linux, the default there), which does not re-run the script."""


def default_start_method() -> str:
    """``"fork"`` where the platform has it (fast start, no main guard needed), else ``"spawn"``."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


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
        timeout: seconds a worker may take for one command before :class:`~envs.errors.WorkerTimeoutError`.
        check_actions: check actions against ``action_spec`` (values too) before sending them.

    Errors from workers arrive as :class:`~envs.errors.EnvWorkerError` (an exception in an env),
    :class:`~envs.errors.WorkerDiedError` and :class:`~envs.errors.WorkerTimeoutError`; after the last two
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
    ):
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # a worker is importing an unguarded main module (see _GUARD_MESSAGE): leave quietly with a code
            # the main process recognises and explains once
            os._exit(MISSING_GUARD_EXIT)
        factories = resolve_factories(create_env_fn, num_workers, create_env_kwargs, "ParallelEnv", "num_workers")
        if not isinstance(envs_per_worker, int) or envs_per_worker < 1:
            raise ValueError(f"ParallelEnv needs envs_per_worker >= 1 (an int), got {envs_per_worker!r}.")
        method = mp_start_method or default_start_method()
        if method not in START_METHODS:
            raise ValueError(f"mp_start_method must be one of {START_METHODS}, got {method!r}.")
        pickled = [PickledFactory(fn, "ParallelEnv", f"worker {w}") for w, fn in enumerate(factories)]
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.start_method = method
        self.timeout = float(timeout)
        self._poll_s = min(0.25, self.timeout)
        self._procs, self._conns = [], []
        self.__dict__["is_closed"] = False
        try:
            specs = self._start_workers(pickled)
            num_envs = num_workers * envs_per_worker
            buffers = allocate_buffers(specs, num_envs, shared=True)
            self._command_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
            self._status_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
            self._reset_tensor = torch.zeros(num_envs, dtype=torch.bool).share_memory_()
            self._command = self._command_tensor.numpy()
            self._status = self._status_tensor.numpy()
            self._reset_mask = self._reset_tensor.numpy()
            for conn in self._conns:
                conn.send(("buffers", buffers, self._command_tensor, self._status_tensor, self._reset_tensor))
            self._receive_all("ready", "start-up")
        except BaseException:
            self._stop_workers()
            raise
        super().__init__(specs, num_envs, buffers, check_actions=check_actions)

    # ----------------------------------------------------------------- start-up
    def _start_workers(self, factories):
        context = tmp.get_context(self.start_method)
        if self.start_method == "forkserver":
            context.set_forkserver_preload(["envs.worker"])
        self._wake = [context.Semaphore(0) for _ in range(self.num_workers)]
        self._done = [context.Semaphore(0) for _ in range(self.num_workers)]
        for w, factory in enumerate(factories):
            parent_conn, child_conn = context.Pipe()
            proc = context.Process(
                target=run_worker,
                args=(w, factory, self.envs_per_worker, w * self.envs_per_worker, child_conn,
                      self._wake[w], self._done[w]),
                name=f"ParallelEnv-worker-{w}",
                daemon=False,
            )
            proc.start()
            child_conn.close()
            self._procs.append(proc)
            self._conns.append(parent_conn)
        specs = [pickle.loads(payload) for payload in self._receive_all("specs", "construction")]
        reference = specs[0].as_composite()
        for w, other in enumerate(specs[1:], start=1):
            diffs = spec_differences(reference, other.as_composite())
            if diffs:
                raise SpecMismatchError(
                    f"worker {w}'s envs have other specs than worker 0's: {'; '.join(diffs)}. "
                    "All constructors of one ParallelEnv must build envs with the same specs."
                )
        return specs[0]

    def _receive_all(self, expected: str, during: str) -> list:
        """One message per worker, with liveness checks and the timeout; errors become exceptions."""
        deadline = time.monotonic() + self.timeout
        values = []
        for w, conn in enumerate(self._conns):
            while not conn.poll(self._poll_s):
                self._check_alive(w, during, deadline)
            try:
                kind, value = conn.recv()
            except EOFError:
                kind, value = "eof", None
            if kind == "eof":
                self._procs[w].join(1.0)
                self._raise_dead(w, during)
            if kind == "error":
                raise self._worker_error(w, value)
            values.append(value)
        return values

    # ----------------------------------------------------------------- commands
    def _run_step(self) -> None:
        self._command[:] = STEP
        for wake in self._wake:
            wake.release()
        self._wait(range(self.num_workers), STEP)

    def _run_reset(self, mask: np.ndarray | None) -> None:
        self._reset_mask[:] = True if mask is None else mask
        per_worker = self._reset_mask.reshape(self.num_workers, self.envs_per_worker).any(1)
        workers = np.flatnonzero(per_worker).tolist()
        self._command[:] = RESET
        for w in workers:
            self._wake[w].release()
        self._wait(workers, RESET)

    def _run_set_seeds(self, seeds: list[int]) -> None:
        self._command[:] = CALL
        k = self.envs_per_worker
        for w in range(self.num_workers):
            self._wake[w].release()
            self._conns[w].send(("set_seeds", (seeds[w * k : (w + 1) * k],)))
        self._wait(range(self.num_workers), CALL)
        for conn in self._conns:
            conn.recv()

    def _wait(self, workers, code: int) -> None:
        """Wait until every worker in ``workers`` posted ``done``; raise what failed."""
        during = COMMAND_NAMES[code]
        deadline = None
        for w in workers:
            done = self._done[w]
            while not done.acquire(timeout=self._poll_s):
                deadline = deadline or time.monotonic() + self.timeout - self._poll_s
                self._check_alive(w, during, deadline)
        if self._status.any():
            failed = np.flatnonzero(self._status).tolist()
            errors = [self._worker_error(w, self._conns[w].recv()[1]) for w in failed]
            self._status[:] = 0
            if code == CALL:
                for w in set(workers) - set(failed):
                    self._conns[w].recv()
            raise errors[0]

    def _check_alive(self, w: int, during: str, deadline: float) -> None:
        if self._procs[w].exitcode is not None:
            self._raise_dead(w, during)
        if time.monotonic() > deadline:
            self._stop_workers()
            raise WorkerTimeoutError(w, self.timeout, during)

    def _raise_dead(self, w: int, during: str):
        proc = self._procs[w]
        pid, exitcode = proc.pid, proc.exitcode
        self._stop_workers()
        if exitcode == MISSING_GUARD_EXIT:
            raise MissingMainGuardError(_GUARD_MESSAGE.format(method=self.start_method))
        raise WorkerDiedError(w, pid, exitcode, during)

    def _worker_error(self, w: int, report: dict) -> EnvWorkerError:
        return EnvWorkerError(w, report["type"], report["message"], report["traceback"], report["during"])

    # ----------------------------------------------------------------- closing
    def _shutdown(self) -> None:
        self._stop_workers()

    def _stop_workers(self) -> None:
        """Ask every live worker to close, wait up to 2 s, then kill what is left; idempotent."""
        procs, self._procs = self._procs, []
        command = self.__dict__.get("_command")
        for w, proc in enumerate(procs):
            if proc.exitcode is None and command is not None:
                command[w] = CLOSE
                self._wake[w].release()
        deadline = time.monotonic() + 2.0
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(5.0)
            proc.close()
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._wake = self._done = []
        self._command_tensor = self._status_tensor = self._reset_tensor = None
        self._command = self._status = self._reset_mask = None
        self.__dict__["is_closed"] = True

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [p.pid for p in self._procs if p.exitcode is None]
