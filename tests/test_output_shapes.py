"""An env's outputs must have exactly the shapes its spaces / specs declare: a (1,) observation where (4,) is
declared is a ValueError naming the env, the key and both shapes, never broadcast into [v, v, v, v].

The env classes are module level so that every start method can import them in a worker.
"""
import functools
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from tdcollect.envs import EnvWorkerError, SerialEnv
from tests.faces import batched

pytestmark = pytest.mark.timeout(60)

_INSTANCES: dict[int, int] = {}


def _instance_number() -> int:
    """0, 1, 2, ... for the instances built in this process (each worker counts on its own)."""
    n = _INSTANCES.get(os.getpid(), 0)
    _INSTANCES[os.getpid()] = n + 1
    return n


def _value(shape):
    """A float32 observation of ``shape``; ``"scalar"``: a numpy scalar."""
    if shape == "scalar":
        return np.float32(0.5)
    return np.full(shape, 0.5, np.float32)


class WrongShapeEnv(gym.Env):
    """Box observation space of shape ``declared``; ``reset()`` (``when="reset"``), ``step()``
    (``when="step"``) or every reset but the first (``when="auto-reset"``) returns an observation of shape
    ``returned`` (``"scalar"``: a numpy scalar) — in every instance, or only in the ``bad_instance``-th one
    built in its process. ``action="discrete"`` lets a group step these envs as one block
    (``GymBlockStepper``), ``"multidiscrete"`` one by one (``GymStepper``). Episodes last 3 steps
    (terminated)."""

    def __init__(self, declared=(4,), returned=(1,), when="step", bad_instance=None, action="discrete"):
        self.observation_space = spaces.Box(-1.0, 1.0, declared, np.float32)
        self.action_space = spaces.Discrete(2) if action == "discrete" else spaces.MultiDiscrete([2, 2])
        self.declared = declared
        self.returned = returned
        self.when = when
        self.bad = bad_instance is None or _instance_number() == bad_instance
        self.count = self.resets = 0

    def _obs(self, now):
        wrong = now == self.when or (self.when == "auto-reset" and now == "reset" and self.resets > 1)
        return _value(self.returned if self.bad and wrong else self.declared)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        self.resets += 1
        return self._obs("reset"), {}

    def step(self, action):
        self.count += 1
        return self._obs("step"), 1.0, self.count >= 3, False, {}


class WrongOutputsEnv(gym.Env):
    """A correct (4,) observation, but step() returns ``reward`` / ``terminated`` / ``truncated`` as given
    (e.g. an array of shape (1,)). ``action`` as for :class:`WrongShapeEnv`."""

    def __init__(self, reward=1.0, terminated=False, truncated=False, action="discrete"):
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2) if action == "discrete" else spaces.MultiDiscrete([2, 2])
        self.outputs = reward, terminated, truncated

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return (np.zeros(4, np.float32), *self.outputs, {})


