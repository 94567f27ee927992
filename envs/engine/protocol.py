"""The worker protocol: every command, status code and message between the main process and a worker,
the start-up handshake, the worker's serving loop (:class:`WorkerChannel`) and the wait strategy (:class:`Wait`).
It imports nothing of this package but its errors: the bottom of the engine.

Two kinds of workers speak it: ParallelEnv workers (``worker.py``) and MultiSyncCollector workers
(``collectors/worker.py``). The main side is :class:`~tdcollect.envs.pool.WorkerPool`.

Channels
========
Per worker ``w``: a pipe; two semaphores, ``wake[w]`` (main -> worker) and ``done[w]`` (worker -> main);
one semaphore shared by all workers, ``any_done``; and two shared int32 arrays of ``num_workers`` entries,
``command`` and ``status``. A step costs two semaphore operations and no pickling: the pipe carries only
start-up messages, rare calls and error reports, never per-step data.

Start-up handshake (the same for a first start and for a restart)
=================================================================
::

    worker                                                 main process (WorkerPool)
    builds what it owns (envs / env + policy copy)
      -> ("hello", dump_info(info))                        info, by value (torch.save to bytes: spec tensors
         or ("error", report), then exits 1                 must not land in shared memory)
                                                           setup = handshake.setup({w: info, ...})
      <- ("setup", payload)                                payload: the shared buffers to bind to
      binds to the payload
      -> ("ready", reply)                                  handshake.ready({w: reply, ...})

===========================  =============================================  ===============================
worker                       info / payload / reply                         shared buffers
===========================  =============================================  ===============================
ParallelEnv (worker.py)      EnvSpecs of its envs / ``(buffers,             ``buffers`` [num_envs] (see
                             reset_mask, step_mask)`` / its pid             ``shared.py``; worker ``w`` uses
                                                                            rows ``first:first+k``);
                                                                            ``reset_mask`` bool [num_envs,
                                                                            prod(B)], ``step_mask`` bool
                                                                            [num_envs]
MultiSyncCollector           ``n_envs`` of its env / ``T`` (steps per       its storage [n_envs, T],
(``collectors/worker.py``)   batch) / its storage, made in shared memory    TorchRL rollout keys, time last
===========================  =============================================  ===============================

A worker whose main process goes away during the handshake (EOF on the pipe, or ``CLOSE``) leaves quietly.
A worker that imports an unguarded main module (spawn / forkserver) exits with :data:`MISSING_GUARD_EXIT`
before anything else; the main process explains it once.

Commands (``command[w] = code``, then ``wake[w]`` released)
===========================================================
==================  ===========================================================================
``STEP``            ParallelEnv: step its ``k`` envs with their rows of ``buffers["action"]``;
                    auto-reset the ones that ended; write their rows of ``buffers["next"]`` and
                    ``buffers["root"]``
``PARTIAL_STEP``    ParallelEnv: the same for its envs whose ``step_mask`` row is True (TorchRL's
                    ``"_step"``); the rows of the others are left as they are
``SLOT_STEP[p]``    ParallelEnv: ``STEP``, then copy its rows of the big leaves of ``buffers["next"]``
                    into output slot ``p`` (given by ``CALL bind_slots``), whose memory the main
                    process hands out as the step's own tensors (see ``ParallelEnv`` and
                    ``recycle.OutputSlots``)
``ROLL``            ParallelEnv: run steps ``t0 .. t1 - 1`` of a rollout (``control[w] = (key, t0, t1)``,
                    int64 in shared memory), each with its rows of the actions in the rollout's
                    storage ``key`` (given by ``CALL bind_rollout``), recording each step's results
                    straight into that storage (and ``control[w, 1]``: the next step to run), with
                    no hand-off per step (see ``worker_rollout.py``)
``RESET``           ParallelEnv: reset its envs whose ``reset_mask`` row is True (seeded if a seed
                    is pending)
``COLLECT``         MultiSyncCollector: fill its storage with the next ``T`` steps, policy actions
``COLLECT_RANDOM``  MultiSyncCollector: the same with random actions from the action spec
``CALL``            then on the pipe ``(name, args)``; runs the worker's declared call ``name``
                    (``calls[name](*args)``, see :meth:`WorkerChannel.serve`; an undeclared name fails,
                    naming the declared ones); answers ``("result", value)`` (after releasing ``done[w]``)
``CLOSE``           leave the loop, close what it owns, exit 0
``code | NOTIFY``   as ``code``, and also release ``any_done`` when finished (asynchronous stepping)
==================  ===========================================================================

After each command the worker writes ``status[w]`` — ``OK``; ``REPLIED`` when an answer follows on the pipe
(``("result", value)`` for ``CALL``, ``("data", value)`` for a command whose handler returned something); or
``FAILED`` with ``("error", report)`` on the pipe (see :func:`.errors.error_report`) — and releases ``done[w]``; then it
waits for the next one. Exceptions raised by a command are reported and the loop goes on. So a command answers
with data only when there is some: a ParallelEnv worker answers ``STEP``, ``PARTIAL_STEP`` and ``RESET`` with
``("data", (objects, posts))`` when its envs have non-tensor entries (strings, objects: no place in shared memory)
or posted values (see ``EnvGroup.take_posts``), and the main process reads one check of the status array otherwise.
Answers are sent after ``done[w]`` is released, and the main process reads them once the worker is done: an answer
larger than the pipe's buffer cannot deadlock.

Waiting (one strategy, :class:`Wait`, on both sides): sleep through the part of the wait that is sure to pass,
then poll, then block. A side that waited about as long the last few times (a worker step, the main process'
work between steps) first sleeps (``time.sleep``) until :data:`WAKE_MARGIN_S` before the shortest of its recent
waits, then polls its semaphore (``acquire(False)``, no system call) for up to ``spin_s`` seconds, then blocks. So
an answer is seen within microseconds while the poll burns a core only for the margin, not for the whole of a long
step or policy. ``spin_s = 0`` blocks at once.

Re-placing after a pause (:data:`REPLACING_COMMANDS`): while both sides poll, every process stays runnable, so the
scheduler never moves one; where it put them is where they stay. After a pause long enough for workers to block
(a learner's update between collections), the wake-ups may put two workers on one core, and then they share it for
the whole burst of steps that follows (measured on 2 cores: ~500 µs a step instead of ~300 µs, for up to 120 ms).
So a worker marks itself in ``blocked[1 + w]`` while it blocks for its next command, and a synchronous command sent
to a worker so marked starts :data:`REPLACING_COMMANDS` commands handed off by blocking on both sides (the shared
``spin`` is 0 for them): each of their wake-ups lands on a core that is idle, so the workers spread out again;
then both sides poll as before.

Blocking never takes a timed semaphore wait: macOS has no ``sem_timedwait``, and CPython's timed ``acquire`` polls
there with sleeps of up to 20 ms (see ``portability.py``). So:

- a worker blocks on ``wake[w]`` without a timeout; a thread of its own (:meth:`WorkerChannel.start`) watches the
  main process' sentinel and wakes it when the main process is gone (on Linux it is killed with it anyway);
- the main process blocks in ``multiprocessing.connection.wait`` (``select`` / ``WaitForMultipleObjects``, which
  block properly on every platform) on the workers' sentinels and its **doorbell**, a pipe that every worker
  shares: before blocking it sets ``blocked[0]`` (shared int32) and tries its semaphore once more; a worker rings
  the doorbell after releasing ``done[w]`` / ``any_done`` whenever ``blocked[0]`` is set. A worker's death ends the
  block at once (its sentinel), and the block's timeout enforces ``timeout``.
"""
from __future__ import annotations

