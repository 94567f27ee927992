"""The ParallelEnv worker's process body: builds its envs (an :class:`~.group.EnvGroup`) in the worker process, binds
them to its rows of the shared buffers and serves the commands of the worker protocol (``protocol.py``): ``STEP``,
``PARTIAL_STEP``, ``SLOT_STEP``, ``ROLL``, ``RESET`` and ``CALL`` (its declared calls)."""
from __future__ import annotations

import os
from functools import partial

import numpy as np
import torch

from .group import build_group
from .protocol import PARTIAL_STEP, RESET, ROLL, SLOT_STEP, STEP, WorkerChannel
from .recording import StepRecorder
from .recycle import populate
from .shared import SlotCopy, key_tuple


class SlotCopies:
    """A ParallelEnv worker's ``SLOT_STEP``: its envs step, then their rows of the big "next" leaves are copied into
    output slot ``p`` (bound by the ``bind_slots`` call)."""

    def __init__(self, group, buffers):
        self.group = group  # buffers: the worker's rows
        self.buffers = buffers
        self.copies: dict[int, SlotCopy] = {}  # per command code

    def bind_slots(self, slots, rows: slice) -> None:
        """Take the output ``slots`` (batch ``[OUTPUT_SLOTS, num_envs]``, some ``"next"`` leaves) for ``SLOT_STEP``."""
        self.copies.update({code: SlotCopy(self.buffers, slots[p][rows]) for p, code in enumerate(SLOT_STEP)})

    def step(self, code: int):
        objects = self.group.step()
        self.copies[code].copy()
        return objects


class Recording:
    """A ParallelEnv worker's ``ROLL``: steps ``t0 .. t1 - 1`` of a rollout run here one after the other, each
    recorded straight into this worker's rows of the rollout's storage (shared memory, bound by the
    ``bind_rollout`` call): the main process waits once for the whole span (see ``worker_rollout.py``). Envs stepped
    as one block (``stepper.BlockStepper``) write their observations into the storage's columns themselves
    (the "next" at ``t``, the root at ``t + 1``), the other entries are copied there from the buffers; after a
    span the buffers hold its last step, as after a step."""

    def __init__(self, group, buffers, index: int):
        self.group = group  # buffers: the worker's rows
        self.buffers = buffers
        self.index = index
        self.recorders: dict[int, tuple] = {}  # storage key -> (its recorder, its steps, its observation columns)
        self.control = None  # this worker's (key, t0, t1)

    def bind(self, payload, rows: slice) -> None:
        """Take storage ``key`` (``payload = (key, its shared.MappedTensors [num_envs, *B, T], control, keys)``; rows
        ``rows`` are this worker's), and let go of any storage not in ``keys`` (those the main process keeps)."""
        key, mapped, control, keys = payload
        storage = mapped.tensordict()[rows]
        if key not in self.recorders:  # its pages made here, all at once, rather than one by one while stepping
            for array in mapped.arrays:
                populate(array[rows])
        self.recorders = {k: v for k, v in self.recorders.items() if k in keys}
        self.control = control[self.index].numpy()
        buffers = self.buffers
        columns = None
        root = buffers["root"]
        next_ = buffers["next"]
        block = self.group.block
        if block is not None:  # (its one observation key is written into the columns by the block itself)
            obs_key = block.observation_key
            columns = (storage.get(("next", obs_key)).numpy(), storage.get(obs_key).numpy())
            root, next_ = root.exclude(obs_key), next_.exclude(obs_key)
        actions = [(k, buffers.get(("action", *key_tuple(k)))) for k in buffers["action"].keys(True, True)]
        recorder = StepRecorder(storage, root, next_, actions, storage.batch_dims - 1)
        self.recorders[key] = (recorder, storage.batch_size[-1], columns)

    def roll(self) -> None:
        control = self.control
        recorder, steps, columns = self.recorders[int(control[0])]
        t0 = int(control[1])
        t1 = int(control[2])
        block = self.group.block if columns is not None else None
        try:
            for t in range(t0, t1):
                recorder.load_actions(t)
                if block is not None:
                    block.write_observations_to(columns[0][:, t], columns[1][:, t + 1] if t + 1 < steps
                                                else block.buffer_observations[1])
                self.group.step()
                recorder.record_next(t)
                if t + 1 < steps:
                    recorder.record_root(t + 1)
                control[1] = t + 1
        finally:
            if block is not None:  # the buffers get the observations of the last step taken
                block.write_observations_to(*block.buffer_observations)
                last = int(control[1]) - 1
                if last >= t0:
                    np.copyto(block.buffer_observations[0], columns[0][:, last])
                    if last + 1 < steps:
                        np.copyto(block.buffer_observations[1], columns[1][:, last + 1])


def seed_worker(group, seed: int | None, static_seed: bool = False, episodes: bool = False) -> int | None:
    """A worker's ``set_seed``: this process's torch RNG is seeded with its first env's seed (what its envs' random
    draws use, e.g. TorchRL's ``NoopResetEnv`` or ``rand_step``), as in TorchRL's ParallelEnv workers; then its envs
    are seeded in order (``EnvGroup.set_seed``, ``episodes`` too). Returns the seed for an env after these."""
    if seed is not None:
        torch.manual_seed(seed)
    return group.set_seed(seed, static_seed, episodes)


def run_env_worker(channel: WorkerChannel, factory, envs_per_worker: int, first_env: int, families: tuple,
                   threads: int = 1, wrap=None) -> None:
    """A ParallelEnv worker: builds ``envs_per_worker`` envs from ``factory`` (a cloudpickled constructor) here, in
    this process, stepped through ``families`` (``stepper.Family``), with ``threads`` torch threads, then serves
    ``STEP``, ``SLOT_STEP``, ``ROLL``, ``RESET`` and the calls ``set_seed``, ``env_attribute`` (its
    :class:`EnvGroup`'s), ``bind_slots`` and ``bind_rollout``. ``wrap``: None, or a picklable ``group -> group``
    applied to the built group (an object with the group's interface that the worker steps instead, e.g. its envs
    under a transform)."""
    channel.start()
    torch.set_num_threads(threads)
    try:
        group = build_group([factory] * envs_per_worker, "ParallelEnv", families, first_index=first_env)
        if wrap is not None:
            group = wrap(group)
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
        resets = reset_mask[rows].numpy()
        steps = step_mask[rows].numpy()
        slot_copies = SlotCopies(group, buffers[rows])
        recording = Recording(group, buffers[rows], channel.index)
        if channel.ready(os.getpid()):

            def answered(run, *args) -> tuple | None:
                """``run(*args)`` (a step or reset), answered with ``(objects, posts)`` (see ``EnvGroup``); None when
                both are None."""
                objects = run(*args)
                posts = group.take_posts()
                return None if objects is None and posts is None else (objects, posts)

            channel.serve({STEP: partial(answered, group.step), PARTIAL_STEP: partial(answered, group.step, steps),
                           **{code: partial(answered, slot_copies.step, code) for code in SLOT_STEP},
                           ROLL: recording.roll, RESET: partial(answered, group.reset, resets)},
                          {"set_seed": partial(seed_worker, group), "env_attribute": group.env_attribute,
                           "bind_slots": slot_copies.bind_slots,
                           "bind_rollout": recording.bind})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away
    finally:
        group.close()
