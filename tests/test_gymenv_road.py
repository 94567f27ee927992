"""TorchRL's ``GymEnv`` on the native road (``envs/libs/gymenv.py``): the same data as TorchRL's own ``SerialEnv``
of the same constructors (same seeds, same actions), key by key, over a ``step_and_maybe_reset`` loop with episode
ends and a partial reset; the road each env takes; and the options that keep TorchRL's step."""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import EndOfLifeTransform, GymEnv, GymWrapper, NoopResetEnv, StepCounter, TransformedEnv
from torchrl.envs import SerialEnv as TorchRLSerialEnv

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.libs import gymenv, gymenv_transforms

STEPS = 100
PARTIAL_RESET_AT = 57


def gym_env(name: str, **kwargs):
    """TorchRL's ``GymEnv(name, **kwargs)`` (a module-level function: ``functools.partial`` of it pickles)."""
    if name.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    return GymEnv(name, **kwargs)


def transformed_gym_env(name: str, **kwargs):
    """``TransformedEnv(GymEnv(...), [NoopResetEnv, StepCounter])``, as TorchRL's Atari scripts build theirs."""
    return TransformedEnv(gym_env(name, **kwargs), NoopResetEnv(noops=3, random=False)).append_transform(
        StepCounter())


def atari_gym_env(name: str, eol: bool = True, **kwargs):
    """As TorchRL's ``utils_atari.make_base_env``: ``TransformedEnv(GymEnv(...), [NoopResetEnv(30),
    EndOfLifeTransform])`` (without the second, as for its test envs)."""
    env = TransformedEnv(gym_env(name, from_pixels=True, pixels_only=False, frame_skip=4,
                                 categorical_action_encoding=True, **kwargs), NoopResetEnv(noops=30, random=True))
    return env.append_transform(EndOfLifeTransform()) if eol else env


CASES = {
    "cartpole-onehot": functools.partial(gym_env, "CartPole-v1"),
    "cartpole-categorical": functools.partial(gym_env, "CartPole-v1", categorical_action_encoding=True),
    "pendulum": functools.partial(gym_env, "Pendulum-v1", max_episode_steps=30),
    "halfcheetah-skip2": functools.partial(gym_env, "HalfCheetah-v5", frame_skip=2, max_episode_steps=41),
    "pong-pixels-only": functools.partial(gym_env, "ALE/Pong-v5", from_pixels=True, pixels_only=True, frame_skip=4,
                                          max_episode_steps=24),
    "pong-pixels-and-state": functools.partial(gym_env, "ALE/Pong-v5", from_pixels=True, pixels_only=False,
                                               frame_skip=4, max_episode_steps=24),
    "cartpole-transformed": functools.partial(transformed_gym_env, "CartPole-v1"),
    "breakout-noops-end-of-life": functools.partial(atari_gym_env, "ALE/Breakout-v5", max_episode_steps=60),
    "pong-noops": functools.partial(atari_gym_env, "ALE/Pong-v5", eol=False, max_episode_steps=45),
}
NATIVE = set(CASES)  # (Noops and StepCounter too: the noops on the env's road, the step count as a per-env op)
#: the constructors that draw from the torch RNG of the process they run in: 1 worker x 4 envs (see the test)
DRAWING = {"cartpole-transformed", "breakout-noops-end-of-life", "pong-noops"}


def needs(name: str) -> None:
    if name.startswith(("pong", "breakout")):
        pytest.importorskip("ale_py")
    if name.startswith("halfcheetah"):
        pytest.importorskip("mujoco")


def actions_for(env, count: int, seed: int = 0) -> list:
    """``count`` random actions of ``env``'s action spec, from a seeded generator (the same for every env)."""
    torch.manual_seed(seed)
    return [env.full_action_spec.rand() for _ in range(count)]


def run_loop(env, actions: list, seed_this_process: bool = False) -> tuple[TensorDict, TensorDict]:
    """A ``step_and_maybe_reset`` loop over ``actions`` after ``set_seed(0)`` (and ``torch.manual_seed(0)`` here
    with ``seed_this_process``) and a reset, resetting env 1 alone at step ``PARTIAL_RESET_AT``; returns the
    stacked steps and the partial reset's output."""
    env.set_seed(0)
    if seed_this_process:
        torch.manual_seed(0)
    root = env.reset()
    steps = []
    partial = None
    for t, action in enumerate(actions):
        root.update(action)
        stepped, root = env.step_and_maybe_reset(root)
        steps.append(stepped.clone())
        if t == PARTIAL_RESET_AT:
            mask = torch.zeros(env.batch_size[0], 1, dtype=torch.bool)
            mask[1] = True
            partial = env.reset(TensorDict({"_reset": mask}, batch_size=env.batch_size)).clone()
            root = root.clone()
            root[1].update_(partial[1].exclude("_reset"))  # the reset env's new state, the others' as they were
    return torch.stack(steps), partial


