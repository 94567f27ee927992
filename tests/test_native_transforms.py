"""The worker transforms with an engine-native version (``envs/transforms/native.py``: ``InitTracker``,
``StepCounter``, ``DoubleToFloat``, ``RewardSum``, the four of TorchRL's SAC scripts) give TorchRL's own data: a
``ParallelEnv`` with ``worker_transform`` against TorchRL's ``TransformedEnv(SerialEnv(...))`` of the same
constructors, same seeds, same actions, key by key, over a ``step_and_maybe_reset`` loop with episode ends and a
partial reset; the same loop with the transforms on TorchRL's road in the workers; which road a transform takes."""
from __future__ import annotations

import functools

import pytest
import torch
from torchrl.envs import CatFrames, Compose, DoubleToFloat, TransformedEnv
from torchrl.envs import SerialEnv as TorchRLSerialEnv
from torchrl.envs.transforms import InitTracker, RewardSum, StepCounter

from tdcollect.envs import ParallelEnv
from tdcollect.envs.engine.group import EnvGroup
from tdcollect.envs.libs import registered
from tdcollect.envs.transforms.native import NativeTransformedGroup, why_not_native
from tdcollect.envs.worker_transforms import TransformedGroup, WorkerTransform
from tests.test_gymenv_road import actions_for, assert_same, atari_gym_env, gym_env, run_loop
from tests.test_worker_transforms import atari_transforms, torchvision_for_resize  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(180)


class TorchRLRewardSum(RewardSum):
    """TorchRL's ``RewardSum`` under another name: no native version, so the worker keeps TorchRL's road."""


def sac_transforms(max_steps=None):
    """TorchRL's SAC scripts' transforms, in their order (the scripts pass ``max_episode_steps`` to
    ``StepCounter``)."""
    return Compose(InitTracker(), StepCounter(max_steps), DoubleToFloat(), RewardSum())


def sac_transforms_torchrl_road(max_steps=None):
    return Compose(InitTracker(), StepCounter(max_steps), DoubleToFloat(), TorchRLRewardSum())


CASES = {
    "halfcheetah-float64": functools.partial(gym_env, "HalfCheetah-v4", max_episode_steps=30),
    "pendulum-float32": functools.partial(gym_env, "Pendulum-v1", max_episode_steps=30),
}


def needs(name: str) -> None:
    if name.startswith("halfcheetah"):
        pytest.importorskip("mujoco")


#: StepCounter's max_steps: none; the env's own limit (both end the episode at the same step); one before it (the
#: counter truncates, and the worker resets, envs that had not ended)
MAX_STEPS = {"none": None, "at-the-limit": 30, "before-the-limit": 17}


@pytest.mark.parametrize("max_steps", list(MAX_STEPS))
@pytest.mark.parametrize("road", ["native", "torchrl"])
@pytest.mark.parametrize("name", list(CASES))
def test_worker_transforms_give_torchrls_data(name, road, max_steps, no_leaks):
    needs(name)
    make = CASES[name]
    limit = MAX_STEPS[max_steps]
    theirs_env = TransformedEnv(TorchRLSerialEnv(4, make), sac_transforms(limit))
    try:
        actions = actions_for(theirs_env, 100)
        theirs, theirs_partial = run_loop(theirs_env, actions)
    finally:
        theirs_env.close()
    transforms = functools.partial(sac_transforms if road == "native" else sac_transforms_torchrl_road, limit)
    with ParallelEnv(2, make, envs_per_worker=2, worker_transform=transforms) as env:
        assert env.full_observation_spec == theirs_env.full_observation_spec.cpu()
        assert env.full_action_spec == theirs_env.full_action_spec.cpu()
        assert env.full_reward_spec == theirs_env.full_reward_spec.cpu()
        ours, ours_partial = run_loop(env, actions)
    assert theirs["next", "done"].any(), "no episode ended: the loop must cross an episode's end"
    assert theirs["next", "episode_reward"].abs().sum() > 0 and theirs["next", "step_count"].max() > 5
    assert_same(ours, theirs, f"{name} ({road}) steps")
    assert_same(ours_partial, theirs_partial, f"{name} ({road}) partial reset")


def group_of(make, transform):
    """The group a worker of 2 envs of ``make`` would step under ``transform``, built here."""
    group = EnvGroup([make, make], "ParallelEnv", registered())
    return WorkerTransform(transform, "ParallelEnv")(group)


def test_the_native_road_is_taken_where_it_covers_the_transforms():
    make = CASES["pendulum-float32"]
    for transform, native in [(sac_transforms(), True), (Compose(StepCounter(), RewardSum()), True),
                              (sac_transforms_torchrl_road(), False), (StepCounter(max_steps=10), True),
                              (Compose(StepCounter(), StepCounter(step_count_key="steps")), False)]:
        group = group_of(make, transform)
        try:
            assert isinstance(group, NativeTransformedGroup if native else TransformedGroup), transform
        finally:
            group.close()


def ppo_atari_transforms(max_steps: int = 40):
    """TorchRL's PPO-Atari transforms that run per env (``utils_atari.make_parallel_env``'s, ``VecNorm`` left out:
    its statistics span the envs), with a ``StepCounter`` that truncates some episodes."""
    transforms = atari_transforms()[:-1]
    transforms[6] = StepCounter(max_steps=max_steps)
    return Compose(*transforms)


ATARI = functools.partial(atari_gym_env, "ALE/Breakout-v5", max_episode_steps=70)


