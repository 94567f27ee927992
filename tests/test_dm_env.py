"""Raw ``dm_env.Environment`` factories in SerialEnv / ParallelEnv (DmEnvStepper, dm_specs), and the
one-instance-per-process engine."""
import functools
import sys

import numpy as np
import pytest
import torch
from torchrl.data import Bounded, Categorical, MultiCategorical, Unbounded
from torchrl.envs.utils import check_env_specs

from tdcollect.envs import EnvWorkerError, ParallelEnv, SerialEnv

dm_env = pytest.importorskip("dm_env")
from dm_env import specs as dm  # noqa: E402

from tdcollect.envs.libs.dm_env import done_flags, leaf_to_spec  # noqa: E402
from tests.helpers import OnePerProcessEngine  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_leaf_conversion_table():
    spec, offset = leaf_to_spec(dm.BoundedArray((), np.int32, -1, 1))
    assert isinstance(spec, Categorical) and spec.space.n == 3 and spec.dtype == torch.int64
    assert offset == -1
    spec, offset = leaf_to_spec(dm.DiscreteArray(4))
    assert isinstance(spec, Categorical) and spec.space.n == 4 and offset is None
    spec, offset = leaf_to_spec(dm.BoundedArray((2,), np.int64, [0, 1], [3, 5]))
    assert isinstance(spec, MultiCategorical) and spec.nvec.tolist() == [4, 5] and offset.tolist() == [0, 1]
    spec, _ = leaf_to_spec(dm.BoundedArray((3,), np.float32, -2.0, 2.0))
    assert isinstance(spec, Bounded) and spec.dtype == torch.float32 and spec.space.low.tolist() == [-2.0] * 3
    spec, _ = leaf_to_spec(dm.Array((5, 5, 3), np.uint8))
    assert isinstance(spec, Unbounded) and spec.dtype == torch.uint8 and spec.shape == (5, 5, 3)
    spec, _ = leaf_to_spec(dm.Array((2,), np.bool_))
    assert spec.dtype == torch.bool
    with pytest.raises(TypeError, match="text or objects"):
        leaf_to_spec(dm.Array((), object))


def test_done_flags_follow_step_type_and_discount():
    assert done_flags(dm_env.restart({})) == (False, False, False)
    assert done_flags(dm_env.transition(1.0, {})) == (False, False, False)
    assert done_flags(dm_env.termination(1.0, {})) == (True, True, False)
    assert done_flags(dm_env.truncation(1.0, {})) == (True, False, True)


def test_flat_layout_specs_and_check_env_specs():
    with SerialEnv(1, OnePerProcessEngine) as env:
        assert set(env.full_observation_spec.keys(True, True)) == {"pid", "state", ("flags", "even")}
        assert set(env.full_action_spec.keys(True, True)) == {("action", "turn"), ("action", "boost")}
        assert env.full_action_spec["action", "turn"].space.n == 3
        assert env.full_observation_spec["state"].shape == (1, 2)
        assert env.reward_spec.shape == (1, 1) and env.reward_spec.dtype == torch.float32
        check_env_specs(env)


def test_serial_env_cannot_hold_two_engines_and_says_why():
    with pytest.raises(RuntimeError, match="allows one per process"):
        SerialEnv(2, OnePerProcessEngine)


def test_actions_are_shifted_back_and_episodes_end_terminated():
    with SerialEnv(1, functools.partial(OnePerProcessEngine, episode_len=3)) as env:
        td = env.reset()
        outs = []
        for turn in (0, 1, 2):  # Categorical(3) 0, 1, 2 is the engine's -1, 0, 1
            td["action", "turn"] = torch.tensor([turn])
            td["action", "boost"] = torch.tensor([0.5])
            out, td = env.step_and_maybe_reset(td)
            outs.append(out["next"])
        assert [o["state"][0, 1].item() for o in outs] == [-1.0, 0.0, 1.0]
        assert [o["reward"].item() for o in outs] == [-1.0, 0.0, 1.0]
        assert [o["flags", "even"].item() for o in outs] == [False, True, False]
        assert [o["done"].item() for o in outs] == [False, False, True]
        assert outs[-1]["terminated"].item() and not outs[-1]["truncated"].item()
        assert td["state"][0, 0].item() == 0  # auto-reset observation in the next root


def test_truncation_and_values_in_specs(no_leaks):
    factory = functools.partial(OnePerProcessEngine, episode_len=2, truncate=True)
    with ParallelEnv(2, factory) as env:
        td = env.rollout(5, policy=env.rand_action, break_when_any_done=False)
        assert td["next", "truncated"][:, 1].all() and not td["next", "terminated"].any()
        keys = list(env.full_observation_spec.keys(True, True))
        for t in range(5):
            assert env.full_observation_spec.is_in(td["next"][:, t].select(*keys))
            assert env.full_action_spec.is_in(td[:, t].select(*env.action_keys))


def test_one_instance_per_worker_runs_as_n_copies(no_leaks):
    with ParallelEnv(3, OnePerProcessEngine, envs_per_worker=1) as env:
        pids = env.reset()["pid"].tolist()
        assert len(set(pids)) == 3 and set(pids) == set(env.worker_pids)
        check_env_specs(env)


def test_two_per_worker_surfaces_the_engine_error(no_leaks):
    with pytest.raises(EnvWorkerError, match="allows one per process") as info:
        ParallelEnv(2, OnePerProcessEngine, envs_per_worker=2)
    assert info.value.exc_type == "RuntimeError" and "construction" in str(info.value)


def test_dm_env_instance_is_refused_with_the_fix(no_leaks):
    engine = OnePerProcessEngine()
    try:
        with pytest.raises(TypeError, match=r"ParallelEnv\(4, lambda: OnePerProcessEngine\(\.\.\.\)\)"):
            ParallelEnv(2, engine)
    finally:
        engine.close()


def test_seeding_a_plain_dm_env_warns():
    with SerialEnv(1, OnePerProcessEngine) as env:
        env.set_seed(0)
        with pytest.warns(UserWarning, match="no seeding call"):
            env.reset()


def test_envs_does_not_need_dmlab2d(monkeypatch):
    from tdcollect import envs

    monkeypatch.setitem(sys.modules, "dmlab2d", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "tdcollect.envs.libs.dmlab2d", raising=False)
    assert envs.SerialEnv and envs.ParallelEnv
    with pytest.raises(ImportError):
        getattr(envs, "DMLab2dEnv")  # noqa: B009 - the attribute access itself is what is tested


class _ArrayEngine(dm_env.Environment):
    """Single-array observation ``[t, a, 0]`` and a ``DiscreteArray(4)`` action; never ends."""

    def __init__(self):
        self.t = 0

    def reset(self):
        self.t = 0
        return dm_env.restart(np.zeros(3, np.float32))

    def step(self, action):
        self.t += 1
        return dm_env.transition(0.5, np.array([self.t, action, 0], np.float32))

    def observation_spec(self):
        return dm.Array((3,), np.float32)

    def action_spec(self):
        return dm.DiscreteArray(4)


def test_single_array_specs_become_observation_and_action():
    with SerialEnv(2, _ArrayEngine) as env:
        assert set(env.full_observation_spec.keys()) == {"observation"}
        assert env.action_spec.shape == (2,) and env.action_spec.space.n == 4
        td = env.reset()
        td["action"] = torch.tensor([3, 1])
        out = env.step(td)
        assert out["next", "observation"][:, 1].tolist() == [3.0, 1.0]
        assert out["next", "reward"].squeeze(-1).tolist() == [0.5, 0.5]
        check_env_specs(env)
