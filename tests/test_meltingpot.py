"""MeltingPot substrates: the native factory (``meltingpot.substrate.build``) and TorchRL's ``MeltingpotEnv`` in
ParallelEnv / MultiSyncCollector, on three substrates; the agent-group layout against TorchRL's and against the
raw substrate's values; an instance refused before any process starts.

MeltingPot installs with ``python -m tdcollect.envs.meltingpot_install`` (the README's test command runs it); in CI
(``CI`` set) a missing install fails these tests instead of skipping them.
"""
import os
import random

import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.errors import ConstructorError
from tests.helpers import collect_all

if os.environ.get("CI"):
    import meltingpot.substrate as substrate
else:
    substrate = pytest.importorskip("meltingpot.substrate")
from torchrl.envs.libs.meltingpot import MeltingpotEnv  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SUBSTRATES = ["commons_harvest__open", "clean_up", "coins"]


def native(name: str, seed: int | None = None):
    """A substrate as MeltingPot builds it; ``seed`` fixes its episodes (MeltingPot draws their seeds from
    Python's ``random`` and its resets from numpy's global generator)."""
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed)
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


@pytest.mark.parametrize("name", SUBSTRATES)
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


def test_values_are_the_substrates_own():
    """A seeded substrate stepped by hand, then the same substrate through SerialEnv: the same values. (MeltingPot
    draws from the global generators while it runs, so the two runs take turns rather than interleave.)"""
    name, steps = "coins", 12
    raw = native(name, seed=3)
    players = len(raw.action_spec())
    actions = np.random.default_rng(0).integers(0, raw.action_spec()[0].num_values, size=(steps, players))
    timesteps = [raw.reset()] + [raw.step(list(actions[t])) for t in range(steps)]
    raw.close()
    env = SerialEnv(1, lambda: native(name, seed=3))
    try:
        td = env.reset()
        _check_observation(td[0], timesteps[0])
        for t, timestep in enumerate(timesteps[1:]):
            td["agents", "action"] = torch.as_tensor(actions[t]).unsqueeze(0)
            out, td = env.step_and_maybe_reset(td)
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


@pytest.mark.parametrize("name", SUBSTRATES)
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
