"""The worker process of a ParallelEnv: its states, and the protocol with the main process.

Protocol
========
Each worker ``w`` owns envs ``first .. first + k - 1`` (``k = envs_per_worker``) and talks to the main
process through a :class:`~tdcollect.envs.pool.WorkerChannel` (pipe, ``wake``/``done`` semaphores, shared
``command``/``status`` arrays; see ``pool.py``). It receives, once, the shared ``buffers`` (see
``shared.py``; it uses rows ``first:first+k``) and ``reset_mask`` (bool ``[num_envs]``).

States (:class:`WorkerState`) and messages::

    STARTING   builds its k envs from the cloudpickled constructor (inside this process)
               -> pipe: ("specs", pickled EnvSpecs)                 or ("error", report) and exit 1
    BINDING    <- pipe: ("buffers", buffers, reset_mask)
               -> pipe: ("ready", pid)
    IDLE       blocks on ``wake`` (never spins)
    RUNNING    command[w] is one of
                 STEP   step all k envs with buffers["action"] rows, auto-reset the ones that ended, write
                        buffers["next"] and buffers["root"] rows
                 RESET  reset the envs whose reset_mask row is True (seeded if a seed is pending)
                 CALL   <- pipe: (method, args); runs EnvGroup.<method>(*args); -> pipe: ("result", value)
                 CLOSE  leave the loop, close the envs, exit 0
               then status[w] = OK, or FAILED with -> pipe: ("error", report); release ``done``; IDLE.

The main process reads the pipe only when status says FAILED or when it asked for a CALL, so a step costs
two semaphore operations and no pickling.
"""
from __future__ import annotations

import enum
import os
import pickle

from .group import EnvGroup
from .pool import WorkerChannel

STEP, RESET = 1, 2
COMMAND_NAMES = {STEP: "step", RESET: "reset"}


class WorkerState(enum.Enum):
    STARTING = "starting"
    BINDING = "binding"
    IDLE = "idle"
    RUNNING = "running"
    CLOSED = "closed"


def run_worker(channel: WorkerChannel, factory, envs_per_worker: int, first_env: int) -> None:
    """Entry point of a ParallelEnv worker (see the module docstring for the protocol)."""
    channel.start()
    try:
        group = EnvGroup([factory] * envs_per_worker, owner="ParallelEnv", first_index=first_env)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the main process
        channel.fail_start(exc)
    # plain pickle, by value: the multiprocessing pickler would put every spec tensor in shared memory
    channel.conn.send(("specs", pickle.dumps(group.specs)))
    try:
        message = channel.receive()
        if message is None or message[0] != "buffers":
            return
        _, buffers, reset_mask = message
        rows = slice(first_env, first_env + envs_per_worker)
        group.bind(buffers[rows])
        mask = reset_mask[rows].numpy()
        channel.conn.send(("ready", os.getpid()))
        channel.serve({STEP: group.step, RESET: lambda: group.reset(mask)}, group, COMMAND_NAMES)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away during start-up
    finally:
        group.close()
