"""WorkerPool: processes driven by semaphores and a shared command array (used by ParallelEnv and the
collectors), and WorkerChannel: a worker's end of it.

Main process -> worker ``w``: write ``command[w]`` (an int code), release ``wake[w]``.
Worker ``w`` -> main process: write ``status[w]`` (OK or FAILED, plus a report on the pipe), release
``done[w]``. The pipe carries start-up messages, rare calls (code ``CALL``: ``(method, args)`` in,
``("result", value)`` out) and error reports — never per-step data. ``CLOSE`` ends a worker.

While it waits, the main process checks every ``poll_s`` that the worker is alive (a dead one is a
:class:`~envs.errors.WorkerDiedError` with its exit code) and enforces ``timeout``; an idle worker wakes every
second to exit if the main process is gone (and, on Linux, is killed with it anyway).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np
import torch
import torch.multiprocessing as tmp

from .errors import EnvWorkerError, MissingMainGuardError, WorkerDiedError, WorkerTimeoutError

CALL, CLOSE = 100, 101
OK, FAILED = 0, 1
IDLE_POLL_S = 1.0
START_METHODS = ("fork", "forkserver", "spawn")
# A worker importing an unguarded main module exits with this code; the main process explains it once.
MISSING_GUARD_EXIT = 78

_GUARD_MESSAGE = """\
{owner}'s worker processes (start method {method!r}) re-ran the top level of your script, which creates
the {owner} again. With 'spawn' and 'forkserver', each worker imports the main module, so the code that
creates envs must sit under a main guard:

    if __name__ == "__main__":
        env = ParallelEnv(...)
        ...

Or pass mp_start_method="fork" (Linux, the default there), which does not re-run the script."""


def default_start_method() -> str:
    """``"fork"`` where the platform has it (fast start, no main guard needed), else ``"spawn"``."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def exit_if_bootstrapping() -> None:
    """Called first by every constructor that starts workers: inside a worker that is importing an
    unguarded main module, leave quietly with MISSING_GUARD_EXIT (the main process explains)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(MISSING_GUARD_EXIT)


def resolve_start_method(method: str | None) -> str:
    method = method or default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"mp_start_method must be one of {START_METHODS}, got {method!r}.")
    return method


class WorkerPool:
    """``num_workers`` processes running ``target(channel, *args[w])``; see the module docstring."""

    def __init__(self, target: Callable, args: list[tuple], *, start_method: str, timeout: float,
                 owner: str, command_names: dict[int, str]):
        self.owner = owner
        self.start_method = start_method
        self.timeout = float(timeout)
        self.command_names = {CALL: "a call", CLOSE: "close", **command_names}
        self._poll_s = min(0.25, self.timeout)
        num_workers = len(args)
        context = tmp.get_context(start_method)
        if start_method == "forkserver":
            context.set_forkserver_preload(["envs.pool", "envs.worker"])
        self._command_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
        self._status_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
        self._command = self._command_tensor.numpy()
        self._status = self._status_tensor.numpy()
        self._wake = [context.Semaphore(0) for _ in range(num_workers)]
        self._done = [context.Semaphore(0) for _ in range(num_workers)]
        self.procs, self.conns = [], []
        try:
            for w in range(num_workers):
                parent_conn, child_conn = context.Pipe()
                channel = WorkerChannel(w, child_conn, self._wake[w], self._done[w],
                                        self._command_tensor, self._status_tensor)
                proc = context.Process(target=target, args=(channel, *args[w]),
                                       name=f"{owner}-worker-{w}", daemon=False)
                proc.start()
                child_conn.close()
                self.procs.append(proc)
                self.conns.append(parent_conn)
        except BaseException:
            self.stop()
            raise

    @property
    def num_workers(self) -> int:
        return len(self._wake)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [p.pid for p in self.procs if p.exitcode is None]

    # ----------------------------------------------------------------- pipe messages
    def send_all(self, message) -> None:
        for conn in self.conns:
            conn.send(message)

    def receive_all(self, during: str) -> list:
        """One ``(kind, value)`` message per worker, with liveness checks and the timeout; a ``("error",
        report)`` message becomes an :class:`~envs.errors.EnvWorkerError`. Returns the values."""
        deadline = time.monotonic() + self.timeout
        values = []
        for w, conn in enumerate(self.conns):
            while not conn.poll(self._poll_s):
                self._check_alive(w, during, deadline)
            try:
                kind, value = conn.recv()
            except EOFError:
                kind, value = "eof", None
            if kind == "eof":
                self.procs[w].join(1.0)
                self._raise_dead(w, during)
            if kind == "error":
                raise worker_error(w, value)
            values.append(value)
        return values

    # ----------------------------------------------------------------- commands
    def run(self, code: int, workers=None) -> None:
        """Send ``code`` to ``workers`` (default: all) and wait until each has finished it."""
        workers = range(self.num_workers) if workers is None else workers
        self._command[:] = code
        for w in workers:
            self._wake[w].release()
        self.wait(workers, code)

    def call(self, method: str, args_per_worker: list[tuple]) -> list:
        """Run ``method(*args)`` on each worker's call target; return the results in worker order."""
        self._command[:] = CALL
        for w, args in enumerate(args_per_worker):
            self._wake[w].release()
            self.conns[w].send((method, args))
        self.wait(range(self.num_workers), CALL)
        return [conn.recv()[1] for conn in self.conns]

    def wait(self, workers, code: int) -> None:
        """Wait until every worker in ``workers`` posted ``done``; raise what failed."""
        during = self.command_names.get(code, f"command {code}")
        deadline = None
        for w in workers:
            done = self._done[w]
            while not done.acquire(timeout=self._poll_s):
                deadline = deadline or time.monotonic() + self.timeout - self._poll_s
                self._check_alive(w, during, deadline)
        if self._status.any():
            failed = np.flatnonzero(self._status).tolist()
            errors = [worker_error(w, self.conns[w].recv()[1]) for w in failed]
            self._status[:] = OK
            if code == CALL:
                for w in set(workers) - set(failed):
                    self.conns[w].recv()
            raise errors[0]

    def _check_alive(self, w: int, during: str, deadline: float) -> None:
        if self.procs[w].exitcode is not None:
            self._raise_dead(w, during)
        if time.monotonic() > deadline:
            self.stop()
            raise WorkerTimeoutError(w, self.timeout, during)

    def _raise_dead(self, w: int, during: str):
        proc = self.procs[w]
        pid, exitcode = proc.pid, proc.exitcode
        self.stop()
        if exitcode == MISSING_GUARD_EXIT:
            raise MissingMainGuardError(_GUARD_MESSAGE.format(owner=self.owner, method=self.start_method))
        raise WorkerDiedError(w, pid, exitcode, during)

    # ----------------------------------------------------------------- closing
    @property
    def stopped(self) -> bool:
        return not self.procs and not self.conns

    def stop(self) -> None:
        """Ask every live worker to close, wait up to 2 s, then kill what is left; idempotent."""
        procs, self.procs = self.procs, []
        for w, proc in enumerate(procs):
            if proc.exitcode is None:
                self._command[w] = CLOSE
                self._wake[w].release()
        deadline = time.monotonic() + 2.0
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(5.0)
            proc.close()
        for conn in self.conns:
            conn.close()
        self.conns = []


