"""DMLab2dEnv on the real engine (commons_harvest, 1 and 3 players): specs, values, batching, factory errors."""
import pytest
import torch
from torchrl.data import Categorical
from torchrl.envs.utils import check_env_specs

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.group import seed_chain

dmlab2d = pytest.importorskip("dmlab2d")
from tdcollect.envs import DMLab2dEnv  # noqa: E402

pytestmark = pytest.mark.timeout(60)
LEVEL = "commons_harvest"
# small observations keep the tests quick; the default exposes every non-text observation
LIGHT = ["RGB", "POSITION", "WORLD.ZAP_COUNT"]


def level(players=3, **settings):
    return DMLab2dEnv(LEVEL, settings={"numPlayers": players, **settings}, observation_names=LIGHT)


@pytest.mark.parametrize("players", [1, 3])
def test_spec_shapes(players):
    env = DMLab2dEnv(LEVEL, settings={"numPlayers": players})
    try:
        obs = env.full_observation_spec
        assert obs["agents"].shape == (players,)
        assert obs["agents", "RGB"].shape == (players, 88, 88, 3) and obs["agents", "RGB"].dtype == torch.uint8
        assert obs["agents", "POSITION"].shape == (players, 2)
        assert obs["agents", "LAYER"].shape == (players, 11, 11, 4)
        assert obs["WORLD.RGB"].shape == (208, 224, 3)
        assert "GLOBAL.TEXT" not in obs.keys() and "REWARD" not in obs["agents"].keys()
        act = env.full_action_spec
        assert set(act.keys(True, True)) == {("agents", "action", k) for k in ("move", "turn", "zap")}
        for key, n in (("move", 5), ("turn", 3), ("zap", 2)):
            spec = act["agents", "action", key]
            assert isinstance(spec, Categorical) and spec.space.n == n and spec.shape == (players,)
        assert env.reward_keys == [("agents", "reward")]
        assert env.full_reward_spec["agents", "reward"].shape == (players, 1)
        for key in ("done", "terminated", "truncated"):
            assert env.full_done_spec[key].shape == (1,) and env.full_done_spec[key].dtype == torch.bool
        assert env.num_players == players
    finally:
        env.close()


@pytest.mark.parametrize("players", [1, 3])
def test_check_env_specs_alone(players):
    env = DMLab2dEnv(LEVEL, settings={"numPlayers": players}, seed=0)
    check_env_specs(env)
    env.close()


def test_rollout_values_lie_in_specs_and_episodes_terminate():
    env = level(3, episodeLengthFrames=6)
    env.set_seed(1)
    td = env.rollout(8, break_when_any_done=False)
    assert td.batch_size == (8,)
    for t in range(8):
        assert env.full_observation_spec.is_in(td["next"][t].select(*env.full_observation_spec.keys(True, True)))
        assert env.full_action_spec.is_in(td[t].select(*env.action_keys))
    assert td["next", "done"].squeeze(-1).tolist() == [False] * 5 + [True, False, False]
    assert td["next", "terminated"][5].item() and not td["next", "truncated"].any()
    env.close()


def test_rewards_per_player_match_the_engine():
    env = level(3)
    env.set_seed(0)
    dm = env.dm_env
    td = env.reset()
    seen = torch.zeros(3)
    for _ in range(150):
        td = env.rand_action(td)
        out, td = env.step_and_maybe_reset(td)
        reward = out["next", "agents", "reward"]
        assert reward.shape == (3, 1) and reward.dtype == torch.float32
        engine = [float(dm.observation()[f"{p}.REWARD"]) for p in (1, 2, 3)]
        assert reward.squeeze(-1).tolist() == engine
        seen += reward.squeeze(-1).abs()
    assert (seen > 0).sum() >= 1, "random play in commons_harvest should earn some reward in 150 steps"
    env.close()


