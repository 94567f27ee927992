"""Never a silent wrong value: what an env returns is stored only if the buffer keeps it as it is. Overflowing
integers, floats into integer buffers, ``None`` where a number is expected and reshaped arrays are a
``ValueError`` naming the env, the call, the key and the value, on every face; casts that keep every value pass.
"""
import functools
import re

import dm_env
import gymnasium as gym
import numpy as np
import pytest
import torch
from dm_env import specs as dm_specs
from gymnasium import spaces
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from tdcollect.envs import EnvWorkerError, SerialEnv
from tdcollect.envs.engine.values import BadValue, Guard
from tests.faces import FACES, run

pytestmark = pytest.mark.timeout(90)


class ValueEnv(gym.Env):
    """Box observation of ``dtype``, shape (2,); ``step()`` returns ``obs`` (cast to nothing: as given),
    ``reward``, ``terminated``; ``action="discrete"`` lets a group step the envs as one block, ``"multi"`` one
    by one."""

    def __init__(self, dtype=np.uint8, obs=(0, 0), reward=0.0, terminated=False, action="discrete", on="step"):
        low, high = (0, 255) if dtype == np.uint8 else (-100, 100)
        self.observation_space = spaces.Box(low, high, (2,), dtype)
        self.action_space = spaces.Discrete(2) if action == "discrete" else spaces.MultiDiscrete([2, 2])
        self.obs, self.reward, self.terminated, self.on = obs, reward, terminated, on
        self.dtype = dtype

    def reset(self, *, seed=None, options=None):
        return (self.obs if self.on == "reset" else np.zeros(2, self.dtype)), {}

    def step(self, action):
        return self.obs, self.reward, self.terminated, False, {}


def _error(face, factory) -> str:
    """The message of the ValueError the face raised (in a worker: an EnvWorkerError whose type is ValueError)."""
    with pytest.raises((ValueError, EnvWorkerError)) as info:
        run(face, factory)
    assert isinstance(info.value, ValueError) or info.value.exc_type == "ValueError", info.value
    return str(info.value)


OVERFLOWS = [
    (np.uint8, np.array([300, 7], np.int64), r"value 300 \(int64\).*outside 0\.\.255.*uint8"),
    (np.uint8, np.array([-5, 7], np.int64), r"value -5 \(int64\).*outside 0\.\.255.*uint8"),
    (np.uint8, [300, 7], r"value 300 \(int64\).*uint8"),
    (np.int32, np.array([0.5, 1.0]), r"value 0\.5 \(float64\).*not a whole number.*int32"),
    (np.int32, np.array([np.nan, 1.0], np.float32), r"value nan \(float32\).*int32"),
    (np.int8, np.array([1000, 0], np.int64), r"value 1000 \(int64\).*-128\.\.127.*int8"),
]


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("dtype, obs, match", OVERFLOWS, ids=["300", "-5", "list", "half", "nan", "int8"])
def test_a_value_the_buffer_cannot_hold_is_an_error_on_every_face(face, dtype, obs, match, no_leaks):
    message = _error(face, functools.partial(ValueEnv, dtype, obs))
    assert re.search(r"env [01]: step\(\) returned 'observation' = " + match, message), message


@pytest.mark.parametrize("action", ["discrete", "multi"], ids=["block", "one-by-one"])
@pytest.mark.parametrize("on", ["reset", "step"])
def test_both_gym_steppers_check_resets_and_steps(action, on):
    env = SerialEnv(2, functools.partial(ValueEnv, np.uint8, np.array([300, 0]), action=action, on=on))
    with pytest.raises(ValueError, match=rf"env 0: {on}\(\) returned 'observation' = value 300"):
        env.rollout(2)
    env.close()


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("field", ["reward", "terminated", "observation"])
def test_none_where_a_number_is_expected_is_an_error_on_every_face(face, field, no_leaks):
    kwargs = {"obs": None} if field == "observation" else {field: None}
    message = _error(face, functools.partial(ValueEnv, np.float32, **{"obs": np.zeros(2, np.float32), **kwargs}))
    assert re.search(rf"env [01]: step\(\) returned '{field}' = None, where a number is expected", message), message


@pytest.mark.parametrize("action", ["discrete", "multi"], ids=["block", "one-by-one"])
def test_casts_that_keep_every_value_pass(action):
    cases = [(np.float32, np.array([0.25, -3.5], np.float64)), (np.int64, np.array([-100, 100], np.int32)),
             (np.float32, np.array([3, 4], np.int16)), (np.uint8, np.array([0, 255], np.int64)),
             (np.int32, np.array([2.0, -1.0]))]
    for dtype, obs in cases:
        env = SerialEnv(2, functools.partial(ValueEnv, dtype, obs, reward=np.int64(2), action=action))
        td = env.rollout(3, break_when_any_done=False)
        env.close()
        assert (td["next", "observation"] == torch.as_tensor(obs.astype(dtype))).all()
        assert (td["next", "reward"] == 2).all()


