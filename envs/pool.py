"""WorkerPool: processes driven by semaphores and a shared command array (used by ParallelEnv and the
collectors), and WorkerChannel: a worker's end of it.

Main process -> worker ``w``: write ``command[w]`` (an int code), release ``wake[w]``.
Worker ``w`` -> main process: write ``status[w]`` (OK or FAILED, plus a report on the pipe), release
``done[w]`` — and, when the code carries the ``NOTIFY`` bit, then ``any_done`` too (one semaphore shared by
all workers: :meth:`WorkerPool.wait_any` waits for whichever workers finish first). The pipe carries start-up messages, rare calls (code ``CALL``: ``(method, args)`` in,
``("result", value)`` out) and error reports — never per-step data. ``CLOSE`` ends a worker.

While it waits, the main process checks every ``poll_s`` that the worker is alive (a dead one is a
:class:`~tdcollect.envs.errors.WorkerDiedError` with its exit code) and enforces ``timeout``; an idle worker wakes every
second to exit if the main process is gone (and, on Linux, is killed with it anyway).

Waiting: bounded spin, then block. Waking a process blocked on a semaphore costs tens to hundreds of µs on a
VM, more than a cheap step; polling the semaphore (``acquire(False)``, no system call) answers in about a µs
but burns a core. So both sides poll for ``spin_s`` seconds before they block — the main process after it
sent a command, a worker after it finished one — and :func:`default_spin_s` only spins when every worker and
the main process can have a core of their own; with fewer cores spinning would slow the workers down.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch.multiprocessing as tmp

from .errors import (
    EnvWorkerError,
    MissingMainGuardError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    failures_of,
)

CALL, CLOSE = 100, 101
NOTIFY = 0x100  # a command code with this bit also releases ``any_done`` when the worker finishes
OK, FAILED = 0, 1
IDLE_POLL_S = 1.0
START_METHODS = ("fork", "forkserver", "spawn")
SPIN_S = 0.001  # how long a side polls before it blocks, when there are cores to spare
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


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_spin_s(num_workers: int) -> float:
    """:data:`SPIN_S` when the workers and the main process fit on the usable cores, else 0 (block at once)."""
    return SPIN_S if num_workers + 1 <= usable_cores() else 0.0


def resolve_spin_s(spin_s: float | None, num_workers: int) -> float:
    if spin_s is None:
        return default_spin_s(num_workers)
    if not isinstance(spin_s, (int, float)) or spin_s < 0:
        raise ValueError(f"spin_s must be None (automatic) or seconds >= 0, got {spin_s!r}.")
    return float(spin_s)


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
                 owner: str, command_names: dict[int, str], spin_s: float | None = None):
        self.owner = owner
        self.spin_s = resolve_spin_s(spin_s, len(args))
        self.start_method = start_method
        self.timeout = float(timeout)
        self.command_names = {CALL: "a call", CLOSE: "close", **command_names}
        self._poll_s = min(0.25, self.timeout)
        num_workers = len(args)
        context = tmp.get_context(start_method)
        if start_method == "forkserver":
            context.set_forkserver_preload(["tdcollect.envs.pool", "tdcollect.envs.worker"])
        self._command_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
        self._status_tensor = torch.zeros(num_workers, dtype=torch.int32).share_memory_()
        self._command = self._command_tensor.numpy()
        self._status = self._status_tensor.numpy()
        self._context, self._target, self._args = context, target, args
        self._wake, self._done = [None] * num_workers, [None] * num_workers
        self._any_done = context.Semaphore(0)
        self._last_liveness_check = 0.0
        self.procs, self.conns = [None] * num_workers, [None] * num_workers
        self.restarts = [0] * num_workers
        try:
            for w in range(num_workers):
                self._start_worker(w)
        except BaseException:
            self.stop()
            raise

    def _start_worker(self, w: int) -> None:
        context = self._context
        self._wake[w], self._done[w] = context.Semaphore(0), context.Semaphore(0)
        parent_conn, child_conn = context.Pipe()
        channel = WorkerChannel(w, child_conn, self._wake[w], self._done[w],
                                self._command_tensor, self._status_tensor, self.spin_s, self._any_done)
        proc = context.Process(target=self._target, args=(channel, *self._args[w]),
                               name=f"{self.owner}-worker-{w}", daemon=False)
        self.procs[w], self.conns[w] = proc, parent_conn
        proc.start()
        child_conn.close()

    def replaceable(self, err: Exception, max_restarts: int) -> dict | None:
        """The failures behind ``err`` (``{worker: exception}``) when replacing those workers keeps the
        pool within ``max_restarts`` replacements in all; None when it does not (or ``err`` is no worker's)."""
        if not isinstance(err, WorkerError):
            return None
        failures = failures_of(err)
        return failures if sum(self.restarts) + len(failures) <= max_restarts else None

    def restart(self, w: int, cause: Exception) -> None:
        """Replace worker ``w``, which failed with ``cause``, by a fresh process running the same target and
        arguments, with a RuntimeWarning (the caller repeats its start-up exchange with it)."""
        warnings.warn(f"{self.owner}: restarting worker {w} after: {str(cause).splitlines()[0]}",
                      RuntimeWarning, stacklevel=4)
        old, conn = self.procs[w], self.conns[w]
        if old.exitcode is None:
            old.kill()
        old.join(5.0)
        old.close()
        conn.close()
        self._status[w] = OK
        self._start_worker(w)
        self.restarts[w] += 1

    @property
    def num_workers(self) -> int:
        return len(self._wake)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [p.pid for p in self.procs if p is not None and p.exitcode is None]

    # ----------------------------------------------------------------- pipe messages
    def send_all(self, message) -> None:
        for conn in self.conns:
            conn.send(message)

    def receive_all(self, during: str) -> list:
        """One message value per worker (see :meth:`receive`), in worker order."""
        return [self.receive(w, during) for w in range(self.num_workers)]

    def receive(self, w: int, during: str):
        """The value of worker ``w``'s next ``(kind, value)`` message, waiting with liveness checks and the
        timeout; ``("error", report)`` becomes an :class:`~tdcollect.envs.errors.EnvWorkerError`, a dead worker a
        :class:`~tdcollect.envs.errors.WorkerDiedError` (or :class:`~tdcollect.envs.errors.MissingMainGuardError`)."""
        deadline = time.monotonic() + self.timeout
        conn = self.conns[w]
        while not conn.poll(self._poll_s):
            failure = self._liveness_failure(w, during, deadline)
            if failure is not None:
                raise failure
        try:
            kind, value = conn.recv()
        except EOFError:
            self.procs[w].join(1.0)
            raise self._death(w, during) from None
        if kind == "error":
            raise worker_error(w, value)
        return value

    # ----------------------------------------------------------------- commands
    def run(self, code: int, workers=None) -> None:
        """Send ``code`` to ``workers`` (default: all) and wait until each has finished it."""
        workers = range(self.num_workers) if workers is None else workers
        self._command[:] = code
        for w in workers:
            self._wake[w].release()
        self.wait(workers, code)

    def start(self, code: int, workers) -> None:
        """Send ``code | NOTIFY`` to ``workers`` without waiting (see :meth:`wait_any`)."""
        for w in workers:
            self._command[w] = code | NOTIFY
            self._wake[w].release()

    def wait_any(self, n: int, in_flight, code: int) -> list[int]:
        """Wait until ``n`` of the workers in ``in_flight`` (sent ``code`` with :meth:`start`) finished; return
        those ``n``, in the order they were found done. Failures raise as in :meth:`wait` (the failed ones
        among the ``n``; a dead or hung worker among ``in_flight`` too), with the workers found done so far
        in the exception's ``finished``."""
        during = self.command_names.get(code, f"command {code}")
        pending, finished = list(in_flight), []
        try:
            self._wait_any(n, pending, finished, during)
        except WorkerError as err:
            err.finished = finished  # done (their results are dropped), like the failed ones
            raise
        return finished

    def _wait_any(self, n: int, pending: list, finished: list, during: str) -> None:
        deadline = time.monotonic() + self.timeout
        spin_until = time.perf_counter() + self.spin_s
        while len(finished) < n:
            acquired = _poll(self._any_done, spin_until) or self._any_done.acquire(timeout=self._poll_s)
            # every poll_s, even while other workers keep answering: a dead one must not go unnoticed
            if not acquired or time.monotonic() - self._last_liveness_check > self._poll_s:
                self._last_liveness_check = time.monotonic()
                failures = {w: f for w in pending if (f := self._liveness_failure(w, during, deadline)) is not None}
                if failures:
                    self._raise_failures(failures)
            if not acquired:
                continue
            for w in pending:
                if self._done[w].acquire(False):
                    pending.remove(w)
                    finished.append(w)
                    break
        failures = {w: worker_error(w, self.conns[w].recv()[1]) for w in finished if self._status[w] != OK}
        self._status[finished] = OK
        if failures:
            self._raise_failures(failures)

    @staticmethod
    def _raise_failures(failures: dict) -> None:
        first = failures[min(failures)]
        first.failures = failures
        raise first

    def call(self, method: str, args_per_worker: list[tuple]) -> list:
        """Run ``method(*args)`` on each worker's call target; return the results in worker order."""
        self._command[:] = CALL
        for w, args in enumerate(args_per_worker):
            self._wake[w].release()
            self.conns[w].send((method, args))
        self.wait(range(self.num_workers), CALL)
        return [conn.recv()[1] for conn in self.conns]

    def wait(self, workers, code: int) -> None:
        """Wait until every worker in ``workers`` finished; then raise the first failure, with all of them
        in its ``failures`` attribute (``{worker: exception}``). A worker that died or timed out (it is
        killed) is a failure too; the other workers are left as they are — the caller decides."""
        during = self.command_names.get(code, f"command {code}")
        deadline = None
        failures = {}
        spin_until = time.perf_counter() + self.spin_s
        for w in workers:
            done = self._done[w]
            if _poll(done, spin_until):
                continue
            while not done.acquire(timeout=self._poll_s):
                deadline = deadline or time.monotonic() + self.timeout - self._poll_s
                failure = self._liveness_failure(w, during, deadline)
                if failure is not None:
                    failures[w] = failure
                    break
        for w in np.flatnonzero(self._status).tolist():
            if w not in failures:
                failures[w] = worker_error(w, self.conns[w].recv()[1])
        self._status[:] = OK
        if failures:
            if code == CALL:
                for w in set(workers) - set(failures):
                    self.conns[w].recv()
            self._raise_failures(failures)

    def _liveness_failure(self, w: int, during: str, deadline: float):
        """The exception describing why worker ``w`` cannot answer (dead, or past ``deadline`` and then
        killed), or None while it may still answer."""
        if self.procs[w].exitcode is not None:
            return self._death(w, during)
        if time.monotonic() > deadline:
            self.procs[w].kill()
            self.procs[w].join(5.0)
            return WorkerTimeoutError(w, self.timeout, during)
        return None

    def _death(self, w: int, during: str) -> Exception:
        proc = self.procs[w]
        if proc.exitcode == MISSING_GUARD_EXIT:
            return MissingMainGuardError(_GUARD_MESSAGE.format(owner=self.owner, method=self.start_method))
        return WorkerDiedError(w, proc.pid, proc.exitcode, during)

    # ----------------------------------------------------------------- closing
    @property
    def stopped(self) -> bool:
        return not any(p is not None for p in self.procs)

    def stop(self) -> None:
        """Ask every live worker to close, wait up to 2 s, then kill what is left; idempotent."""
        procs = self.procs
        self.procs = [None] * len(procs)
        for w, proc in enumerate(procs):
            if proc is not None and proc.exitcode is None:
                self._command[w] = CLOSE
                self._wake[w].release()
        for conn in self.conns:  # a worker still in its start-up exchange sees EOF and leaves
            if conn is not None:
                conn.close()
        self.conns = [None] * len(self.conns)
        deadline = time.monotonic() + 2.0
        for proc in filter(None, procs):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(5.0)
            proc.close()


def worker_error(w: int, report: dict) -> EnvWorkerError:
    return EnvWorkerError(w, report["type"], report["message"], report["traceback"], report["during"])


def error_report(exc: BaseException, during: str) -> dict:
    """What a worker sends about an exception: ``type``, ``message``, ``traceback``, ``during``."""
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc(),
            "during": during}


