"""MeltingPot substrates: the native factory (``meltingpot.substrate.build``) and TorchRL's ``MeltingpotEnv`` in
ParallelEnv / MultiSyncCollector, on three substrates; the agent-group layout against TorchRL's and against the
raw substrate's values; an instance refused before any process starts.

MeltingPot installs with ``python -m tdcollect.envs.libs.meltingpot`` (the README's test command runs it); in CI
(``CI`` set) a missing install fails these tests instead of skipping them.
"""
import copy
import os

import dm_env
import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.errors import ConstructorError
from tests.helpers import collect_all

if os.environ.get("CI"):
    import meltingpot.substrate as substrate
else:
    substrate = pytest.importorskip("meltingpot.substrate")
from torchrl.envs.libs.meltingpot import MeltingpotEnv  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SUBSTRATES = ["commons_harvest__open", "clean_up", "coins"]
#: the substrates after the first run in the long tier (``-m long``, run by CI)
TIERED = [pytest.param(name, marks=pytest.mark.long) if i else name for i, name in enumerate(SUBSTRATES)]


def native(name: str):
    """A substrate as MeltingPot builds it."""
    return substrate.build(name, roles=substrate.get_config(name).default_player_roles)


def spec_table(env) -> dict:
    """``{key: (spec class, shape without batch dims, dtype, n for categorical)}`` for observations, actions and
    rewards."""
    table = {}
    for spec in (env.full_observation_spec, env.full_action_spec, env.full_reward_spec):
        for key in spec.keys(True, True):
            leaf = spec[key]
            space_n = getattr(leaf.space, "n", None)
            table[key] = (type(leaf).__name__, tuple(leaf.shape[env.batch_dims:]), leaf.dtype, space_n)
    return table


@pytest.mark.parametrize("name", TIERED)
def test_native_factory_has_torchrl_meltingpot_layout(name, no_leaks):
    reference = MeltingpotEnv(name)
    env = ParallelEnv(2, lambda: native(name))
    try:
        assert spec_table(env) == spec_table(reference)
        players = reference.full_action_spec["agents", "action"].shape[0]
        assert env.full_observation_spec["agents"].shape == (2, players)
        assert set(env.done_keys) >= set(reference.done_keys)
        check_env_specs(env)
    finally:
        env.close()
        reference.close()


class Recording(dm_env.Environment):
    """A substrate that keeps a copy of every timestep it returns (MeltingPot cannot be seeded reliably, so the values
    are compared with what the very env returned)."""

    def __init__(self, env, record: list, actions: list):
        self.env, self.record, self.actions = env, record, actions

    def observation_spec(self):
        return self.env.observation_spec()

    def action_spec(self):
        return self.env.action_spec()

    def reward_spec(self):
        return self.env.reward_spec()

    def reset(self):
        self.record.append(copy.deepcopy(self.env.reset()))
        return self.record[-1]

    def step(self, action):
        self.actions.append(list(action))
        self.record.append(copy.deepcopy(self.env.step(action)))
        return self.record[-1]

    def close(self):
        self.env.close()


def test_values_are_the_substrates_own():
    """Through SerialEnv (in this process), every value written is the one the substrate returned: observations of
    every player, the world view, rewards and the done flag, for 12 steps of given actions."""
    name, steps, record, actions_taken = "coins", 12, [], []
    env = SerialEnv(1, lambda: Recording(native(name), record, actions_taken))
    try:
        td = env.reset()
        _check_observation(td[0], record[-1])
        spec = env.full_action_spec["agents", "action"]
        players = spec.shape[-1]
        actions = np.random.default_rng(0).integers(0, spec.space.n, size=(steps, players))
        for t in range(steps):
            td["agents", "action"] = torch.as_tensor(actions[t]).unsqueeze(0)
            out, td = env.step_and_maybe_reset(td)
            timestep = record[-1] if not out[0]["next", "done"] else record[-2]
            assert [int(a) for a in actions_taken[-1]] == actions[t].tolist()  # the actions reached the engine
            nxt = out[0]["next"]
            _check_observation(nxt, timestep)
            reward = torch.as_tensor(np.stack(timestep.reward)).reshape(players, 1)
            assert torch.equal(nxt["agents", "reward"], reward)
            assert bool(nxt["done"]) == timestep.last()
    finally:
        env.close()


def _check_observation(td, timestep):
    for p, observation in enumerate(timestep.observation):
        for name, value in observation.items():
            if name.startswith("WORLD."):
                got = td[name[len("WORLD."):]]
            else:
                got = td["agents", "observation", name][p]
            assert torch.equal(got, torch.as_tensor(np.asarray(value)).reshape(got.shape)), name


@pytest.mark.parametrize("name", TIERED)
@pytest.mark.parametrize("form", ["native", "torchrl"])
def test_multisync_collector_batches(name, form, no_leaks):
    make = (lambda: native(name)) if form == "native" else (lambda: MeltingpotEnv(name))
    for batch in collect_all(make, workers=2, frames_per_batch=16, batches=2):
        assert batch.batch_size == (2, 8)
        players = batch["agents", "action"].shape[-1]
        assert batch["next", "agents", "reward"].shape == (2, 8, players, 1)
        assert batch["agents", "observation", "RGB"].shape == (2, 8, players, 88, 88, 3)
        assert batch["RGB"].dtype == torch.uint8 and batch["RGB"].shape[:2] == (2, 8)
        actions = batch["agents", "action"]
        assert int(actions.min()) >= 0 and int(actions.max()) < len(substrate.get_config(name).action_set)
        assert batch["collector", "traj_ids"].shape == (2, 8)
        # random actions move the agents: the observations change along time
        rgb = batch["agents", "observation", "RGB"]
        assert not torch.equal(rgb[:, 0], rgb[:, -1])


def test_an_instance_is_refused_before_any_process_starts(no_leaks):
    env = native("coins")
    try:
        with pytest.raises(ConstructorError, match=r"instance.*Substrate.*lambda: meltingpot\.substrate\.build"):
            ParallelEnv(2, env)
        with pytest.raises(ConstructorError, match="not an env instance"):
            MultiSyncCollector([env] * 2, frames_per_batch=8, total_frames=8)
    finally:
        env.close()
