"""Small gymnasium envs for the tests (module level, so every start method can import them)."""
from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def cartpole():
    return gym.make("CartPole-v1")


class CountingEnv(gym.Env):
    """obs = [steps so far, last action, reset seed or -1]; ends after ``episode_len`` steps (terminated)."""

    def __init__(self, episode_len: int = 5, n_actions: int = 3):
        self.episode_len = episode_len
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = spaces.Discrete(n_actions)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        self.seed_used = -1 if seed is None else seed
        return np.array([0, -1, self.seed_used], np.float32), {}

    def step(self, action):
        self.count += 1
        obs = np.array([self.count, action, self.seed_used], np.float32)
        return obs, float(action), self.count >= self.episode_len, False, {}


class FaultyEnv(CountingEnv):
    """Raises ``ValueError`` in ``where`` ("init", "reset" or "step", at step ``at_step``)."""

    def __init__(self, where: str, at_step: int = 3):
        if where == "init":
            raise ValueError("boom in __init__")
        super().__init__(episode_len=100)
        self.where, self.at_step = where, at_step

    def reset(self, *, seed=None, options=None):
        if self.where == "reset":
            raise ValueError("boom in reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.where == "step" and self.count + 1 >= self.at_step:
            raise ValueError(f"boom in step {self.count + 1}")
        return super().step(action)


class SuicidalEnv(CountingEnv):
    """Kills its own process with ``sig`` at step ``at_step``."""

    def __init__(self, at_step: int = 2, sig: int = signal.SIGKILL):
        super().__init__(episode_len=100)
        self.at_step, self.sig = at_step, sig

    def step(self, action):
        if self.count + 1 >= self.at_step:
            os.kill(os.getpid(), self.sig)
        return super().step(action)


class StuckEnv(CountingEnv):
    """Its step never returns (well, after an hour)."""

    def step(self, action):
        time.sleep(3600)


class RichSpacesEnv(gym.Env):
    """Dict observation (Box, Discrete with start, Tuple(MultiDiscrete, MultiBinary)); Dict action."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": spaces.Discrete(3, start=1),
                "extra": spaces.Tuple((spaces.MultiDiscrete([2, 5]), spaces.MultiBinary(4))),
            }
        )
        self.action_space = spaces.Dict(
            {"move": spaces.Box(-2.0, 2.0, (2,), np.float32), "jump": spaces.Discrete(2)}
        )
        self.t = 0

    def _obs(self):
        rng = self.np_random
        return {
            "pos": rng.uniform(-1, 1, 2).astype(np.float32),
            "mode": int(rng.integers(1, 4)),
            "extra": (rng.integers(0, [2, 5]), rng.integers(0, 2, 4).astype(np.int8)),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert action["move"].shape == (2,) and action["jump"] in (0, 1)
        self.t += 1
        return self._obs(), float(action["jump"]), False, self.t >= 4, {}


class OtherShapeEnv(CountingEnv):
    """Like CountingEnv but with a 5-dim observation (for spec mismatch tests)."""

    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(-np.inf, np.inf, (5,), np.float32)
