"""WorkerPool: the main process' side of the worker protocol (``protocol.py``): it starts worker processes,
runs the start-up handshake with them, sends commands and waits for them, replaces failed workers and stops
them.

While it waits, a worker that dies ends the wait at once (its sentinel; a
:class:`~tdcollect.envs.errors.WorkerDiedError` with its exit code), and ``timeout`` is enforced every ``poll_s``.

Waiting: waking a process blocked on a semaphore costs more than a cheap step on a VM; polling the semaphore
answers at once but burns a core. So both sides wait as ``protocol.Wait`` does: sleep through the part of the
wait their recent waits say is sure to pass, poll for up to ``spin_s`` seconds, then block (on the doorbell and the
workers' sentinels, never a timed semaphore wait: see "Waiting" in ``protocol.py``); and
``platform_policy.default_spin_s`` polls up to two workers per usable core, and blocks at once beyond.
"""
from __future__ import annotations

import atexit
import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401 - its exit hook is registered before ours (see _stop_live_pools)
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.multiprocessing as tmp

from .errors import (
    MissingMainGuardError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    failures_of,
    open_files_error,
    worker_error,
)
from .handoff import HandOff
from .platform_policy import GUARD_MESSAGE, resolve_spin_s
from .portability import is_out_of_files, open_files_limit
from .preload import import_now, tensordict_first_use
from .protocol import (
    CALL,
    CLOSE,
    FAILED,
    MISSING_GUARD_EXIT,
    NOTIFY,
    OK,
    Handshake,
    Wait,
    WorkerChannel,
    command_name,
    load_info,
    poll,
)
from .shared import close_unfetched_fds, in_shared_memory, reap, semaphore, unfetched_fds
from .user_warnings import warn_caller

_PIPE_GONE = (EOFError, BrokenPipeError, ConnectionResetError, ConnectionRefusedError)

