"""PettingZoo env factories (parallel and AEC) in ParallelEnv / MultiSyncCollector: TorchRL's ``PettingZooWrapper``
layout (agent groups by name, its done keys), the same values as the wrapper alone, an instance refused."""
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.errors import ConstructorError
from tests.helpers import collect_all

butterfly = pytest.importorskip("pettingzoo.butterfly")
from pettingzoo import ParallelEnv as ParallelEnvPZ  # noqa: E402
from pettingzoo.butterfly import knights_archers_zombies_v11, pistonball_v6  # noqa: E402
from pettingzoo.classic import tictactoe_v3  # noqa: E402
from torchrl.envs.libs.pettingzoo import PettingZooWrapper  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:PettingZoo in TorchRL is tested"),
              pytest.mark.filterwarnings("ignore:The old environment creation API")]


def pistons():
    return pistonball_v6.parallel_env(n_pistons=3, max_cycles=30)


def spec_table(env) -> dict:
    specs = (env.full_observation_spec, env.full_action_spec, env.full_reward_spec, env.full_done_spec)
    return {key: (type(spec[key]).__name__, tuple(spec[key].shape[env.batch_dims:]), spec[key].dtype)
            for spec in specs for key in spec.keys(True, True)}


@pytest.mark.parametrize("make", [pistons, lambda: knights_archers_zombies_v11.parallel_env(max_cycles=30),
                                  lambda: tictactoe_v3.env()], ids=["pistonball", "kaz", "tictactoe-aec"])
def test_layout_is_torchrl_pettingzoo_wrappers(make, no_leaks):
    instance = make()
    reference = PettingZooWrapper(instance, use_mask=not isinstance(instance, ParallelEnvPZ))
    env = ParallelEnv(2, make)
    try:
        assert spec_table(env) == spec_table(reference)
        check_env_specs(env)
    finally:
        env.close()
        reference.close()


def test_values_equal_the_wrappers_alone():
    reference = PettingZooWrapper(pistons())
    reference.set_seed(7)
    env = SerialEnv(1, pistons)
    env.set_seed(7)
    try:
        expected = reference.reset()
        td = env.reset()
        assert torch.equal(td[0]["piston", "observation"], expected["piston", "observation"])
        for t in range(25):
            action = reference.full_action_spec.rand()
            expected["piston", "action"] = action["piston", "action"]
            step, expected = reference.step_and_maybe_reset(expected)
            td["piston", "action"] = action["piston", "action"].unsqueeze(0)
            out, td = env.step_and_maybe_reset(td)
            for key in (("piston", "observation"), ("piston", "reward"), "done", ("piston", "truncated")):
                assert torch.equal(out[0]["next", key], step["next", key]), (t, key)
    finally:
        env.close()
        reference.close()


def test_multisync_collector_with_two_agent_groups(no_leaks):
    make = lambda: knights_archers_zombies_v11.parallel_env(max_cycles=30)  # noqa: E731
    for batch in collect_all(make, workers=2, frames_per_batch=20, batches=2):
        assert batch.batch_size == (2, 10)
        for group in ("archer", "knight"):
            assert batch[group, "observation"].shape == (2, 10, 2, 27, 5)
            assert batch["next", group, "reward"].shape == (2, 10, 2, 1)
            assert batch[group, "action"].shape[:3] == (2, 10, 2)


def test_an_instance_is_refused_before_any_process_starts(no_leaks):
    env = pistons()
    try:
        with pytest.raises(ConstructorError, match=r"not an env instance.*lambda: pistonball_v6\.parallel_env\("):
            ParallelEnv(2, env)
    finally:
        env.close()
    aec = tictactoe_v3.env()
    with pytest.raises(ConstructorError, match=r"lambda: tictactoe_v3\.env\("):
        ParallelEnv(2, aec)