def test_guard_rules():
    Guard(np.uint8)(np.array([1, 2], np.uint8))  # same dtype: not even looked at
    Guard(np.bool_)(np.array([0, 1]))
    with pytest.raises(BadValue, match="outside 0 or 1"):
        Guard(np.bool_)(np.array([2]))
    with pytest.raises(BadValue, match="not an array of numbers|where numbers"):
        Guard(np.float32)("text")
    Guard(torch.bfloat16).check(torch.ones(2, dtype=torch.float64))
    with pytest.raises(BadValue, match="value 256"):
        Guard(torch.uint8).check(torch.tensor([256]))


class _WrongTorchRLEnv(EnvBase):
    """Its spec says uint8; ``_step`` returns int64 300."""

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,), dtype=torch.uint8))
        self.action_spec = Categorical(2)
        self.reward_spec = Unbounded((1,))

    def _reset(self, td):
        return TensorDict({"observation": torch.zeros(2, dtype=torch.uint8),
                           "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)})

    def _step(self, td):
        return TensorDict({"observation": torch.tensor([300, 1]), "reward": torch.zeros(1),
                           "done": torch.zeros(1, dtype=torch.bool), "terminated": torch.zeros(1, dtype=torch.bool)})

    def _set_seed(self, seed):
        return seed


@pytest.mark.parametrize("face", ["serial", "parallel", "async", "multisync"])
def test_torchrl_env_value_of_another_dtype_must_fit(face, no_leaks):
    assert "value 300 (int64)" in _error(face, _WrongTorchRLEnv)


class _ReshapingEngine(dm_env.Environment):
    """Declares a (3, 2) observation and returns (2, 3) (same size) from ``step``; reward ``reward``."""

    def __init__(self, shape=(2, 3), reward=1.0):
        self.shape, self.reward = shape, reward

    def reset(self):
        return dm_env.restart(np.zeros((3, 2), np.float32))

    def step(self, action):
        return dm_env.transition(self.reward, np.zeros(self.shape, np.float32))

    def observation_spec(self):
        return dm_specs.Array((3, 2), np.float32, "observation")

    def action_spec(self):
        return dm_specs.DiscreteArray(2, name="action")


@pytest.mark.parametrize("face", ["serial", "parallel"])
def test_dm_env_values_are_never_reshaped(face, no_leaks):
    message = _error(face, _ReshapingEngine)
    assert "env 0: step() returned 'observation' = an array of shape (2, 3), where the env's spec declares (3, 2)" \
        in message


def test_dm_env_none_reward_after_the_first_step_is_an_error():
    env = SerialEnv(1, functools.partial(_ReshapingEngine, (3, 2), None))
    with pytest.raises(ValueError, match="'reward' = None, where a number is expected"):
        env.rollout(2)
    env.close()
    env = SerialEnv(1, functools.partial(_ReshapingEngine, (1, 3, 2), 2.0))  # only dims of size 1 differ
    assert (env.rollout(2)["next", "reward"] == 2).all()
    env.close()


class NanEnv(ValueEnv):
    """float32 observations; env 1 (the second built in a process, or the only one when ``every``) returns
    NaN in its observation (``what="observation"``) or an infinite reward from step 2 on."""

    def __init__(self, what="observation"):
        super().__init__(np.float32, np.zeros(2, np.float32))
        self.what, self.steps = what, 0

    def step(self, action):
        self.steps += 1
        obs, reward = np.zeros(2, np.float32), 0.0
        if self.steps >= 2:
            if self.what == "observation":
                obs[1] = np.nan
            else:
                reward = float("inf")
        return obs, reward, False, False, {}


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("what", ["observation", "reward"])
def test_check_values_refuses_nan_and_inf_on_every_face(face, what, no_leaks):
    factory = functools.partial(NanEnv, what)
    run(face, factory, steps=3)  # off by default: the values pass
    message = _error_with(face, factory, check_values=True)
    assert re.search(rf"env [01]: step\(\) returned '{what}' holding (nan|inf).*check_values=True", message), message


def _error_with(face, factory, **kwargs) -> str:
    with pytest.raises((ValueError, EnvWorkerError)) as info:
        run(face, factory, steps=3, **kwargs)
    return str(info.value)