class NestedDictEnv(gym.Env):
    """Dict observation ``{"pos": Box(2,), "inner": {"vel": Box(3,), "mode": Discrete(3, start=1)}}``;
    ``bad``: the nested key whose value has a wrong shape (``"vel"``: shape (1,), ``"mode"``: shape (2,)),
    returned by ``when`` ("reset" or "step")."""

    def __init__(self, bad=None, when="step"):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "inner": spaces.Dict({
                "vel": spaces.Box(-1.0, 1.0, (3,), np.float32),
                "mode": spaces.Discrete(3, start=1),
            }),
        })
        self.action_space = spaces.Discrete(2)
        self.bad, self.when = bad, when
        self.count = 0

    def _obs(self, now):
        wrong = self.bad if now == self.when else None
        return {
            "pos": np.full(2, 0.25, np.float32),
            "inner": {
                "vel": np.full(1 if wrong == "vel" else 3, float(self.count), np.float32),
                "mode": np.array([2, 2]) if wrong == "mode" else 2,
            },
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs("reset"), {}

    def step(self, action):
        self.count += 1
        return self._obs("step"), float(action), False, self.count >= 4, {}


class LooseButCorrectEnv(gym.Env):
    """Right shapes in loose forms: float64 arrays for a float32 Box, a list for a MultiBinary, a Python int
    for a Discrete, numpy scalars for reward and flags; a Tuple inside the Dict observation."""

    def __init__(self):
        self.observation_space = spaces.Dict({
            "x": spaces.Box(-10.0, 10.0, (3,), np.float32),
            "bits": spaces.MultiBinary(4),
            "n": spaces.Discrete(5, start=2),
            "pair": spaces.Tuple((spaces.Box(0.0, 1.0, (), np.float32), spaces.Discrete(2))),
        })
        self.action_space = spaces.Discrete(3)
        self.count = 0

    def _obs(self):
        c = self.count
        return {
            "x": np.array([c, c + 0.5, -c], np.float64),
            "bits": [c % 2, 1, 0, 1],
            "n": 2 + c % 5,
            "pair": (np.float64(0.5), c % 2),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), np.float64(action), np.bool_(self.count >= 3), np.bool_(False), {}


class CountingBoxEnv(gym.Env):
    """Box (4,) obs = [steps, last action, 0, 0] as float64 (cast to float32); reward an int; episodes of 3."""

    def __init__(self, action="discrete"):
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.Discrete(2) if action == "discrete" else spaces.MultiDiscrete([2, 2])
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.zeros(4), {}

    def step(self, action):
        self.count += 1
        return np.array([self.count, np.sum(action), 0, 0]), int(np.sum(action)), self.count >= 3, False, {}


class WrongShapeTorchRLEnv(EnvBase):
    """An unbatched TorchRL env declaring observation (4,); ``_reset`` or ``_step`` (``when``) returns
    shape ``returned`` (``()``: a scalar tensor)."""

    def __init__(self, returned=(1,), when="step", declared=(4,)):
        super().__init__(batch_size=torch.Size([]))
        self.observation_spec = Composite(observation=Unbounded(declared), shape=())
        self.action_spec = Categorical(2, shape=())
        self.reward_spec = Unbounded((1,))
        self.declared, self.returned, self.when = declared, returned, when

    def _obs(self, now):
        return torch.full(self.returned if now == self.when else self.declared, 0.5)

    def _reset(self, tensordict=None, **kwargs):
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"observation": self._obs("reset"), "done": done, "terminated": done.clone()}, [])

    def _step(self, tensordict):
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"observation": self._obs("step"), "reward": torch.ones(1), "done": done,
                           "terminated": done.clone()}, [])

    def _set_seed(self, seed):
        pass


def _run(env, when):
    """Reset ``env`` and, if the wrong value comes from step(), take 2 steps; close it in any case."""
    with env:
        env.reset()
        if when == "step":
            env.rollout(2, break_when_any_done=False)


GYM_DECLARES = "the env's observation_space declares shape "
TORCHRL_DECLARES = "the env's specs declare shape "
SCALAR = r"a gymnasium env must return a scalar, shape \(\)"


def _expect(kind, env_index, worker, call, key_text, declared, received):
    """(exception type, regex) of the error for env ``env_index`` (in ``worker``); ``declared``: the regex of
    what the message says was declared."""
    body = (rf"env {env_index}: {re_escape(call)} returned {key_text} with shape {received}, but {declared}\. "
            r"Values are never broadcast")
    if kind == "serial":
        return ValueError, body
    return EnvWorkerError, rf"worker {worker} raised ValueError during {call[:-2]}: {body}"


def re_escape(text):
    return text.replace("(", r"\(").replace(")", r"\)")


def _shape_text(shape):
    """The regex of a shape as the message writes it (``"scalar"``: shape ``()``)."""
    return re_escape("()" if shape == "scalar" else str(tuple(shape)))


