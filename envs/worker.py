"""The worker process of a ParallelEnv: its states, its loop, and the protocol with the main process.

Protocol
========
Each worker ``w`` owns envs ``first .. first + k - 1`` (``k = envs_per_worker``) and has:

- ``conn``: its end of a duplex pipe (start-up, rare commands and error reports — never per-step data);
- ``wake``: a semaphore the main process releases once per command;
- ``done``: a semaphore the worker releases once per finished command;
- shared-memory tensors, received once at start-up: ``buffers`` (see ``shared.py``; the worker uses rows
  ``first:first+k``), ``command`` (int32 ``[num_workers]``), ``status`` (int32 ``[num_workers]``) and
  ``reset_mask`` (bool ``[num_envs]``).

States (:class:`WorkerState`) and messages::

    STARTING   builds its k envs from the cloudpickled constructor (inside this process)
               -> conn: ("specs", pickled EnvSpecs)                      or ("error", report) and exit 1
    BINDING    <- conn: ("buffers", buffers, command, status, reset_mask)
               -> conn: ("ready", pid)
    IDLE       blocks on ``wake`` (never spins); wakes every second to exit if the main process is gone
    RUNNING    command[w] is one of
                 STEP   step all k envs with buffers["action"] rows, auto-reset the ones that ended, write
                        buffers["next"] and buffers["root"] rows
                 RESET  reset the envs whose reset_mask row is True (seeded if a seed is pending)
                 CALL   <- conn: (method, args); runs EnvGroup.<method>(*args); -> conn: ("result", value)
                 CLOSE  close the envs, release ``done``, exit 0
               then status[w] = OK, or status[w] = FAILED and -> conn: ("error", report);
               then release ``done`` and go back to IDLE.

A report is a dict with ``type``, ``message``, ``traceback`` and ``during``. The main process reads the pipe
only when status says FAILED or when it asked for a CALL, so a step costs two semaphore operations.
"""
from __future__ import annotations

import enum
import multiprocessing
import os
import pickle
import signal
import sys
import traceback

import torch

from .group import EnvGroup

STEP, RESET, CALL, CLOSE = 1, 2, 3, 4
COMMAND_NAMES = {STEP: "step", RESET: "reset", CALL: "a call", CLOSE: "close"}
OK, FAILED = 0, 1
IDLE_POLL_S = 1.0


class WorkerState(enum.Enum):
    STARTING = "starting"
    BINDING = "binding"
    IDLE = "idle"
    RUNNING = "running"
    CLOSED = "closed"


def error_report(exc: BaseException, during: str) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
        "during": during,
    }


def run_worker(index, factory, envs_per_worker, first_env, conn, wake, done) -> None:
    """Entry point of worker ``index`` (see the module docstring for the protocol)."""
    _die_with_parent()
    torch.set_num_threads(1)
    state = WorkerState.STARTING
    try:
        group = EnvGroup([factory] * envs_per_worker, owner="ParallelEnv", first_index=first_env)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the main process
        conn.send(("error", error_report(exc, "construction")))
        conn.close()
        sys.exit(1)
    # plain pickle, by value: the multiprocessing pickler would put every spec tensor in shared memory
    conn.send(("specs", pickle.dumps(group.specs)))
    state = WorkerState.BINDING
    message = conn.recv()
    if message[0] != "buffers":
        group.close()
        return
    _, buffers, command, status, reset_mask = message
    group.bind(buffers[first_env : first_env + envs_per_worker])
    mask = reset_mask[first_env : first_env + envs_per_worker].numpy()
    command, status = command.numpy(), status.numpy()
    conn.send(("ready", os.getpid()))
    state = WorkerState.IDLE
    while state is not WorkerState.CLOSED:
        if not wake.acquire(timeout=IDLE_POLL_S):
            if not _main_process_alive():
                break
            continue
        state = WorkerState.RUNNING
        code = int(command[index])
        try:
            if code == STEP:
                group.step()
            elif code == RESET:
                group.reset(mask)
            elif code == CALL:
                method, args = conn.recv()
                conn.send(("result", getattr(group, method)(*args)))
            elif code == CLOSE:
                group.close()
                state = WorkerState.CLOSED
            status[index] = OK
        except BaseException as exc:  # noqa: BLE001 - reported, and the loop goes on
            status[index] = FAILED
            conn.send(("error", error_report(exc, COMMAND_NAMES.get(code, f"command {code}"))))
        if state is WorkerState.RUNNING:
            state = WorkerState.IDLE
        done.release()
    group.close()


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
