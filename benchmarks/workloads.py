"""Gymnasium environment factories used as benchmark workloads.

Every factory is a module-level function so it can be pickled and
re-imported inside worker processes (fork, spawn or forkserver).

* ``cheap``  - plain ``CartPole-v1``: stepping cost is tiny, so the
  benchmark mostly measures inter-process communication overhead.
* ``costly`` - ``CartPole-v1`` whose every step also spins the CPU for a
  fixed 200 microseconds, emulating a simulator with real per-step work.
* ``pixels`` - a synthetic env with 84x84x3 ``uint8`` observations
  (about 21 KB each) and almost no compute, measuring the cost of moving
  image-sized observations between processes.
* ``atari`` - ALE ``Pong-v5`` (210x160x3 ``uint8`` frames, frameskip 4);
  ``atari84`` - the same game as most training sees it: frameskip 4 by
  ``AtariPreprocessing``, 84x84 grayscale, 4 frames stacked; ``mujoco`` -
  ``HalfCheetah-v5`` (17 floats, 6 continuous actions). These need the
  ``bench`` extra (``ale-py``, ``gymnasium[mujoco]``), imported on first use.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: Busy-wait duration added to each step of the ``costly`` workload.
COSTLY_STEP_SECONDS = 200e-6


def burn_cpu(seconds: float) -> None:
    """Spin on ``time.perf_counter`` for ``seconds`` (busy CPU, not sleep)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class BusyStep(gym.Wrapper):
    """Wrapper that burns a fixed amount of CPU time on every ``step``."""

    def __init__(self, env: gym.Env, seconds: float = COSTLY_STEP_SECONDS):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        burn_cpu(self.seconds)
        return self.env.step(action)


class PixelEnv(gym.Env):
    """Cheap synthetic env emitting 84x84x3 uint8 frames.

    A random canvas wider than the frame is drawn once per instance; each
    observation is an 84-pixel-wide window of it whose offset moves with the
    step count and the action, so frames differ from step to step while the
    per-step work stays a single 21 KB copy.  Episodes last 150-249 steps,
    the exact length drawn from the env's seeded ``np_random`` at reset.
    """

    metadata = {"render_modes": []}
    frame_shape = (84, 84, 3)

    def __init__(self, canvas_extra: int = 64):
        super().__init__()
        self.observation_space = spaces.Box(0, 255, self.frame_shape, np.uint8)
        self.action_space = spaces.Discrete(4)
        height, width, channels = self.frame_shape
        self._canvas_extra = canvas_extra
        canvas_rng = np.random.default_rng(12345)
        self._canvas = canvas_rng.integers(
            0, 256, size=(height, width + canvas_extra, channels), dtype=np.uint8
        )
        self._t = 0
        self._offset = 0
        self._horizon = 200

    def _frame(self) -> np.ndarray:
        width = self.frame_shape[1]
        return self._canvas[:, self._offset : self._offset + width].copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._offset = int(self.np_random.integers(0, self._canvas_extra))
        self._horizon = int(self.np_random.integers(150, 250))
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        self._offset = (self._offset + 1 + int(action)) % self._canvas_extra
        terminated = self._t >= self._horizon
        return self._frame(), 1.0, terminated, False, {}


def make_cheap() -> gym.Env:
    """Plain ``CartPole-v1``."""
    return gym.make("CartPole-v1")


def make_costly() -> gym.Env:
    """``CartPole-v1`` with 200 microseconds of busy CPU per step."""
    return BusyStep(gym.make("CartPole-v1"))


def make_pixels() -> gym.Env:
    """Synthetic 84x84x3 uint8 observation env (see :class:`PixelEnv`)."""
    return PixelEnv()


def _ale():
    import ale_py

    gym.register_envs(ale_py)


def make_atari() -> gym.Env:
    """ALE ``Pong-v5``: 210x160x3 uint8 frames, frameskip 4, sticky actions (the v5 defaults)."""
    _ale()
    return gym.make("ALE/Pong-v5")


def make_atari84() -> gym.Env:
    """``Pong-v5`` preprocessed as for DQN/PPO training: 84x84 grayscale, frameskip 4, 4 frames stacked."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    _ale()
    env = AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1), frame_skip=4, screen_size=84, grayscale_obs=True)
    return FrameStackObservation(env, 4)


def make_mujoco() -> gym.Env:
    """MuJoCo ``HalfCheetah-v5``."""
    return gym.make("HalfCheetah-v5")


WORKLOADS = {"cheap": make_cheap, "costly": make_costly, "pixels": make_pixels, "atari": make_atari,
             "atari84": make_atari84, "mujoco": make_mujoco}
#: The workloads every machine can run (no extra package); the default of ``--quick``.
BASIC_WORKLOADS = ["cheap", "costly", "pixels"]