class WorkerChannel:
    """A worker's end of the pool: its pipe, its two semaphores and the shared command/status arrays."""

    def __init__(self, index, conn, wake, done, command: torch.Tensor, status: torch.Tensor,
                 spin_s: float = 0.0, any_done=None):
        self.index, self.conn, self.wake, self.done = index, conn, wake, done
        self.command_tensor, self.status_tensor = command, status
        self.spin_s, self.any_done = spin_s, any_done

    def start(self) -> None:
        """First thing in a worker: die with the main process; leave Ctrl-C to the main process (which
        shuts the workers down); one thread (the cores are the workers')."""
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(1)

    def receive(self):
        """The next start-up message from the main process, or None when the pool is stopping or the main
        process is gone (a forked worker holds a copy of the pipe's other end, so it would see no EOF)."""
        command = self.command_tensor.numpy()
        while not self.conn.poll(0.05):
            if command[self.index] == CLOSE or not _main_process_alive():
                return None
        return self.conn.recv()

    def fail_start(self, exc: BaseException, during: str = "construction") -> None:
        """Report a start-up failure and exit the worker."""
        self.conn.send(("error", error_report(exc, during)))
        self.conn.close()
        sys.exit(1)

    def serve(self, handlers: dict[int, Callable[[], Any]], call_target: Any, names: dict[int, str]) -> None:
        """The worker loop: wait on ``wake`` (polling it for ``spin_s`` after each command, then blocking), run
        ``handlers[command]``, report, release ``done``; until
        CLOSE or until the main process is gone. Exceptions are reported and the loop goes on."""
        command, status, index = self.command_tensor.numpy(), self.status_tensor.numpy(), self.index
        spin_until = 0.0
        while True:
            if not _poll(self.wake, spin_until) and not self.wake.acquire(timeout=IDLE_POLL_S):
                if not _main_process_alive():
                    return
                continue
            code = int(command[index])
            notify = bool(code & NOTIFY)
            code &= ~NOTIFY
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
            if notify:
                self.any_done.release()
            spin_until = time.perf_counter() + self.spin_s


def _poll(semaphore, until: float) -> bool:
    """Try to acquire ``semaphore`` without blocking until ``time.perf_counter()`` passes ``until``
    (yielding the core between tries); True once acquired."""
    while True:
        if semaphore.acquire(False):
            return True
        if time.perf_counter() >= until:
            return False
        os.sched_yield()


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