import io
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from .errors import error_report
from .portability import ask_to_die_with_parent, is_windows, yield_core

# command codes
STEP = 1
RESET = 2
COLLECT = 3
COLLECT_RANDOM = 4
PARTIAL_STEP = 5
OUTPUT_SLOTS = 4  # output slots of a ParallelEnv (see SLOT_STEP)
SLOT_STEP = tuple(range(8, 8 + OUTPUT_SLOTS))  # into output slot 0 .. OUTPUT_SLOTS - 1
ROLL = 8 + OUTPUT_SLOTS
CALL = 100
CLOSE = 101
NOTIFY = 0x100
# status codes (REPLIED: done, and one answer follows on the pipe)
OK = 0
FAILED = 1
REPLIED = 2
# what each command is called in error messages ("worker 2 raised ... during <name>")
COMMAND_NAMES = {
    STEP: "step", PARTIAL_STEP: "partial step", **dict.fromkeys((*SLOT_STEP, ROLL), "step"),
    RESET: "reset", COLLECT: "collection",
    COLLECT_RANDOM: "collection (random actions)",
    CALL: "a call", CLOSE: "close",
}
IDLE_POLL_S = 1.0
MISSING_GUARD_EXIT = 78


def command_name(code: int) -> str:
    return COMMAND_NAMES.get(code & ~NOTIFY, f"command {code}")


def dump_info(info: Any) -> bytes:
    """A worker's hello ``info`` (specs, counts) as bytes, written by ``torch.save``: by value, never in shared
    memory, and for every tensor dtype (plain pickle cannot read back uint16/uint32/uint64 tensors)."""
    buffer = io.BytesIO()
    torch.save(info, buffer)
    return buffer.getvalue()


def load_info(data: bytes) -> Any:
    """The ``info`` of :func:`dump_info`."""
    return torch.load(io.BytesIO(data), weights_only=False)


