"""MeltingPot substrates: the native factory (``meltingpot.substrate.build``) and TorchRL's ``MeltingpotEnv`` in
ParallelEnv / MultiSyncCollector, on three substrates; the agent-group layout against TorchRL's and against the
raw substrate's values; TorchRL's ``MeltingpotEnv`` on the native road against TorchRL's own ``SerialEnv`` (recorded
timesteps replayed, with mutants); an instance refused before any process starts.

MeltingPot installs with ``python -m tdcollect.envs.libs.meltingpot`` (the README's test command runs it); in CI
(``CI`` set) a missing install fails these tests instead of skipping them.
"""
import copy
import os
import pickle

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
from meltingpot.utils.substrates.substrate import Substrate as MeltingpotSubstrate  # noqa: E402
from torchrl.envs.libs.meltingpot import MeltingpotEnv, MeltingpotWrapper  # noqa: E402

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


# ----------------------------------------------------------------- TorchRL's MeltingpotEnv on the native road
#: substrates of 7 and 2 players, one with vector observations (INVENTORY, INTERACTION_INVENTORIES)
EQUAL_DATA = ["commons_harvest__open", "coins", "running_with_scissors_in_the_matrix__repeated"]
RECORDED_STEPS = 24


class Replay(MeltingpotSubstrate):
    """A MeltingPot ``Substrate`` that replays timesteps recorded from a real one: MeltingPot's episodes differ from
    one build to the next even with ``random`` seeded (its engine's own nondeterminism), so two batched envs see the
    same values only this way. ``reset()`` and ``step()`` return the recorded timesteps in turn, from ``start`` on (a
    reset's as FIRST); the timesteps whose turn is in ``last`` end their episode (LAST, discount 0). The actions
    received are written to ``actions_path`` when it closes."""

    def __init__(self, path: str, start: int, last: set, actions_path: str):  # (no engine: no base __init__)
        with open(path, "rb") as f:
            recorded = pickle.load(f)
        self._specs = recorded["specs"]
        self._timesteps = recorded["timesteps"]
        self._turn = start
        self._last = last
        self._actions: list = []
        self._actions_path = actions_path

    def observation_spec(self):
        return self._specs[0]

    def action_spec(self):
        return self._specs[1]

    def reward_spec(self):
        return self._specs[2]

    def _take(self, step_type, discount) -> dm_env.TimeStep:
        timestep = self._timesteps[self._turn % len(self._timesteps)]
        self._turn += 1
        return timestep._replace(step_type=step_type, discount=discount)

    def reset(self):
        return self._take(dm_env.StepType.FIRST, None)

    def step(self, action):
        self._actions.append([int(a) for a in action])
        ends = self._turn in self._last
        return self._take(dm_env.StepType.LAST if ends else dm_env.StepType.MID, 0.0 if ends else 1.0)

    def close(self):
        with open(self._actions_path, "wb") as f:
            pickle.dump(self._actions, f)


@pytest.fixture(scope="module", params=EQUAL_DATA)
def recording(request, tmp_path_factory):
    """``(name, path)``: the specs and ``RECORDED_STEPS + 1`` timesteps (a reset, then random actions) of a real
    substrate, pickled at ``path``."""
    name = request.param
    env = native(name)
    try:
        specs = (env.observation_spec(), env.action_spec(), env.reward_spec())
        rng = np.random.default_rng(0)
        timesteps = [env.reset()]
        for _ in range(RECORDED_STEPS):
            timesteps.append(env.step(list(rng.integers(0, specs[1][0].num_values, len(specs[1])))))
    finally:
        env.close()
    path = tmp_path_factory.mktemp("meltingpot") / f"{name}.pkl"
    with open(path, "wb") as f:
        pickle.dump({"specs": specs, "timesteps": copy.deepcopy(timesteps)}, f)
    return name, str(path)


def replay_factories(path: str, directory, max_steps: int | None) -> list:
    """Two TorchRL ``MeltingpotWrapper`` constructors over :class:`Replay` s of the recording at ``path``: env 0 from
    the first timestep (episodes ending at its turns 5 and 13), env 1 from the seventh (ending at turn 16)."""
    def make(start: int, last: set, name: str):
        return lambda: MeltingpotWrapper(Replay(path, start, last, str(directory / name)), max_steps=max_steps)

    return [make(0, {5, 13}, "actions0.pkl"), make(7, {16}, "actions1.pkl")]


