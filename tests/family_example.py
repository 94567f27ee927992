"""A small env family written for the tests, as a user adds one: one module with a native engine of its own API (not
gymnasium, not dm_env, not TorchRL) and its ``FAMILY``, registered with ``tdcollect.envs.libs.register``.

The engine, :class:`Abacus`, counts beads: ``start(seed)`` returns the count, ``push(n)`` adds ``n - 1`` beads
(``n`` in 0..2) and returns ``(count, gain, full)``; an episode ends when the count leaves ``[-limit, limit]``.
"""
from __future__ import annotations

import numpy as np
import torch
from torchrl.data import Categorical, Composite, Unbounded

from tdcollect.envs.engine.shared import BufferViews, EnvSpecs
from tdcollect.envs.engine.specs import DONE_KEYS, done_spec, reward_spec
from tdcollect.envs.engine.stepper import Family


class Abacus:
    """The native engine: no ``step``/``reset``, not picklable in spirit (its own API)."""

    def __init__(self, limit: int = 5):
        self.limit = limit
        self.count = 0
        self.rng = np.random.default_rng()

    def start(self, seed: int | None) -> int:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.count = int(self.rng.integers(-2, 3))
        return self.count

    def push(self, n: int) -> tuple[int, float, bool]:
        self.count += int(n) - 1
        return self.count, float(n == 2), abs(self.count) > self.limit

    def shutdown(self) -> None:
        self.count = 0


class AbacusStepper:
    """The family's stepper: writes the count, the gain and the done flags into its row of the buffers."""

    def __init__(self, env: Abacus):
        self.env = env
        self.specs = EnvSpecs(
            observation=Composite(count=Unbounded(shape=(1,), dtype=torch.int64), shape=()),
            action=Composite(action=Categorical(3, shape=(), dtype=torch.int64), shape=()),
            reward=reward_spec(),
            done=done_spec(),
        )

    def bind(self, views: BufferViews, index: int) -> None:
        self._i = index
        self._root = views.root_np["count"]
        self._next = views.next_np["count"]
        self._reward = views.next_np["reward"]
        self._flags = [views.next_np[key] for key in DONE_KEYS]
        self._action = views.action_np["action"]

    def reset(self, seed: int | None = None) -> None:
        self._root[self._i, 0] = self.env.start(seed)

    def step(self) -> None:
        i = self._i
        count, gain, full = self.env.push(self._action[i])
        self._next[i, 0] = count
        self._reward[i, 0] = gain
        done, terminated, truncated = self._flags
        done[i, 0] = terminated[i, 0] = full
        truncated[i, 0] = False
        self._root[i, 0] = self.env.start(None) if full else count

    def close(self) -> None:
        self.env.shutdown()


def _stepper(env) -> AbacusStepper | None:
    return AbacusStepper(env) if isinstance(env, Abacus) else None


def _is_abacus(obj) -> bool:
    return isinstance(obj, Abacus)


FAMILY = Family(name="abacus", priority=45, stepper=_stepper, is_instance=_is_abacus)