def test_observation_names_select_and_validate():
    env = DMLab2dEnv(LEVEL, settings={"numPlayers": 2}, observation_names=["RGB", "WORLD.RGB"])
    assert set(env.full_observation_spec.keys(True, True)) == {("agents", "RGB"), "WORLD.RGB"}
    assert env.full_reward_spec["agents", "reward"].shape == (2, 1)  # rewards whatever is selected
    env.close()
    with pytest.raises(ValueError, match="no observation 'NOPE'"):
        DMLab2dEnv(LEVEL, observation_names=["NOPE"])
    with pytest.raises(ValueError, match="text observations"):
        DMLab2dEnv(LEVEL, observation_names=["GLOBAL.TEXT"])
    with pytest.raises(ValueError, match="could not build level"):
        DMLab2dEnv(LEVEL, settings={"notASetting": 1})


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_check_env_specs_batched(kind, no_leaks):
    make = (lambda: SerialEnv(2, level)) if kind == "serial" else (lambda: ParallelEnv(2, level))
    with make() as env:
        assert env.full_observation_spec["agents", "RGB"].shape == (2, 3, 88, 88, 3)
        assert env.full_action_spec["agents", "action", "move"].shape == (2, 3)
        assert env.full_reward_spec["agents", "reward"].shape == (2, 3, 1)
        check_env_specs(env)
        td = env.rollout(10, break_when_any_done=False)
        assert td["agents", "RGB"].shape == (2, 10, 3, 88, 88, 3)
        assert td["next", "agents", "reward"].shape == (2, 10, 3, 1)
        assert td["agents", "action", "turn"].unique().numel() > 1, "random actions should vary"


def test_parallel_equals_the_env_stepped_alone(no_leaks):
    """Workers step the engine directly (LevelStepper), skipping EnvBase.step: the data must not change."""
    with ParallelEnv(2, level, envs_per_worker=1) as env:
        env.set_seed(7)  # env 0 gets 7, env 1 the next seed of TorchRL's chain
        torch.manual_seed(0)
        batched = env.rollout(12, policy=env.rand_action, break_when_any_done=False)
    alone = level()
    alone.set_seed(seed_chain(7, 2)[1])
    td = alone.reset()
    for t in range(12):
        td.update(batched[1, t].select(*alone.action_keys))
        out, td = alone.step_and_maybe_reset(td)
        assert (out["next"] == batched[1, t]["next"]).all()
    alone.close()


def test_one_player_uses_the_same_layout(no_leaks):
    with ParallelEnv(2, lambda: DMLab2dEnv(LEVEL, observation_names=["RGB"])) as env:
        td = env.rollout(5, policy=env.rand_action, break_when_any_done=False)
        assert td["next", "agents", "RGB"].shape == (2, 5, 1, 88, 88, 3)
        assert td["next", "agents", "reward"].shape == (2, 5, 1, 1)


def test_instances_are_refused_with_the_fix(no_leaks):
    env = level()
    try:
        with pytest.raises(TypeError, match=r"ParallelEnv\(4, lambda: DMLab2dEnv\(\.\.\.\)\)"):
            ParallelEnv(2, env)
        with pytest.raises(TypeError, match=r"SerialEnv\(4, lambda: DMLab2dEnv\(\.\.\.\)\)"):
            SerialEnv(2, env)
    finally:
        env.close()
    lab = dmlab2d.Lab2d(dmlab2d.runfiles_helper.find(), {"levelName": LEVEL})
    with pytest.raises(TypeError, match=r"not an env instance \(got a Lab2d object\).*lambda: Lab2d\(\.\.\.\)"):
        ParallelEnv(2, lab)
    raw = dmlab2d.Environment(lab, ["1.RGB"])
    with pytest.raises(TypeError, match="lambda: Environment"):
        ParallelEnv(2, raw)


def test_raw_dmlab2d_environment_factory(no_leaks):
    """A factory returning the engine's own dm_env object works too (flat layout: keys are engine names)."""

    def make():
        lab = dmlab2d.Lab2d(dmlab2d.runfiles_helper.find(), {"levelName": LEVEL, "numPlayers": "2"})
        return dmlab2d.Environment(lab, ["1.POSITION", "2.POSITION", "WORLD.ZAP_COUNT"])

    with ParallelEnv(2, make) as env:
        assert set(env.full_action_spec.keys(True, True)) == {
            ("action", f"{p}.{a}") for p in (1, 2) for a in ("move", "turn", "zap")
        }
        assert env.full_observation_spec["1.POSITION"].shape == (2, 2)
        check_env_specs(env)
