"""The ParallelEnv worker's process body: builds its envs (an :class:`~.group.EnvGroup`) in the worker process, binds
them to its rows of the shared buffers and serves the commands of the worker protocol (``protocol.py``): ``STEP``,
``PARTIAL_STEP``, ``STAGED_STEP``, ``SLOT_STEP``, ``RESET`` and ``CALL`` (its declared calls)."""
from __future__ import annotations

import functools
import os

import torch

from .group import EnvGroup
from .protocol import PARTIAL_STEP, RESET, SLOT_STEP, STAGED_STEP, STEP, WorkerChannel
from .shared import StageCopy


class Staging:
    """A ParallelEnv worker's ``STAGED_STEP`` and ``SLOT_STEP``: its envs step, then their rows of the buffers are
    copied into staging copy ``parity`` (bound by the ``bind_staging`` call) or output slot ``p`` (``bind_slots``)."""

    def __init__(self, group, buffers):
        self.group, self.buffers = group, buffers  # buffers: the worker's rows
        self.copies: dict[int, StageCopy] = {}  # per command code

    def bind(self, staging, rows: slice) -> None:
        """Take ``staging`` (see ``shared.allocate_copies``) for ``STAGED_STEP``; this worker's rows are ``rows``."""
        self.copies.update({code: StageCopy(self.buffers, staging[p][rows]) for p, code in enumerate(STAGED_STEP)})

    def bind_slots(self, slots, rows: slice) -> None:
        """Take the output ``slots`` (batch ``[OUTPUT_SLOTS, num_envs]``, some ``"next"`` leaves) for ``SLOT_STEP``."""
        self.copies.update({code: StageCopy(self.buffers, slots[p][rows]) for p, code in enumerate(SLOT_STEP)})

    def step(self, code: int):
        objects = self.group.step()
        self.copies[code].copy()
        return objects


def run_env_worker(channel: WorkerChannel, factory, envs_per_worker: int, first_env: int, threads: int = 1) -> None:
    """A ParallelEnv worker: builds ``envs_per_worker`` envs from ``factory`` (a cloudpickled constructor)
    here, in this process, with ``threads`` torch threads, then serves ``STEP``, ``STAGED_STEP``, ``SLOT_STEP``,
    ``RESET`` and the calls ``set_seed``, ``env_attribute`` (its :class:`EnvGroup`'s), ``bind_staging`` and
    ``bind_slots``."""
    channel.start()
    torch.set_num_threads(threads)
    try:
        group = EnvGroup([factory] * envs_per_worker, owner="ParallelEnv", first_index=first_env)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the main process
        channel.fail_start(exc)
    try:
        setup = channel.hello(group.specs)
        if setup is None:
            return
        buffers, reset_mask, step_mask = setup
        rows = slice(first_env, first_env + envs_per_worker)
        try:
            group.bind(buffers[rows])
        except BaseException as exc:  # noqa: BLE001 - reported to the main process
            channel.fail_start(exc, "start-up")
        resets, steps = reset_mask[rows].numpy(), step_mask[rows].numpy()
        staging = Staging(group, buffers[rows])
        if channel.ready(os.getpid()):
            copied = {code: functools.partial(staging.step, code) for code in (*STAGED_STEP, *SLOT_STEP)}
            channel.serve({STEP: group.step, PARTIAL_STEP: lambda: group.step(steps), **copied,
                           RESET: lambda: group.reset(resets)},
                          {"set_seed": group.set_seed, "env_attribute": group.env_attribute,
                           "bind_staging": staging.bind, "bind_slots": staging.bind_slots})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away
    finally:
        group.close()