def assert_same(ours: TensorDict, theirs: TensorDict, what: str) -> None:
    ours_keys = set(ours.keys(True, True))
    theirs_keys = set(theirs.keys(True, True))
    assert ours_keys == theirs_keys, f"{what}: keys differ: {ours_keys ^ theirs_keys}"
    for key in sorted(theirs_keys, key=str):
        a = ours.get(key)
        b = theirs.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what} {key}: {a.dtype} {a.shape} != {b.dtype} {b.shape}"
        assert torch.equal(a, b), f"{what} {key}: values differ at {torch.nonzero(a != b)[:5].tolist()}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_native_road_gives_torchrls_data(name, no_leaks):
    """2 workers x 2 envs against TorchRL's SerialEnv of 4; the transformed constructor, whose ``NoopResetEnv``
    draws random actions from its process's torch RNG, as 1 worker x 4 envs: its worker's RNG is seeded by
    ``set_seed`` with the first env's seed, the main process's RNG here the same way (TorchRL's SerialEnv draws
    from it in env order, as the worker does)."""
    needs(name)
    make = CASES[name]
    workers = 1 if name in DRAWING else 2
    theirs_env = TorchRLSerialEnv(4, make)
    try:
        actions = actions_for(theirs_env, STEPS)
        theirs, theirs_partial = run_loop(theirs_env, actions, seed_this_process=True)
    finally:
        theirs_env.close()
    with ParallelEnv(workers, make, envs_per_worker=4 // workers) as env:
        roads = env.roads()
        assert env.full_action_spec == theirs_env.full_action_spec.cpu()
        assert env.full_observation_spec == theirs_env.full_observation_spec.cpu()
        ours, ours_partial = run_loop(env, actions)
    assert all(road.startswith("native") == (name in NATIVE) for road in roads), roads
    assert theirs["next", "done"].any(), "no episode ended: the loop must cross an episode's end"
    if "end-of-life" in theirs["next"].keys():
        lost = theirs["next", "end-of-life"] & ~theirs["next", "done"]
        assert lost.any(), "no life was lost inside an episode: the loop must cross one"
    assert_same(ours, theirs, name)
    assert_same(ours_partial[1], theirs_partial[1], f"{name}, partial reset")


def test_an_end_of_life_transform_without_lives_keeps_torchrls_step():
    """An env without ``unwrapped.ale.lives``: TorchRL's step (which raises as TorchRL does when it reads them)."""
    env = TransformedEnv(GymEnv("CartPole-v1"), EndOfLifeTransform())
    try:
        assert "EndOfLifeTransform finds no lives" in gymenv_transforms.why_not_native(env)
    finally:
        env.close()


def test_serial_env_and_a_rollout_take_the_same_road():
    make = CASES["cartpole-onehot"]
    with SerialEnv(3, make) as serial, ParallelEnv(3, make) as parallel:
        assert serial.roads() == parallel.roads() == [gymenv.NATIVE] * 3
        serial.set_seed(5)
        parallel.set_seed(5)
        torch.manual_seed(1)
        a = serial.rollout(60, break_when_any_done=False)
        torch.manual_seed(1)
        b = parallel.rollout(60, break_when_any_done=False)
    assert_same(a, b, "rollout")


class RecordingWrapper(GymWrapper):
    """A GymWrapper subclass (it may step in its own way): TorchRL's step."""


def info_reading_env():
    from torchrl.envs.gym_like import default_info_dict_reader

    env = GymEnv("CartPole-v1")
    env.set_info_dict_reader(default_info_dict_reader(["x"]))
    return env


def wrapped_subclass():
    return RecordingWrapper(gym.make("CartPole-v1"))


@pytest.mark.parametrize("make, reason", [
    (info_reading_env, "info dict reader"),
    (wrapped_subclass, "subclass of GymWrapper"),
    (lambda: GymEnv("CartPole-v1", num_envs=2).base_env, "batched"),
])
def test_what_the_road_does_not_cover_keeps_torchrls_step(make, reason):
    env = make()
    try:
        assert reason in gymenv.why_not_native(env)
    finally:
        env.close()


def test_an_env_outside_the_road_keeps_torchrls_step_in_the_workers():
    with ParallelEnv(2, wrapped_subclass) as env:
        roads = env.roads()
        env.set_seed(0)
        ours = env.rollout(30, break_when_any_done=False)
    assert all(road.startswith("TorchRL's step: RecordingWrapper is a subclass") for road in roads), roads
    assert ours["next", "reward"].shape == (2, 30, 1)


def test_a_gymnasium_env_takes_its_familys_stepper():
    with SerialEnv(2, lambda: gym.make("CartPole-v1")) as env:
        assert env.roads() == ["its family's stepper"] * 2


class BadRewardEnv(gym.Env):
    """Returns a reward of None on its third step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), (None if self.t == 3 else 1.0), False, False, {}


@pytest.mark.parametrize("frame_skip", [1, 2])
def test_a_bad_value_is_a_clear_error_naming_the_env(frame_skip, no_leaks):
    with ParallelEnv(2, lambda: GymWrapper(BadRewardEnv(), frame_skip=frame_skip)) as env:
        assert env.roads()[0] == gymenv.NATIVE
        env.reset()
        with pytest.raises(Exception, match="reward") as raised:
            for _ in range(4):
                env.rand_step()
    assert "None" in str(raised.value)


class TorchRLRoadGymEnv(GymEnv):
    """TorchRL's ``GymEnv`` as it is, but a subclass: it keeps TorchRL's step (the road before the native one)."""


def native_cartpole():
    return GymEnv("CartPole-v1")


def torchrl_road_cartpole():
    return TorchRLRoadGymEnv("CartPole-v1")


def test_a_collector_of_gymenv_constructors_takes_the_native_road_with_the_same_batches(no_leaks):
    from tdcollect.collectors import MultiSyncCollector

    batches = {}
    for make in (native_cartpole, torchrl_road_cartpole):
        collector = MultiSyncCollector([make] * 2, None, frames_per_batch=64, total_frames=192)
        collector.set_seed(3)
        batches[make.__name__] = [batch.clone() for batch in collector]
        collector.shutdown()
    assert len(batches["native_cartpole"]) == 3
    for ours, theirs in zip(batches["native_cartpole"], batches["torchrl_road_cartpole"]):
        assert_same(ours.exclude("collector"), theirs.exclude("collector"), "collector batch")