CASES = [((4,), (1,)), ((4,), "scalar"), ((2,), (5,))]


# ----------------------------------------------------------------- gymnasium observations
@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("when", ["reset", "step"])
@pytest.mark.parametrize("declared, returned", CASES, ids=["1-vs-4", "scalar-vs-4", "5-vs-2"])
@pytest.mark.parametrize("action", ["discrete", "multidiscrete"], ids=["block", "one-by-one"])
def test_gym_observation_of_wrong_shape_is_an_error_naming_env_key_and_shapes(kind, when, declared, returned,
                                                                              action):
    good = functools.partial(WrongShapeEnv, declared, declared, action=action)
    bad = functools.partial(WrongShapeEnv, declared, returned, when, action=action)
    error, pattern = _expect(kind, 1, 1, f"{when}()", "observation 'observation'",
                             GYM_DECLARES + _shape_text(declared), _shape_text(returned))
    with pytest.raises(error, match=pattern) as info:
        _run(batched(kind, 2, [good, bad]), when)
    if kind == "parallel":
        assert info.value.worker == 1 and info.value.exc_type == "ValueError"


@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("action", ["discrete", "multidiscrete"], ids=["block", "one-by-one"])
def test_the_env_index_counts_across_workers_and_envs_per_worker(kind, action):
    """Worker 1's second env (env 3 of 4) returns (1,) where (4,) is declared."""
    good = functools.partial(WrongShapeEnv, (4,), (4,), action=action)
    bad = functools.partial(WrongShapeEnv, (4,), (1,), "step", bad_instance=1, action=action)
    error, pattern = _expect(kind, 3, 1, "step()", "observation 'observation'", GYM_DECLARES + r"\(4,\)",
                             r"\(1,\)")
    env = batched(kind, 2, [good, bad], envs_per_worker=2) if kind == "parallel" else SerialEnv(
        4, [good, good, good, functools.partial(WrongShapeEnv, (4,), (1,), "step", action=action)])
    with pytest.raises(error, match=pattern):
        _run(env, "step")


@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("action", ["discrete", "multidiscrete"], ids=["block", "one-by-one"])
def test_wrong_shape_from_the_auto_reset_after_done_is_named_as_reset(kind, action):
    """Env 1 ends after 3 steps; the reset() that step() then calls returns the wrong shape."""
    good = functools.partial(WrongShapeEnv, (4,), (4,), action=action)
    bad = functools.partial(WrongShapeEnv, (4,), (1,), "auto-reset", action=action)
    error, pattern = _expect(kind, 1, 1, "reset()", "observation 'observation'", GYM_DECLARES + r"\(4,\)",
                             r"\(1,\)")
    if kind == "parallel":  # the worker was stepping when its env reset itself
        pattern = pattern.replace("during reset", "during step")
    with batched(kind, 2, [good, bad]) as env:
        state = env.reset()  # the first reset: right shape
        with pytest.raises(error, match=pattern):
            env.rollout(5, auto_reset=False, tensordict=state, break_when_any_done=False)


# ----------------------------------------------------------------- reward and done flags
@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("key, outputs", [
    ("reward", {"reward": np.ones(1)}),
    ("reward", {"reward": np.ones(2)}),
    ("terminated", {"terminated": np.array([False])}),
    ("truncated", {"truncated": [False, False]}),
], ids=["reward-1", "reward-2", "terminated-1", "truncated-2"])
@pytest.mark.parametrize("action", ["discrete", "multidiscrete"], ids=["block", "one-by-one"])
def test_reward_and_flags_must_be_scalars(kind, key, outputs, action):
    good = functools.partial(WrongOutputsEnv, action=action)
    bad = functools.partial(WrongOutputsEnv, action=action, **outputs)
    received = _shape_text(np.shape(outputs[key]))
    error, pattern = _expect(kind, 1, 1, "step()", f"'{key}'", SCALAR, received)
    with pytest.raises(error, match=pattern):
        _run(batched(kind, 2, [good, bad]), "step")