def closed_is_one_error(method):
    """A call of the pool racing :meth:`WorkerPool.stop` from another thread (a ``close()`` from a watchdog, a signal
    handler, a notebook's interrupt): whatever the pipes, semaphores and processes that ``stop()`` dropped under it
    made it raise (an ``AttributeError`` on a dropped connection, ``OSError`` on a closed file descriptor, a worker
    error from a killed worker), it raises the one "closed" ``RuntimeError``."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as err:
            if not self.closed or getattr(err, "closed_error", False):
                raise
            closed = RuntimeError(f"this {self.owner} was closed (from another thread or a signal handler?) while "
                                  f"its workers' {name} ran.")
            closed.closed_error = True
            raise closed from None

    return guarded


#: every pool started and not yet stopped (held strongly: a pool whose owner failed half-way through its own
#: construction, or was dropped without closing, must still be stopped at exit)
_LIVE_POOLS: set = set()


def _stop_live_pools() -> None:
    """At interpreter exit, stop every pool still running — before multiprocessing joins its non-daemon
    children, which wait for this process to end: without this, a script that never closed its env or
    collector (a plain loop, an exception, Ctrl-C) could not exit."""
    for pool in list(_LIVE_POOLS):
        pool.stop()


# registered after multiprocessing.util's exit hook (imported above), so it runs before it (atexit is LIFO)
atexit.register(_stop_live_pools)


def forget_failure(err: BaseException) -> None:
    """Break the reference cycles of a worker failure that was handled (its workers replaced): the error is in its
    own ``failures``, and its traceback's frames hold their locals (the caller's batch storage, say). Left as they are,
    they keep that memory until the garbage collector runs."""
    for exc in (*failures_of(err).values(), err):
        exc.__traceback__ = None
        exc.__dict__.pop("failures", None)


class WorkerPool:
    """``num_workers`` processes running ``target(channel, *args[w])``, each started with ``handshake``.
    ``preload``: modules to import once before they start (see ``preload.py``)."""

    def __init__(self, target: Callable, args: list[tuple], *, handshake: Handshake, start_method: str,
                 timeout: float, owner: str, spin_s: float | None = None, daemon: bool = False,
                 shutdown_timeout: float = 2.0, preload: Iterable[str] = ()):
        self.owner = owner
        self.daemon = bool(daemon)
        self.shutdown_timeout = float(shutdown_timeout)
        self.start_method = start_method
        self.timeout = float(timeout)
        num_workers = len(args)
        spin_s, self._poll_s = resolve_spin_s(spin_s, num_workers), min(0.25, self.timeout)
        context = tmp.get_context(start_method)
        open_files_limit()  # (raised towards portability.WANTED_OPEN_FILES where the hard limit allows: macOS has 256)
        if start_method != "spawn":
            preload = [*preload, *tensordict_first_use()]
        if start_method == "forkserver":
            server_imports = ["tdcollect.envs.engine.pool", "tdcollect.envs.engine.protocol", *sorted(set(preload))]
            context.set_forkserver_preload(server_imports)
        elif start_method == "fork":
            import_now(preload)  # forked workers inherit it (see preload.py)
        self._command_tensor = in_shared_memory(torch.zeros(num_workers, dtype=torch.int32), "the commands")
        self._status_tensor = in_shared_memory(torch.zeros(num_workers, dtype=torch.int32), "the statuses")
        self._command = self._command_tensor.numpy()
        self._status = self._status_tensor.numpy()
        self._context = context
        self._target = target
        self._args = args
        self._handshake = handshake
        self._wake = [None] * num_workers
        self._done = [None] * num_workers
        self._any_done = semaphore(context)
        # the wait both sides read, who blocks, and the doorbell the workers ring while this process blocks
        self._handoff = HandOff(context, num_workers, spin_s)
        self._last_liveness_check = 0.0
        self._waits: dict = {}  # command code (or the caller's key) -> its wait (see protocol.Wait)
        self._found_done: set[int] = set()  # see wait_for
        self.procs = [None] * num_workers
        self.conns = [None] * num_workers
        self.restarts = [0] * num_workers
        self.closed = False
        _LIVE_POOLS.add(self)
        try:
            for w in range(num_workers):
                self._spawn(w)
            self._start_up(list(range(num_workers)), first=True)
        except BaseException as err:
            self.stop()
            if is_out_of_files(err):
                raise open_files_error(f"starting {owner}'s {num_workers} workers", open_files_limit()) from err
            raise

    def _spawn(self, w: int) -> None:
        context = self._context
        self._wake[w], self._done[w] = semaphore(context), semaphore(context)
        parent_conn, child_conn = context.Pipe()
        # PR_SET_PDEATHSIG fires when the creating *thread* exits: only ask for it from the main thread (or
        # through the forkserver, the workers' single-threaded parent); otherwise the worker's parent watch notices
        die_with_parent = self.start_method == "forkserver" or threading.current_thread() is threading.main_thread()
        handoff = self._handoff
        channel = WorkerChannel(w, child_conn, self._wake[w], self._done[w], self._command_tensor,
                                self._status_tensor, handoff.spin_tensor, self._any_done, die_with_parent,
                                handoff.doorbell_writer, handoff.blocked_tensor)
        proc = context.Process(target=self._target, args=(channel, *self._args[w]),
                               name=f"{self.owner}-worker-{w}", daemon=self.daemon)
        try:
            proc.start()
        except BaseException:  # (not kept: stop() joins the started ones)
            parent_conn.close()
            child_conn.close()
            raise
        self.procs[w], self.conns[w] = proc, parent_conn
        child_conn.close()

    def _start_up(self, workers: list[int], first: bool = False) -> None:
        """The handshake with ``workers`` (just spawned; see ``protocol.py``). On a restart, workers that fail
        in it do not stop the others' handshake; they are raised at the end, all of them in the error's
        ``failures``, and the file descriptors sent to them and never fetched are closed. On the ``first``
        start, a worker that fails to build its envs ends the start-up at once (the pool is stopped)."""
        failures = {}
        infos = {}
        sent = {}
        replies = {}
        for w in workers:
            try:
                infos[w] = load_info(self.receive(w, "construction", "hello"))
            except WorkerError as err:
                failures[w] = err
        if failures and first:
            self._raise_failures(failures)
        payloads = self._handshake.setup(infos) if infos else {}
        for w in infos:
            before = unfetched_fds()
            try:
                self.conns[w].send(("setup", payloads[w]))
            except _PIPE_GONE:
                failures[w] = self._died_error(w, "start-up")
            sent[w] = unfetched_fds() - before
        for w in infos:
            if w not in failures:
                try:
                    replies[w] = self.receive(w, "start-up", "ready")
                except WorkerError as err:
                    failures[w] = err
        for w in failures:
            close_unfetched_fds(sent.get(w, ()))
        if replies:
            self._handshake.ready(replies)
        if failures:
            self._raise_failures(failures)

    # ----------------------------------------------------------------- restarts
    def replace_failed(self, err: BaseException, max_restarts: int) -> list[int] | None:
        """Replace the workers that failed in ``err`` by fresh processes (same target, same arguments, the
        same handshake as the first start), while the pool stays within ``max_restarts`` replacements in all.
        A failure of a replacement during its start-up goes through the same budget. Returns the workers
        replaced, or None when ``err`` is not a worker failure or the budget does not allow it (the caller
        raises ``err``, or the last start-up failure, which this method raises itself)."""
        replaced: set[int] = set()
        while True:
            if not isinstance(err, WorkerError):
                return None
            failures = failures_of(err)
            if sum(self.restarts) + len(failures) > max_restarts:
                if replaced:
                    raise err
                return None
            try:
                for w in sorted(failures):
                    self._replace(w, failures[w])
                self._start_up(sorted(failures))
                forget_failure(err)
                return sorted(replaced | set(failures))
            except WorkerError as again:
                replaced |= set(failures)
                err = again

    def _replace(self, w: int, cause: Exception) -> None:
        warn_caller(f"{self.owner}: restarting worker {w} after: {str(cause).splitlines()[0]}", RuntimeWarning)
        old = self.procs[w]
        conn = self.conns[w]
        if old.exitcode is None:
            old.kill()
        reap(old, 5.0)
        old.close()
        conn.close()
        self._status[w] = OK
        self._spawn(w)
        self.restarts[w] += 1

    @property
    def spin_s(self) -> float:
        """Seconds both sides poll before they block (see the module docstring); settable at any time."""
        return self._handoff.chosen_spin_s

    @spin_s.setter
    def spin_s(self, seconds: float) -> None:
        self._handoff.choose_spin(resolve_spin_s(seconds, self.num_workers))

    @property
    def num_workers(self) -> int:
        return len(self._wake)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [p.pid for p in self.procs if p is not None and p.exitcode is None]

    # ----------------------------------------------------------------- pipe messages
    @closed_is_one_error
    def receive(self, w: int, during: str, expected: str):
        """The value of worker ``w``'s next message, which must be of kind ``expected``, waiting with liveness
        checks and the timeout; ``("error", report)`` becomes an :class:`~tdcollect.envs.errors.EnvWorkerError`,
        a dead worker a :class:`~tdcollect.envs.errors.WorkerDiedError` (or
        :class:`~tdcollect.envs.errors.MissingMainGuardError`)."""
        deadline = time.monotonic() + self.timeout
        conn = self.conns[w]
        try:
            while not conn.poll(self._poll_s):
                failure = self._liveness_failure(w, during, deadline)
                if failure is not None:
                    raise failure
            kind, value = conn.recv()
        except _PIPE_GONE:
            raise self._died_error(w, during) from None
        if kind == "error":
            raise worker_error(w, value)
        if kind != expected:
            raise RuntimeError(f"{self.owner}: worker {w} sent {kind!r} during {during}, expected {expected!r}.")
        return value

    # ----------------------------------------------------------------- commands
    @closed_is_one_error
    def run(self, code: int, workers=None, waits=None) -> list | None:
        """Send ``code`` to ``workers`` (default: all) and wait until each has finished it. Returns what they answered
        with (``protocol.REPLIED``), in ``workers`` order (None for a worker without an answer); None when none
        answered. ``waits``: whose recent waits to sleep by (default ``code``; a rollout's span of ``n`` steps waits
        as ``(code, n)``, see ``protocol.Wait``)."""
        workers = range(self.num_workers) if workers is None else workers
        self.send(code, workers, waits)
        return self.wait(workers, code, waits)

    @closed_is_one_error
    def send(self, code: int, workers, waits=None) -> None:
        """Send ``code`` to ``workers`` without waiting; :meth:`wait` for them before any other command."""
        self.check_open()
        waits = code if waits is None else waits
        wait = self._waits.get(waits)
        if wait is None:  # (not setdefault: that would build a Wait on every send)
            wait = self._waits[waits] = Wait()
        wait.start()
        if not code & NOTIFY:
            self._handoff.before_command(workers)
        for w in workers:
            self._command[w] = code
            self._wake[w].release()

    def start(self, code: int, workers) -> None:
        """Send ``code | NOTIFY`` to ``workers`` without waiting (see :meth:`wait_any`)."""
        self.send(code | NOTIFY, workers)

    @closed_is_one_error
    def wait_any(self, n: int, in_flight, code: int) -> list[int]:
        """Wait until ``n`` of the workers in ``in_flight`` (sent ``code`` with :meth:`start`) finished; return
        those ``n``, in the order they were found done. Failures raise as in :meth:`wait` (the failed ones
        among the ``n``; a dead or hung worker among ``in_flight`` too), with the workers found done so far
        in the exception's ``finished``."""
        during = command_name(code)
        pending = list(in_flight)
        finished = []
        try:
            self._wait_any(n, pending, finished, during, self._waits.get(code | NOTIFY))
        except WorkerError as err:
            err.finished = finished  # done (their results are dropped), like the failed ones
            raise
        return finished

    def _wait_any(self, n: int, pending: list, finished: list, during: str, first: Wait | None) -> None:
        """``first``: the wait :meth:`start` began (the same strategy as :meth:`wait`'s: sleep through the sure part,
        poll ``spin_s``, block) for the first worker found done; the others are polled for ``spin_s`` more in all,
        then blocked for."""
        deadline = time.monotonic() + self.timeout
        spin_until = time.perf_counter() + self._handoff.spin[0]
        any_done = self._any_done  # kept: stop() from another thread replaces them
        dones = self._done
        while len(finished) < n:
            if first is not None:
                acquired, first = self._settle_or_block(first, any_done, pending), None
                spin_until = time.perf_counter() + self._handoff.spin[0]  # one more poll budget for the others
            else:
                acquired = poll(any_done, spin_until) or self._block(any_done, pending, self._poll_s)
            # every poll_s, even while other workers keep answering: a dead one must not go unnoticed
            if not acquired or time.monotonic() - self._last_liveness_check > self._poll_s:
                self._last_liveness_check = time.monotonic()
                failures = {w: f for w in pending if (f := self._liveness_failure(w, during, deadline)) is not None}
                if failures:
                    self._raise_failures(failures)
            if not acquired:
                continue
            for w in pending:
                if dones[w].acquire(False):
                    pending.remove(w)
                    finished.append(w)
                    break
        failures = {w: worker_error(w, self.conns[w].recv()[1]) for w in finished if self._status[w] == FAILED}
        self._status[finished] = OK
        if failures:
            self._raise_failures(failures)

    @staticmethod
    def _raise_failures(failures: dict) -> None:
        """Raise the lowest worker's error, carrying every failure (``err.failures``, see ``failures_of``)."""
        first = failures[min(failures)]
        first.failures = failures
        raise first

    @closed_is_one_error
    def reply(self, w: int):
        """The data worker ``w`` answered a command with (one it finished, found by :meth:`wait_any`)."""
        return self.conns[w].recv()[1]

    @closed_is_one_error
    def call(self, method: str, args_per_worker: list[tuple], workers=None, wait: bool = True) -> list | None:
        """Run ``method(*args)`` on the call target of each worker in ``workers`` (default: all; ``args_per_worker``
        in the same order); return the results in that order (``wait=False``: send the call and return None; wait
        for it with ``wait(workers, CALL)``). A worker that died is reported by :meth:`wait`."""
        self.check_open()
        workers = list(range(self.num_workers) if workers is None else workers)
        for w, args in zip(workers, args_per_worker):
            self._command[w] = CALL
            self._wake[w].release()
            try:
                self.conns[w].send((method, args))
            except _PIPE_GONE:  # (it died: wait() finds it dead, a WorkerDiedError, not this process' pipe error)
                pass
        return self.wait(workers, CALL) if wait else None

    @closed_is_one_error
    def wait(self, workers, code: int, waits=None) -> list | None:
        """Wait until every worker in ``workers`` finished; then raise the first failure, with all of them
        in its ``failures`` attribute (``{worker: exception}``). A worker that died or timed out (it is
        killed) is a failure too; the other workers are left as they are — the caller decides. Returns the
        workers' answers as :meth:`run` does (on a failure, the others' answers are dropped)."""
        during = command_name(code)
        deadline = None
        failures = {}
        dones = self._done  # stop() from another thread replaces the list; the liveness check then raises
        # started by send(): sleeps through the sure part of the first worker's wait
        first = self._waits.get(code if waits is None else waits)
        spin_until = time.perf_counter() + self._handoff.spin[0]
        for w in workers:
            done = dones[w]
            if first is not None:
                acquired, first = self._settle_or_block(first, done, (w,)), None
                spin_until = time.perf_counter() + self._handoff.spin[0]
                if acquired:
                    continue
            elif poll(done, spin_until):
                continue
            while not self._block(done, (w,), self._poll_s):
                deadline = deadline or time.monotonic() + self.timeout - self._poll_s
                failure = self._liveness_failure(w, during, deadline)
                if failure is not None:
                    failures[w] = failure
                    break
        status = self._status
        answers = {}
        if not failures and not status.any():  # (the common case: no answers)
            return None
        for w in (w for w in np.flatnonzero(status).tolist() if w not in failures):
            try:
                kind, value = self.conns[w].recv()
            except _PIPE_GONE:  # it died between its status and its answer
                failures[w] = self._died_error(w, during)
                continue
            if kind == "error":
                failures[w] = worker_error(w, value)
            else:
                answers[w] = value
        status[:] = OK
        if failures:
            self._raise_failures(failures)
        return [answers.get(w) for w in workers] if answers else None

    @closed_is_one_error
    def wait_for(self, workers, code: int, timeout: float | None) -> list | None:
        """:meth:`wait` for at most ``timeout`` s (None: no limit): then ``multiprocessing.TimeoutError``, the command
        goes on, and a later call resumes the wait (the workers found done are kept in ``_found_done``)."""
        dones = self._done
        found = self._found_done
        if timeout is not None:
            deadline = time.monotonic() + timeout
            for w in (w for w in workers if w not in found):
                while not self._block(dones[w], (w,), min(self._poll_s, max(0.0, deadline - time.monotonic()))):
                    if self._is_dead(w):
                        break  # (closed or dead: wait() says so)
                    if time.monotonic() >= deadline:
                        raise multiprocessing.TimeoutError(
                            f"{self.owner}: the workers' {command_name(code)} is not done after {timeout} s; it goes "
                            "on: wait again for its result, or close.")
                else:
                    found.add(w)
        for w in found:  # given back, for wait() to take
            dones[w].release()
        found.clear()
        return self.wait(workers, code)

    def _settle_or_block(self, wait: Wait, semaphore, workers) -> bool:
        """The first wait of a command (see ``protocol.Wait``): sleep through its sure part and poll, then block for
        up to ``poll_s``; True once ``semaphore`` is acquired, the wait remembered either way (one longer than the
        poll too: the next one sleeps through most of it); False: the caller goes on blocking, with its checks."""
        if wait.settle(semaphore, self._handoff.spin[0]):
            return True
        if self._block(semaphore, workers, self._poll_s):
            wait.record()
            return True
        return False

    def _block(self, semaphore, workers, timeout: float) -> bool:
        """Block until ``semaphore`` is acquired (True), or until one of ``workers`` dies or ``timeout`` seconds pass
        (False: the caller checks them), on the doorbell and the workers' sentinels (see "Waiting" in
        ``protocol.py``): never a timed semaphore wait."""
        procs = self.procs
        return self._handoff.block(semaphore, [procs[w].sentinel for w in workers if procs[w] is not None], timeout)

    def _liveness_failure(self, w: int, during: str, deadline: float):
        """The exception describing why worker ``w`` cannot answer (dead, or past ``deadline`` and then
        killed), or None while it may still answer."""
        if self.procs[w] is None:
            raise RuntimeError(f"this {self.owner} was closed (from another thread?) while it waited for worker "
                               f"{w}'s {during}.")
        if self._is_dead(w):
            return self._died_error(w, during)
        if time.monotonic() > deadline:
            self.procs[w].kill()
            reap(self.procs[w], 5.0)
            return WorkerTimeoutError(w, self.timeout, during)
        return None

    def _is_dead(self, w: int) -> bool:
        """Whether worker ``w`` is gone (closed, exited, or its sentinel says so: dead even where another waiter
        reaped it and its exit code cannot be known)."""
        proc = self.procs[w]
        return proc is None or proc.exitcode is not None or bool(multiprocessing.connection.wait([proc.sentinel], 0))

    def _died_error(self, w: int, during: str) -> Exception:
        """The error for worker ``w``, found dead (or whose pipe broke: it is given a second to exit, so that
        its exit code is known)."""
        proc = self.procs[w]
        reap(proc, 1.0)
        if proc.exitcode == MISSING_GUARD_EXIT:
            return MissingMainGuardError(GUARD_MESSAGE.format(owner=self.owner, method=self.start_method))
        return WorkerDiedError(w, proc.pid, proc.exitcode, during)

    # ----------------------------------------------------------------- closing
    def check_open(self) -> None:
        if self.closed:
            closed = RuntimeError(f"this {self.owner} is closed; its workers were stopped.")
            closed.closed_error = True  # (already the one "closed" error: see closed_is_one_error)
            raise closed

    def stop(self) -> None:
        """Ask every live worker to close, wait up to ``shutdown_timeout`` s, then kill what is left, and release
        the pipes and semaphores (named ones, under spawn/forkserver, leave /dev/shm now); idempotent."""
        self.closed = True
        _LIVE_POOLS.discard(self)
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
        deadline = time.monotonic() + self.shutdown_timeout
        for proc in filter(None, procs):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
            reap(proc, 5.0)
            if proc.exitcode is not None:  # (else a wait in another thread is reaping it: gc closes the object)
                proc.close()
        self._wake = [None] * len(self._wake)
        self._done = [None] * len(self._done)
        self._any_done = None
        self._handoff.close()  # (a block racing this one from another thread ends: the closed error)
        # private copies: the shared segments are freed now, and a call racing this one still finds arrays
        self._command, self._status = self._command.copy(), self._status.copy()
        # the workers' arguments hold segments too
        self._command_tensor = self._status_tensor = self._args = None
