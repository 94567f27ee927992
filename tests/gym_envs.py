"""gymnasium envs for the tests of the gymnasium face (``test_vector_gym*.py``): counters, sleepers, failing and
space-sampling envs, importable by reference from the workers (spawn included)."""
from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TallyEnv(gym.Env):
    """obs: steps since the last reset (the reset seed at reset, 0 without one); reward: the action; terminates
    once ``limit`` steps are done. Infos: the reset's ``{"seeded": seed}``, and ``{"tally": n}`` at every step
    (``info_every`` > 0: every ``info_every``-th step only)."""

    def __init__(self, limit: int = 3, info_every: int = 1, big_info_at: int = -1):
        self.observation_space = spaces.Discrete(1000)
        self.action_space = spaces.Discrete(10)
        self.limit, self.info_every, self.big_info_at = limit, info_every, big_info_at
        self.count, self.options_seen = 0, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0 if seed is None else seed
        self.options_seen = options
        return self.count, ({"seeded": seed} if seed is not None else {})

    def step(self, action):
        self.count += 1
        info = {"tally": self.count} if self.count % self.info_every == 0 else {}
        if self.count == self.big_info_at:
            info["big"] = np.arange(5000)  # a large info (40 kB)
        return self.count, float(action), self.count >= self.limit, False, info

    def scaled(self, k, offset=0):
        return self.limit * k + offset


class SleepyEnv(gym.Env):
    """step sleeps ``float(action)`` seconds; reset sleeps ``reset_s``."""

    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = spaces.Box(0, 10, (), np.float32)

    def __init__(self, reset_s: float = 0.0):
        self.reset_s = reset_s

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(self.reset_s)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(float(action))
        return np.ones(2, np.float32), 0.0, False, False, {}

    def slow_answer(self, seconds):
        time.sleep(seconds)
        return "late"


class EnvError(Exception):
    """An exception type of the user's own."""


class FailingEnv(TallyEnv):
    """Raises ``error`` at step ``at`` (``"kill"``: SIGKILLs its own process)."""

    def __init__(self, error="value", at: int = 2):
        super().__init__(limit=100)
        self.error, self.at = error, at

    def step(self, action):
        if self.count + 1 == self.at:
            if self.error == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise {"value": ValueError("bad step"), "own": EnvError("own bad step"), "os": OSError(5, "io")}[self.error]
        return super().step(action)


class SampleEnv(gym.Env):
    """Observations sampled from ``obs_space``; checks its actions are in ``act_space``; ends every 3 steps."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, obs_space, act_space=None, render_mode=None):
        self.observation_space, self.action_space = obs_space, act_space or spaces.Discrete(3)
        self.render_mode, self.count = render_mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:  # else the space's generator goes on: the same in every process given one seed
            self.observation_space.seed(seed)
        self.count = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.count += 1
        return self.observation_space.sample(), 1.0, self.count % 3 == 0, False, {}

    def render(self):
        return np.full((4, 6, 3), self.count, np.uint8)


class GatedResetEnv(SleepyEnv):
    """A SleepyEnv whose reset waits until the file ``gate`` exists."""

    def __init__(self, gate: str):
        super().__init__()
        self.gate = gate

    def reset(self, *, seed=None, options=None):
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        return super().reset(seed=seed, options=options)


class Blob(spaces.Space):
    """A space of the user's own: ``size`` random bytes (large when ``size`` is)."""

    def __init__(self, size: int, seed=None):
        super().__init__(None, None, seed)
        self.size = size

    def sample(self, mask=None, probability=None):
        return self.np_random.bytes(self.size)

    def contains(self, x):
        return isinstance(x, bytes) and len(x) == self.size

    def __eq__(self, other):
        return isinstance(other, Blob) and other.size == self.size


def tallies(*limits, **kwargs):
    return [lambda limit=limit: TallyEnv(limit, **kwargs) for limit in limits]


def seeded_cartpole(i):
    def make():
        env = gym.make("CartPole-v1")
        env.action_space.seed(i)
        return env
    return make