# ----------------------------------------------------------------- nested Dict observations
@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("when", ["reset", "step"])
@pytest.mark.parametrize("bad, expected, received", [("vel", r"\(3,\)", r"\(1,\)"), ("mode", r"\(\)", r"\(2,\)")])
def test_nested_dict_observation_names_the_nested_key(kind, when, bad, expected, received):
    key_text = rf"observation \('inner', '{bad}'\)"
    error, pattern = _expect(kind, 1, 1, f"{when}()", key_text, GYM_DECLARES + expected, received)
    with pytest.raises(error, match=pattern):
        _run(batched(kind, 2, [NestedDictEnv, functools.partial(NestedDictEnv, bad, when)]), when)


# ----------------------------------------------------------------- TorchRL envs
@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("when", ["reset", "step"])
@pytest.mark.parametrize("declared, returned", [((4,), (1,)), ((4,), ()), ((2,), (5,))],
                         ids=["1-vs-4", "scalar-vs-4", "5-vs-2"])
def test_torchrl_observation_of_wrong_shape_is_an_error(kind, when, declared, returned):
    good = functools.partial(WrongShapeTorchRLEnv, declared, when, declared)
    bad = functools.partial(WrongShapeTorchRLEnv, returned, when, declared)
    error, pattern = _expect(kind, 1, 1, f"{when}()", "'observation'", TORCHRL_DECLARES + _shape_text(declared),
                             _shape_text(returned))
    with pytest.raises(error, match=pattern):
        _run(batched(kind, 2, [good, bad]), when)


# ----------------------------------------------------------------- correct envs are unaffected
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_correctly_shaped_loose_values_still_work(kind):
    with batched(kind, 2, LooseButCorrectEnv) as env:
        td = env.rollout(4, break_when_any_done=False)
    nxt = td["next"]
    assert nxt["x"].dtype == torch.float32
    torch.testing.assert_close(nxt["x"][0, :3], torch.tensor([[1, 1.5, -1], [2, 2.5, -2], [3, 3.5, -3]]))
    assert nxt["bits"][0, 0].tolist() == [1, 1, 0, 1]
    assert nxt["n"][0, :3].tolist() == [1, 2, 3]  # Discrete(5, start=2): value - 2
    assert nxt["pair", "0"].shape == (2, 4) and nxt["pair", "1"][0, :3].tolist() == [1, 0, 1]
    assert nxt["terminated"][0, :, 0].tolist() == [False, False, True, False]


@pytest.mark.parametrize("kind", ["serial", "parallel"])
@pytest.mark.parametrize("action", ["discrete", "multidiscrete"], ids=["block", "one-by-one"])
def test_correct_box_env_values_are_written_as_before(kind, action):
    with batched(kind, 2, functools.partial(CountingBoxEnv, action)) as env:
        env.set_seed(0)
        td = env.rollout(4, break_when_any_done=False)
    assert td["next", "observation"].shape == (2, 4, 4)
    torch.testing.assert_close(td["next", "observation"][:, :, 0], torch.tensor([[1.0, 2, 3, 1]] * 2))
    torch.testing.assert_close(td["next", "reward"][..., 0], td["next", "observation"][..., 1])
    assert td["next", "done"][:, :, 0].tolist() == [[False, False, True, False]] * 2
    torch.testing.assert_close(td["observation"][:, 3], torch.zeros(2, 4))  # the reset observation


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_correct_torchrl_env_is_unaffected(kind):
    with batched(kind, 2, functools.partial(WrongShapeTorchRLEnv, (4,))) as env:
        td = env.rollout(3, break_when_any_done=False)
    torch.testing.assert_close(td["next", "observation"], torch.full((2, 3, 4), 0.5))
