"""Small gymnasium envs for the tests (module level, so every start method can import them)."""
from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import torch
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
        self.seed_used = -1

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


class FrameCountingEnv(CountingEnv):
    """CountingEnv whose observation is an 84x84x3 uint8 frame filled with ``steps so far * 10 + action``
    (an image-sized leaf); episodes last 7 steps."""

    def __init__(self):
        super().__init__(episode_len=7)
        self.observation_space = spaces.Box(0, 255, (84, 84, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((84, 84, 3), np.uint8), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return np.full((84, 84, 3), self.count * 10 + int(action), np.uint8), reward, terminated, truncated, info


class FrameCrashOnceEnv(FrameCountingEnv):
    """FrameCountingEnv that is SIGKILLed at step ``at_step`` of its first life (see :class:`CrashOnceEnv`)."""

    def __init__(self, marker: str, at_step: int = 4):
        super().__init__()
        self.marker, self.at_step = marker, at_step

    def step(self, action):
        if self.count + 1 == self.at_step and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            crash("kill")
        return super().step(action)


class OtherShapeEnv(CountingEnv):
    """Like CountingEnv but with a 5-dim observation (for spec mismatch tests)."""

    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(-np.inf, np.inf, (5,), np.float32)


# ---------------------------------------------------------------------------------------------------------
# A dm_env engine that allows one live instance per process (like some native engines). dm_env comes with
# the test extra (through dmlab2d); without it the class is not defined and the tests that need it skip.
try:
    import dm_env
    from dm_env import specs as dm_specs
except ImportError:  # pragma: no cover - the test extra installs it
    dm_env = None

_LIVE_ENGINES = 0


if dm_env is not None:

    class OnePerProcessEngine(dm_env.Environment):
        """A ``dm_env.Environment`` that refuses a second live instance in the same process.

        Observations: ``"pid"`` int64 ``()``, ``"state"`` float32 ``(2,)`` = [steps so far, last turn], and
        ``"flags"`` = ``{"even": bool ()}`` (steps so far is even). Action: ``{"turn": int32 in [-1, 1],
        "boost": float32 in [0, 1]}``. Reward: the turn. Episodes last ``episode_len`` steps and end with
        discount 0 (terminated), or 1 when ``truncate`` (truncated).
        """

        def __init__(self, episode_len: int = 4, truncate: bool = False):
            global _LIVE_ENGINES
            if _LIVE_ENGINES:
                raise RuntimeError(
                    f"OnePerProcessEngine: process {os.getpid()} already has a live instance; this engine "
                    "allows one per process."
                )
            _LIVE_ENGINES += 1
            self._live = True
            self.episode_len, self.truncate = episode_len, truncate
            self.count, self.turn = 0, 0

        def _observation(self):
            return {
                "pid": np.int64(os.getpid()),
                "state": np.array([self.count, self.turn], np.float32),
                "flags": {"even": np.bool_(self.count % 2 == 0)},
            }

        def reset(self):
            self.count, self.turn = 0, 0
            return dm_env.restart(self._observation())

        def step(self, action):
            assert action["turn"].dtype == np.int32 and -1 <= action["turn"] <= 1, action
            self.count += 1
            self.turn = int(action["turn"])
            obs, reward = self._observation(), float(self.turn)
            if self.count < self.episode_len:
                return dm_env.transition(reward, obs)
            if self.truncate:
                return dm_env.truncation(reward, obs)
            return dm_env.termination(reward, obs)

        def observation_spec(self):
            return {
                "pid": dm_specs.Array((), np.int64, "pid"),
                "state": dm_specs.Array((2,), np.float32, "state"),
                "flags": {"even": dm_specs.Array((), np.bool_, "even")},
            }

        def action_spec(self):
            return {
                "turn": dm_specs.BoundedArray((), np.int32, -1, 1, "turn"),
                "boost": dm_specs.BoundedArray((), np.float32, 0.0, 1.0, "boost"),
            }

        def close(self):
            global _LIVE_ENGINES
            if self._live:
                self._live = False
                _LIVE_ENGINES -= 1


class CrashOnceEnv(CountingEnv):
    """Dies (``how``: "kill" = SIGKILL, "abort" = ``os.abort()``, "segfault" = a NULL read through ctypes,
    "raise" = ValueError) at step ``at_step`` — once: the first crash creates ``marker``, later instances
    (a restarted worker's) step normally. ``marker=None`` crashes every time."""

    def __init__(self, marker: str | None, how: str = "kill", at_step: int = 3):
        super().__init__(episode_len=100)
        self.marker, self.how, self.at_step = marker, how, at_step

    def step(self, action):
        if self.count + 1 == self.at_step and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "w").close()
            crash(self.how)
        return super().step(action)


def crash(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "abort":
        os.abort()
    elif how == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif how == "raise":
        raise ValueError("crash on purpose")
    raise AssertionError(f"unknown crash {how!r}")


class SlowEnv(CountingEnv):
    """Each step sleeps ``delay`` seconds (for interrupting a long rollout)."""

    def __init__(self, delay: float = 0.05):
        super().__init__(episode_len=1000)
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)


class GatedEnv(CountingEnv):
    """A CountingEnv whose step number ``at_step`` creates the file ``<folder>/entered``, then waits (up to
    ``GATE_WAIT_S``) for ``<folder>/open`` to exist: a test orders another thread's call after "a step is under
    way" without timing it (:func:`wait_for_file`)."""

    def __init__(self, folder: str, at_step: int = 2):
        super().__init__(episode_len=1000)
        self.folder, self.at_step, self.stepped = folder, at_step, 0

    def step(self, action):
        self.stepped += 1
        if self.stepped == self.at_step:
            open(os.path.join(self.folder, "entered"), "w").close()
            wait_for_file(os.path.join(self.folder, "open"))
        return super().step(action)


#: How long a gate waits at most (a test that never opens it fails on its own assertions, not by hanging).
GATE_WAIT_S = 30.0


def wait_for_file(path: str, within: float = GATE_WAIT_S) -> None:
    """Wait until ``path`` exists; ``TimeoutError`` after ``within`` s."""
    deadline = time.monotonic() + within
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {within} s")
        time.sleep(0.005)


class BoundedObsEnv(CountingEnv):
    """CountingEnv whose observation space is bounded by ``high`` (envs that differ only in their bounds)."""

    def __init__(self, high: float = 100.0):
        super().__init__(episode_len=100)
        self.observation_space = spaces.Box(-high, high, (3,), np.float32)


def collect_all(factory, workers: int, frames_per_batch: int, batches: int) -> list:
    """Every batch of a ``MultiSyncCollector`` over ``workers`` envs of ``factory`` (random actions), which is shut
    down whatever happens; asserts that ``batches`` came."""
    from tdcollect.collectors import MultiSyncCollector

    collector = MultiSyncCollector([factory] * workers, frames_per_batch=frames_per_batch,
                                   total_frames=frames_per_batch * batches)
    try:
        out = list(collector)
    finally:
        collector.shutdown()
    assert len(out) == batches
    return out


def compare_when_told(tensor, copy, go, answer) -> None:
    """A forked process's body: once ``go`` is set, put on ``answer`` whether ``tensor`` still equals ``copy`` (memory
    this process holds must never be written by the process it was forked from)."""
    go.wait(60)
    answer.put(bool(torch.equal(tensor, copy)))


class PixelEpisodesEnv(gym.Env):
    """A small Atari-like env: ``{"pixels": 30x40x3 uint8}`` frames drawn from the env's seeded RNG, 6 actions,
    rewards in {-1, 0, 1}, and episodes that end at random (about one step in eight) or are truncated after 20
    steps, so that the envs of a batch reset at different steps."""

    def __init__(self):
        self.observation_space = spaces.Dict({"pixels": spaces.Box(0, 255, (30, 40, 3), np.uint8)})
        self.action_space = spaces.Discrete(6)
        self.count = 0

    def _frame(self):
        return {"pixels": self.np_random.integers(0, 256, (30, 40, 3), dtype=np.uint8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._frame(), {}

    def step(self, action):
        self.count += 1
        reward = float(self.np_random.integers(-1, 2)) * (1 + int(action) % 2)
        terminated = bool(self.np_random.random() < 0.125)
        return self._frame(), reward, terminated, self.count >= 20, {}


def same(a, b) -> bool:
    """Whether ``a`` and ``b`` (nested lists, tuples and dicts of tensors, e.g. ``to_dict()`` of steps) hold the same
    keys, lengths, dtypes and values."""
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return a.dtype == b.dtype and torch.equal(a, b)


def same_layout(got, expected, source) -> None:
    """Assert that tensordict ``got`` is built as ``expected``: the same type, keys in the same order, batch size and
    device at every level, the very same tensors as leaves, and every level a new object, none of ``source``'s at
    the same key (writing ``got``'s nested entries leaves ``source`` intact)."""
    assert type(got) is type(expected)
    assert list(got.keys()) == list(expected.keys())
    assert got.batch_size == expected.batch_size and got.device == expected.device
    assert got is not source
    for key, value in expected.items():
        mine = got.get(key)
        if isinstance(value, torch.Tensor):
            assert mine is value, key
        else:
            same_layout(mine, value, None if source is None else source.get(key, None))