def worker_error(w: int, report: dict) -> EnvWorkerError:
    return EnvWorkerError(w, report["type"], report["message"], report["traceback"], report["during"])


def error_report(exc: BaseException, during: str) -> dict:
    """What a worker sends about an exception: ``type``, ``message``, ``traceback``, ``during``."""
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc(),
            "during": during}


class WorkerChannel:
    """A worker's end of the pool: its pipe, its two semaphores and the shared command/status arrays."""

    def __init__(self, index, conn, wake, done, command: torch.Tensor, status: torch.Tensor):
        self.index, self.conn, self.wake, self.done = index, conn, wake, done
        self.command_tensor, self.status_tensor = command, status

    def start(self) -> None:
        """First thing in a worker: die with the main process; one thread (the cores are the workers')."""
        _die_with_parent()
        torch.set_num_threads(1)

    def fail_start(self, exc: BaseException, during: str = "construction") -> None:
        """Report a start-up failure and exit the worker."""
        self.conn.send(("error", error_report(exc, during)))
        self.conn.close()
        sys.exit(1)

    def serve(self, handlers: dict[int, Callable[[], Any]], call_target: Any, names: dict[int, str]) -> None:
        """The worker loop: block on ``wake``, run ``handlers[command]``, report, release ``done``; until
        CLOSE or until the main process is gone. Exceptions are reported and the loop goes on."""
        command, status, index = self.command_tensor.numpy(), self.status_tensor.numpy(), self.index
        while True:
            if not self.wake.acquire(timeout=IDLE_POLL_S):
                if not _main_process_alive():
                    return
                continue
            code = int(command[index])
            if code == CLOSE:
                status[index] = OK
                self.done.release()
                return
            try:
                if code == CALL:
                    method, args = self.conn.recv()
                    self.conn.send(("result", getattr(call_target, method)(*args)))
                else:
                    handlers[code]()
                status[index] = OK
            except BaseException as exc:  # noqa: BLE001 - reported, and the loop goes on
                status[index] = FAILED
                self.conn.send(("error", error_report(exc, names.get(code, f"command {code}"))))
            self.done.release()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (the main process, or the forkserver, which
    itself ends with the main process); the idle poll of :func:`_main_process_alive` is the fallback."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass
    if not _main_process_alive():
        os._exit(0)


def _main_process_alive() -> bool:
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()