class Handshake(Protocol):
    """The owner's half of the start-up handshake (see ``protocol.py``); called for the first start of all
    workers and for every restart, with the workers concerned."""

    def setup(self, infos: dict[int, Any]) -> dict[int, Any]:
        """``{worker: info}`` from their hellos -> ``{worker: setup payload}``; raises to refuse them."""

    def ready(self, replies: dict[int, Any]) -> None:
        """``{worker: reply}`` once they are bound and serving."""


class WorkerChannel:
    """A worker's end of the protocol: its pipe, its semaphores and the shared command/status arrays."""

    def __init__(self, index, conn, wake, done, command: torch.Tensor, status: torch.Tensor,
                 spin: torch.Tensor | None = None, any_done=None, die_with_parent: bool = True,
                 doorbell=None, blocked: torch.Tensor | None = None):
        self.index = index
        self.conn = conn
        self.wake = wake
        self.done = done
        self.command_tensor = command
        self.status_tensor = status
        #: ``[spin_s]`` in shared memory (the main process may change it), or None: block at once
        self.spin_tensor = spin
        self.any_done = any_done
        self.die_with_parent = die_with_parent
        #: the write end of the main process' doorbell pipe, rung after ``done`` while ``blocked[0]`` says the main
        #: process blocks on it (see "Waiting" in the module docstring); None: never rung
        self.doorbell = doorbell
        #: int32 ``[1 + num_workers]`` in shared memory: ``[0]`` the main process blocks on the doorbell, ``[1 + w]``
        #: worker ``w`` blocks for its next command (see "Re-placing after a pause"); None: neither is said
        self.blocked_tensor = blocked
        #: set by the parent watch (see :meth:`start`) when the main process is gone
        self.parent_gone = False

    def start(self) -> None:
        """First thing in a worker: die with the main process (see :func:`_die_with_parent`), and watch it from a
        thread that wakes the serving loop when it is gone (the loop blocks without a timeout); leave Ctrl-C to
        the main process (which shuts the workers down); one thread (the cores are the workers')."""
        _die_with_parent(self.die_with_parent)
        threading.Thread(target=self._watch_parent, name="tdcollect-parent-watch", daemon=True).start()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(1)

    def _watch_parent(self) -> None:
        """Block until the main process is gone (its sentinel: a pipe that closes, a process handle that is
        signalled; or, on POSIX, a new parent process id), then mark it and wake the serving loop."""
        parent = multiprocessing.parent_process()
        if parent is None:
            return
        parent_pid = os.getppid()
        while not multiprocessing.connection.wait([parent.sentinel], IDLE_POLL_S):
            if not is_windows() and os.getppid() != parent_pid:
                break
        self.parent_gone = True
        self.wake.release()

    def fail_start(self, exc: BaseException, during: str = "construction") -> None:
        """Report a start-up failure (building what the worker owns, or binding it to the setup payload:
        ``during="start-up"``), and exit the worker."""
        self.conn.send(("error", error_report(exc, during)))
        self.conn.close()
        sys.exit(1)

    def hello(self, info: Any):
        """Send ``info`` and return the main process' setup payload, or None when the main process is
        stopping or gone (then the worker leaves)."""
        try:
            self.conn.send(("hello", dump_info(info)))
            message = self._receive()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return None
        if message is None or message[0] != "setup":
            return None
        return message[1]

    def ready(self, reply: Any) -> bool:
        """Tell the main process this worker is bound and serving; False when it is gone."""
        try:
            self.conn.send(("ready", reply))
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def _receive(self):
        # a forked worker holds a copy of the pipe's other end, so it would see no EOF: poll for CLOSE too
        command = self.command_tensor.numpy()
        while not self.conn.poll(0.05):
            if command[self.index] == CLOSE or not _main_process_alive():
                return None
        return self.conn.recv()

    def serve(self, handlers: dict[int, Callable[[], Any]], calls: dict[str, Callable]) -> None:
        """The serving loop (see the module docstring), until ``CLOSE`` or until the main process is gone:
        ``handlers`` per command code, ``calls`` what ``CALL`` may run, by name."""
        command = self.command_tensor.numpy()
        status = self.status_tensor.numpy()
        index = self.index
        spin = self.spin_tensor.numpy() if self.spin_tensor is not None else (0.0,)
        blocked = self.blocked_tensor.numpy() if self.blocked_tensor is not None else np.zeros(1 + index + 1, np.int32)
        wait = Wait()
        while True:
            if not wait.settle(self.wake, spin[0]):
                blocked[1 + index] = 1
                self.wake.acquire()  # untimed: the parent watch wakes it if the main process goes
                blocked[1 + index] = 0
                wait.record()
            if self.parent_gone:
                return
            code = int(command[index])
            notify = bool(code & NOTIFY)
            code &= ~NOTIFY
            if code == CLOSE:
                status[index] = OK
                self.done.release()
                return
            reply = None
            try:
                if code == CALL:
                    name, args = self.conn.recv()
                    if name not in calls:
                        raise AttributeError(f"this worker has no call {name!r}; it answers {sorted(calls)}.")
                    reply = ("result", calls[name](*args))
                else:
                    data = handlers[code]()
                    reply = None if data is None else ("data", data)
                status[index] = OK if reply is None else REPLIED
            except BaseException as exc:  # noqa: BLE001 - reported, and the loop goes on
                status[index] = FAILED
                self.conn.send(("error", error_report(exc, command_name(code))))
            self.done.release()
            if notify:
                self.any_done.release()
            if blocked[0]:
                self._ring()
            if reply is not None:  # after done: a reply larger than the pipe's buffer waits for the main process
                self.conn.send(reply)
            wait.start()

    def _ring(self) -> None:
        """Ring the main process' doorbell (it blocks on it, see "Waiting"); nothing if it is gone."""
        try:
            self.doorbell.send_bytes(b"")
        except OSError:  # (closed: the main process is stopping)
            pass


