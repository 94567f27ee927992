"""The ParallelEnv worker's process body: builds its envs (an :class:`~.group.EnvGroup`) in the worker process, binds
them to its rows of the shared buffers and serves the commands of the worker protocol (``protocol.py``): ``STEP``,
``PARTIAL_STEP``, ``STAGED_STEP``, ``RESET`` and ``CALL`` (its declared calls)."""
from __future__ import annotations

import os

import torch

from .group import EnvGroup
from .protocol import PARTIAL_STEP, RESET, STAGED_STEP, STEP, WorkerChannel
from .shared import StageCopy


class Staging:
    """A ParallelEnv worker's ``STAGED_STEP``: its envs step, then their rows of the buffers are copied into
    staging copy ``parity`` (bound by the ``bind_staging`` call)."""

    def __init__(self, group, buffers):
        self.group, self.buffers = group, buffers  # buffers: the worker's rows
        self.stages: list = []

    def bind(self, staging, rows: slice) -> None:
        """Take ``staging`` (see ``shared.allocate_staging``) for ``STAGED_STEP``; this worker's rows are ``rows``."""
        self.stages = [StageCopy(self.buffers, staging[p][rows]) for p in (0, 1)]

    def step(self, parity: int):
        objects = self.group.step()
        self.stages[parity].copy()
        return objects


def run_env_worker(channel: WorkerChannel, factory, envs_per_worker: int, first_env: int, threads: int = 1) -> None:
    """A ParallelEnv worker: builds ``envs_per_worker`` envs from ``factory`` (a cloudpickled constructor)
    here, in this process, with ``threads`` torch threads, then serves ``STEP``, ``STAGED_STEP``, ``RESET`` and
    the calls ``set_seed``, ``env_attribute`` (its :class:`EnvGroup`'s) and ``bind_staging``."""
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
            channel.serve({STEP: group.step, PARTIAL_STEP: lambda: group.step(steps),
                           STAGED_STEP[0]: lambda: staging.step(0), STAGED_STEP[1]: lambda: staging.step(1),
                           RESET: lambda: group.reset(resets)},
                          {"set_seed": group.set_seed, "env_attribute": group.env_attribute,
                           "bind_staging": staging.bind})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away
    finally:
        group.close()
