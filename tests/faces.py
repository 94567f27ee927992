"""Every face of tdcollect driven the same way, so that a behaviour is tested on all of them: ``run(face,
factory, steps)`` builds the face over two envs of ``factory``, resets, takes ``steps`` random steps (or one
collector batch of ``steps`` frames per env) and closes it, raising what the face raised."""
from __future__ import annotations

import numpy as np

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import AsyncParallelEnv, ParallelEnv, SerialEnv
from tdcollect.envs.vector import ParallelVecEnv, ParallelVectorEnv

FACES = ["serial", "parallel", "async", "multisync", "vector", "sb3"]


def batched(kind: str, num_workers: int, factory, envs_per_worker: int = 1, **kwargs):
    """A ``SerialEnv`` (``kind="serial"``) or ``ParallelEnv`` (``"parallel"``) of ``num_workers * envs_per_worker``
    envs; ``factory``: one callable, or a list of one per worker (the serial env builds each one's envs in a
    row, as a worker does)."""
    if kind == "serial":
        if isinstance(factory, list):
            factory = [f for f in factory for _ in range(envs_per_worker)]
        return SerialEnv(num_workers * envs_per_worker, factory, **kwargs)
    return ParallelEnv(num_workers, factory, envs_per_worker=envs_per_worker, **kwargs)


def build(face: str, factory, n: int = 2, **kwargs):
    """The face over ``n`` envs of ``factory`` (one per worker)."""
    if face == "serial":
        return SerialEnv(n, factory, **kwargs)
    if face == "parallel":
        return ParallelEnv(n, factory, **kwargs)
    if face == "async":
        return AsyncParallelEnv(n, factory, batch_workers=1, **kwargs)
    if face == "multisync":
        return MultiSyncCollector([factory] * n, None, frames_per_batch=2 * n, **kwargs)
    if face == "vector":
        return ParallelVectorEnv([factory] * n, **kwargs)
    if face == "sb3":
        return ParallelVecEnv([factory] * n, **kwargs)
    raise ValueError(face)


def run(face: str, factory, steps: int = 3, **kwargs) -> None:
    """Build, step ``steps`` times with random actions, close (also when a step raises)."""
    owner = build(face, factory, **kwargs)
    try:
        if face in ("serial", "parallel"):
            owner.rollout(steps, break_when_any_done=False)
        elif face == "async":
            owner.async_reset()
            for _ in range(steps * owner.num_workers):  # one worker's envs a time: each gets ``steps`` steps
                td = owner.recv()
                td.update(owner.full_action_spec[: td.shape[0]].rand())
                owner.send(td)
            owner.recv()
        elif face == "multisync":
            for i, _ in enumerate(owner):
                if i + 1 >= steps:
                    break
        else:
            owner.reset()
            space = owner.action_space
            for _ in range(steps):
                if face == "vector":
                    owner.step(space.sample())
                else:
                    owner.step(np.array([space.sample() for _ in range(owner.num_envs)]))
    finally:
        if face == "multisync":
            owner.shutdown()
        else:
            owner.close()