@pytest.mark.timeout(300)
def test_the_ppo_atari_transforms_give_torchrls_data(no_leaks):
    """TorchRL's PPO-Atari env (``make_base_env``: Breakout from pixels under ``NoopResetEnv`` and
    ``EndOfLifeTransform``) under its pixel transforms, all native in the worker, against TorchRL's own
    ``TransformedEnv(SerialEnv(...))``: 1 worker x 4 envs (the noops draw from the worker's torch RNG, seeded by
    ``set_seed`` as this process's is here), 100 steps with episode ends, lives lost, ``StepCounter`` truncations
    and a partial reset."""
    pytest.importorskip("ale_py")
    theirs_env = TransformedEnv(TorchRLSerialEnv(4, ATARI), ppo_atari_transforms())
    try:
        actions = actions_for(theirs_env, 100)
        theirs, theirs_partial = run_loop(theirs_env, actions, seed_this_process=True)
    finally:
        theirs_env.close()
    with ParallelEnv(1, ATARI, envs_per_worker=4, worker_transform=ppo_atari_transforms) as env:
        assert env.full_observation_spec == theirs_env.full_observation_spec.cpu()
        assert all(road.startswith("native") for road in env.roads()), env.roads()
        ours, ours_partial = run_loop(env, actions)
    nxt = theirs["next"]
    assert nxt["done"].any() and (nxt["step_count"] == 40).any(), "episode ends and truncations are needed"
    assert (nxt["end-of-life"] & ~nxt["done"]).any(), "a life lost inside an episode is needed"
    assert_same(ours, theirs, "PPO-Atari transforms, steps")
    assert_same(ours_partial, theirs_partial, "PPO-Atari transforms, partial reset")


def test_the_ppo_atari_transforms_take_the_native_road():
    pytest.importorskip("ale_py")
    group = group_of(ATARI, ppo_atari_transforms())
    try:
        assert isinstance(group, NativeTransformedGroup)
    finally:
        group.close()


@pytest.mark.parametrize("transform, reason", [
    (lambda: StepCounter(step_count_key="steps"), "step_count_key"),
    (lambda: Compose(StepCounter(), StepCounter(step_count_key="steps")), "step_count_key"),
    (lambda: InitTracker(init_key="first"), "init_key"),
    (lambda: Compose(InitTracker(), TorchRLRewardSum()), "TorchRLRewardSum has no native version"),
    (lambda: RewardSum(in_keys=["reward"], out_keys=["ret"]), "RewardSum with other keys"),
    (lambda: CatFrames(N=2, dim=-1, in_keys=["observation"], padding="constant"), "padding='same'"),
    (lambda: Compose(DoubleToFloat(), CatFrames(N=2, dim=-1, in_keys=["observation"])), "after DoubleToFloat"),
])
def test_why_not_native_names_the_reason(transform, reason):
    needs("halfcheetah-float64")
    make = CASES["halfcheetah-float64"]  # (float64 observations: what DoubleToFloat casts)
    transform = transform()
    group = EnvGroup([make], "ParallelEnv", registered())
    transformed = TransformedGroup(group, transform, "ParallelEnv")
    try:
        found = why_not_native(transform, group.specs, transformed.specs)
    finally:
        transformed.close()
    assert found is not None and reason in found, found


def test_a_transform_after_doubletofloat_is_native_where_it_reads_nothing_cast():
    """On float32 observations ``DoubleToFloat`` casts nothing: a ``CatFrames`` after it runs natively."""
    make = CASES["pendulum-float32"]
    transform = Compose(DoubleToFloat(), CatFrames(N=2, dim=-1, in_keys=["observation"]))
    group = EnvGroup([make], "ParallelEnv", registered())
    transformed = TransformedGroup(group, transform, "ParallelEnv")
    try:
        assert why_not_native(transform, group.specs, transformed.specs) is None
    finally:
        transformed.close()


def test_a_native_worker_transform_steps_in_a_collector(no_leaks):
    """A collector's workers (one-env ParallelEnvs of its constructors) with the transforms moved into them."""
    from tdcollect.collectors import MultiSyncCollector

    make = CASES["pendulum-float32"]

    def make_env():
        return ParallelEnv(1, make, envs_per_worker=2, worker_transform=sac_transforms)

    collector = MultiSyncCollector([make_env, make_env], None, frames_per_batch=80, total_frames=160)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    batch = batches[-1]
    assert batch["next", "step_count"].max() > 10
    count, nxt = batch["step_count"], batch["next", "step_count"]
    assert torch.equal(nxt, count + 1)
    ended = batch["next", "done"]
    assert ended.any() and (batch["next", "episode_reward"] != 0).all()


def test_move_transforms_to_workers_returns_the_parallel_env_when_every_transform_moves(no_leaks):
    """TorchRL's SAC pipeline shape: ``TransformedEnv(ParallelEnv(...), the four)``; all four move (natively), so the
    ParallelEnv itself comes back, with TorchRL's transformed specs and data."""
    from tdcollect.envs import move_transforms_to_workers

    make = CASES["pendulum-float32"]
    theirs_env = TransformedEnv(TorchRLSerialEnv(4, make), sac_transforms(17))
    try:
        actions = actions_for(theirs_env, 40)
        theirs, _ = run_loop(theirs_env, actions)
    finally:
        theirs_env.close()
    moved = move_transforms_to_workers(TransformedEnv(ParallelEnv(2, make, envs_per_worker=2), sac_transforms(17)))
    try:
        assert isinstance(moved, ParallelEnv) and moved.worker_transform is not None
        assert moved.full_observation_spec == theirs_env.full_observation_spec.cpu()
        ours, _ = run_loop(moved, actions)
    finally:
        moved.close()
    assert_same(ours, theirs, "moved SAC transforms")