def stepped(env, actions: torch.Tensor) -> tuple:
    """``(reset's output, stacked step_and_maybe_reset outputs)`` of ``env`` for ``actions`` ``[T, envs, players]``;
    the env is closed."""
    try:
        td = env.reset()
        first = td.clone()
        steps = []
        for action in actions:
            td.set(("agents", "action"), action)
            out, td = env.step_and_maybe_reset(td)
            steps.append(out.clone())
        return first, torch.stack(steps)
    finally:
        env.close()


def assert_same_data(ours, reference) -> None:
    """Every key of both, the same dtype, shape and values."""
    assert set(ours.keys(True, True)) == set(reference.keys(True, True))
    for key in reference.keys(True, True):
        mine, theirs = ours.get(key), reference.get(key)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, key
        assert torch.equal(mine, theirs), key


def received_actions(directory) -> list:
    out = []
    for name in ("actions0.pkl", "actions1.pkl"):
        with open(directory / name, "rb") as f:
            out.append(pickle.load(f))
    return out


def reference_and_actions(path, directory, max_steps):
    """TorchRL's own ``SerialEnv`` over the replays: ``(its data, the actions its substrates received, the actions
    stepped)``."""
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    factories = replay_factories(path, directory, max_steps)
    probe = factories[0]()
    spec = probe.full_action_spec["agents", "action"]
    probe.close()
    steps = RECORDED_STEPS - 6  # (env 1 replays from its seventh timestep, its last reset included)
    actions = torch.randint(0, spec.space.n, (steps, 2, *spec.shape), generator=torch.Generator().manual_seed(1))
    data = stepped(TorchRLSerialEnv(2, factories), actions)
    return data, received_actions(directory), actions


@pytest.mark.parametrize("max_steps", [None, 4], ids=["episode_ends", "max_steps"])
def test_meltingpot_env_native_road_gives_torchrl_data(recording, max_steps, tmp_path, no_leaks):
    """TorchRL's ``MeltingpotEnv`` stepped natively (in ParallelEnv's workers and in SerialEnv) against TorchRL's own
    ``SerialEnv``, over the same recorded timesteps of a real substrate: the reset's and every step's data, every key
    and value, dtypes included, across episode ends (the substrate's own, or ``max_steps``), and the actions that
    reached the substrates."""
    name, path = recording
    (first, steps), reference_actions, actions = reference_and_actions(path, tmp_path, max_steps)
    for batched in (ParallelEnv, SerialEnv):
        env = batched(2, replay_factories(path, tmp_path, max_steps))
        assert all(road.startswith("native") for road in env.roads()), env.roads()
        ours_first, ours_steps = stepped(env, actions)
        assert_same_data(ours_first, first)
        assert_same_data(ours_steps, steps)
        assert received_actions(tmp_path) == reference_actions
    assert steps["next", "done"].any(), "the episodes must end inside the run"


@pytest.mark.parametrize("recording", EQUAL_DATA[:1], indirect=True)
@pytest.mark.parametrize("mutant", ["max_steps_not_counted", "terminated_not_set"])
def test_the_equal_data_check_catches_a_wrong_road(recording, mutant, tmp_path, monkeypatch):
    """The comparison above fails for a road that forgets ``max_steps`` or leaves ``terminated`` unset."""
    from tdcollect.envs.libs.meltingpot import MeltingpotEnvStepper

    name, path = recording
    (first, steps), _, actions = reference_and_actions(path, tmp_path, 4)
    if mutant == "max_steps_not_counted":
        monkeypatch.setattr(MeltingpotEnvStepper, "ended", lambda self, timestep: (timestep.last(),) * 2)
    else:
        monkeypatch.setattr(MeltingpotEnvStepper, "ended", lambda self, timestep: (timestep.last(), False))
    _, ours_steps = stepped(SerialEnv(2, replay_factories(path, tmp_path, 4)), actions)
    with pytest.raises(AssertionError):
        assert_same_data(ours_steps, steps)


def test_a_meltingpot_env_off_the_native_road_says_why(no_leaks):
    """One-hot actions keep TorchRL's step, and ``roads()`` says so."""
    env = SerialEnv(1, lambda: MeltingpotEnv("coins", categorical_actions=False))
    try:
        assert env.roads() == ["TorchRL's step: one-hot actions (categorical_actions=False)"]
        env.rollout(3)
    finally:
        env.close()