#: How long before the shortest recent wait a side stops sleeping and starts polling: a timed sleep ends up to
#: ~60 µs late on a VM, and waits vary (Pong steps by ±15 %).
WAKE_MARGIN_S = 200e-6
#: Recent waits remembered, per side.
RECENT_WAITS = 8
#: Commands handed off by blocking on both sides after a worker was found blocked for its command (see "Re-placing
#: after a pause" in the module docstring). Measured on 2 cores, 2 workers, bursts of 64 steps after 30 ms pauses
#: (``benchmarks.macos_waits``' collect_train): 8 gave 4,798 env steps/s, 4 gave 4,606, none 3,795.
REPLACING_COMMANDS = 8


class Wait:
    """One side's wait for its semaphore (see the module docstring). :meth:`start` when the thing waited for
    begins (a command sent, an answer given); :meth:`settle` sleeps through the part of the wait that the shortest
    of the last :data:`RECENT_WAITS` waits says is sure to pass, then polls for ``spin_s`` seconds; a side that it
    leaves without the semaphore blocks in its own way, then calls :meth:`record`."""

    def __init__(self):
        self.began = time.perf_counter()
        self.recent: list[float] = []

    def start(self) -> None:
        self.began = time.perf_counter()

    def settle(self, semaphore, spin_s: float) -> bool:
        """True once ``semaphore`` is acquired after the sleep or within ``spin_s`` of polling (the wait is
        recorded); False: the caller blocks. The sleep is ``time.sleep``, never a timed semaphore wait (those
        poll on macOS, see ``portability.py``)."""
        if spin_s <= 0:
            return False
        waited = time.perf_counter() - self.began
        sleep = min(self.recent, default=0.0) - WAKE_MARGIN_S - waited
        if sleep > WAKE_MARGIN_S:
            time.sleep(sleep)
            if semaphore.acquire(False):  # it came during the sleep: this wait took at most ``waited``
                self.record(waited)
                return True
        if poll(semaphore, time.perf_counter() + spin_s):
            self.record()
            return True
        return False

    def record(self, took: float | None = None) -> None:
        """The semaphore was acquired: remember how long this wait took, or ``took`` instead. A wait found over
        right after its sleep ended at some point before (a sleep cannot end early): it is remembered as ending
        when the sleep began, or the estimate would come down by no more than the margin a wait (measured: a
        public step loop on cheap envs at half its speed for its first second)."""
        self.recent.append(time.perf_counter() - self.began if took is None else took)
        if len(self.recent) > RECENT_WAITS:
            del self.recent[0]


def poll(semaphore, until: float) -> bool:
    """Try to acquire ``semaphore`` without blocking until ``time.perf_counter()`` passes ``until``
    (yielding the core between tries); True once acquired."""
    while True:
        if semaphore.acquire(False):
            return True
        if time.perf_counter() >= until:
            return False
        yield_core()


def _die_with_parent(use_signal: bool) -> None:
    """With ``use_signal``, ask Linux to SIGKILL this process when its parent dies (the main process, or the
    forkserver, which itself ends with the main process). Linux sends it when the parent's creating *thread*
    exits, so a pool created in another thread passes False; the parent watch of :meth:`WorkerChannel.start` (a
    sentinel, checked against the parent's pid every :data:`IDLE_POLL_S`) is the fallback, and the only way on
    macOS and Windows."""
    if use_signal:
        ask_to_die_with_parent()
    if not _main_process_alive():
        os._exit(0)


def _main_process_alive() -> bool:
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()
