"""ParallelVectorEnv (``tdcollect.envs.vector``): spaces (Dict/Tuple, observation modes, mismatches, unsupported
ones, views, bad actions), env errors that keep their type, dead workers and restarts."""
from __future__ import annotations

import copy
import os
import signal
import time

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces

from tdcollect.envs.engine.errors import EnvWorkerError, WorkerDiedError
from tdcollect.envs.vector import ParallelVectorEnv, SpaceMismatchError
from tests.gym_envs import Blob, EnvError, FailingEnv, SampleEnv, TallyEnv, tallies

pytestmark = pytest.mark.timeout(120)


# ----------------------------------------------------------------- spaces
RICH = spaces.Dict({
    "pos": spaces.Box(-1, 1, (2,), np.float32),
    "pick": spaces.Discrete(5, start=-2),
    "pair": spaces.Tuple((spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3))),
    "img": spaces.Box(0, 255, (3, 4, 3), np.uint8),
    "depth": spaces.Box(0, 60000, (2,), np.uint16),
})


@pytest.mark.parametrize("obs_space, act_space", [
    (RICH, spaces.Dict({"move": spaces.Box(-1, 1, (2,), np.float32), "tool": spaces.Discrete(3, start=1)})),
    (spaces.Tuple((spaces.Discrete(3), spaces.Box(0, 1, (2,), np.float16))),
     spaces.Tuple((spaces.MultiDiscrete([2, 5], dtype=np.uint16), spaces.MultiBinary(2)))),
    (spaces.Discrete(7, start=3), spaces.Discrete(4, start=-1)),
])
def test_spaces_round_trip(obs_space, act_space, no_leaks):
    env = ParallelVectorEnv([lambda: SampleEnv(obs_space, act_space)] * 3, autoreset_mode="SameStep")
    try:
        obs, _ = env.reset(seed=0)
        assert obs in env.observation_space
        env.action_space.seed(0)
        for t in range(1, 7):
            obs, _, terminated, _, info = env.step(env.action_space.sample())
            assert obs in env.observation_space
            if t % 3 == 0:
                assert terminated.all() and all(final in env.single_observation_space for final in info["final_obs"])
        samples = [env.single_action_space.sample() for _ in range(3)]  # a list of per-env actions
        env.step(samples if not isinstance(act_space, spaces.Discrete) else np.array(samples))
    finally:
        env.close()


def test_observation_modes(no_leaks):
    boxes = [spaces.Box(0, high, (2,), np.float32) for high in (1, 2, 3)]
    env = ParallelVectorEnv([lambda b=b: SampleEnv(b) for b in boxes], observation_mode="different")
    try:
        assert env.single_observation_space == boxes[0]
        assert env.observation_space == batch_differing_spaces(boxes)
        env.reset(seed=1)
        assert env.step([0, 1, 2])[0] in env.observation_space
    finally:
        env.close()
    with pytest.raises(SpaceMismatchError, match="observation_mode='different'") as caught:
        ParallelVectorEnv([lambda b=b: SampleEnv(b) for b in boxes])
    assert isinstance(caught.value, RuntimeError)
    custom = (spaces.Box(0, 9, (3, 2), np.float32), spaces.Box(0, 9, (2,), np.float32))
    env = ParallelVectorEnv([lambda b=b: SampleEnv(b) for b in boxes], observation_mode=custom)
    assert (env.observation_space, env.single_observation_space) == custom
    env.close()


@pytest.mark.parametrize("second", [
    lambda: SampleEnv(spaces.Box(0, 1, (3,), np.float32)),  # another shape
    lambda: SampleEnv(spaces.Box(0, 1, (2,), np.float32), spaces.Discrete(4)),  # another action space
])
def test_mismatched_spaces_are_one_error(second, no_leaks):
    with pytest.raises(RuntimeError):
        ParallelVectorEnv([lambda: SampleEnv(spaces.Box(0, 1, (2,), np.float32)), second], observation_mode="different")


def test_a_space_of_the_users_own_in_shared_memory_is_gymnasiums_error(no_leaks):
    with pytest.raises(ValueError, match="Blob") as caught:  # AsyncVectorEnv(shared_memory=True) refuses it too
        ParallelVectorEnv([lambda: SampleEnv(Blob(8))])
    assert "shared_memory=False" in str(caught.value)  # the fix
    with pytest.raises(ValueError, match="Blob"):  # at any depth
        ParallelVectorEnv([lambda: SampleEnv(spaces.Sequence(Blob(8)))])
    # a subclass of one of gymnasium's spaces is gymnasium's, beside a pickled space too
    mixed = spaces.Dict({"word": spaces.Text(3), "pos": BoxOfMine(-1, 1, (2,), np.float32)})
    env = ParallelVectorEnv([lambda: SampleEnv(mixed)] * 2)
    try:
        assert env.reset(seed=0)[0] in env.observation_space
    finally:
        env.close()


class BoxOfMine(spaces.Box):
    """A user's subclass of Box."""


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("obs_space, act_space, shared_memory", [
    (spaces.Text(6), spaces.Text(4, charset="ab"), True),  # what AsyncVectorEnv keeps in shared memory
    (spaces.Dict({"word": spaces.OneOf((spaces.Text(3), spaces.Discrete(4))), "pos": spaces.Box(-1, 1, (2,))}),
     spaces.Discrete(3), True),
    (spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)), spaces.Sequence(spaces.Discrete(4)), False),
    # which AsyncVectorEnv(shared_memory=True) refuses ("dynamic shape"): ours sends them pickled
    (spaces.Graph(spaces.Box(0, 1, (2,)), None), spaces.Sequence(spaces.Box(-1, 1, (2,))), True),
    (Blob(6000), Blob(5000), False),  # large values, both ways
], ids=["text", "dict-oneof", "graph-sequence", "graph-sequence-shared-memory", "own-space"])
def test_spaces_without_buffers_travel_pickled_as_sync_vector_env_gives_them(obs_space, act_space, shared_memory,
                                                                           mode, no_leaks):
    # each env its own spaces (and their generators), as in its own process
    fns = [lambda: SampleEnv(copy.deepcopy(obs_space), copy.deepcopy(act_space))] * 4
    ours = ParallelVectorEnv(fns, shared_memory=shared_memory, autoreset_mode=mode)
    theirs = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert (ours.observation_space, ours.action_space) == (theirs.observation_space, theirs.action_space)
        theirs.action_space.seed(3)
        assert data_equivalence(ours.reset(seed=5), theirs.reset(seed=5))
        for _ in range(7):  # two episode ends (every 3 steps)
            actions = theirs.action_space.sample()
            a, b = ours.step(actions), theirs.step(actions)
            assert data_equivalence(a, b), (a, b)
            if mode == AutoresetMode.DISABLED and a[2].any():
                mask = {"reset_mask": a[2]}
                assert data_equivalence(ours.reset(options=dict(mask)), theirs.reset(options=dict(mask)))
        assert a[0] in ours.observation_space
    finally:
        ours.close()
        theirs.close()


def test_copy_false_gives_views_of_the_buffers(no_leaks):
    env = ParallelVectorEnv(tallies(100, 100), copy=False)
    try:
        obs, _ = env.reset()
        before = env.step([0, 0])[0]
        env.step([0, 0])
        assert before.tolist() == [2, 2]  # overwritten in place by the next step
    finally:
        env.close()


def test_bad_actions_raise_before_anything_is_stepped(no_leaks):
    env = ParallelVectorEnv(tallies(100, 100, 100))
    try:
        env.reset()
        with pytest.raises(ValueError, match=r"shape \(2,\)"):
            env.step([1, 1])
        with pytest.raises(ValueError):
            env.step(np.zeros(4, np.int64))
        with pytest.raises(TypeError, match="scalar"):
            env.step(0)
        with pytest.raises(TypeError, match="non-integer"):
            env.step(np.array([0.5, 1.0, 1.0]))
        assert env.step([1, 1, 1])[0].tolist() == [1, 1, 1]
    finally:
        env.close()


# ----------------------------------------------------------------- errors, dead workers, restarts
@pytest.mark.parametrize("error, types", [("value", (ValueError,)), ("own", (EnvError,)), ("os", (OSError,))])
def test_an_env_exception_keeps_its_type(error, types, no_leaks):
    env = ParallelVectorEnv([lambda: FailingEnv(error)] * 2)
    try:
        env.reset()
        env.step([0, 0])
        with pytest.raises(types) as caught:
            env.step([0, 0])
        worker_error = caught.value if isinstance(caught.value, EnvWorkerError) else caught.value.__cause__
        assert isinstance(worker_error, EnvWorkerError) and "during step" in str(worker_error)
        assert env.reset()[0].tolist() == [0, 0]  # the env is still usable
    finally:
        env.close()


def test_a_dead_worker_is_one_clear_error(no_leaks):
    env = ParallelVectorEnv([lambda: FailingEnv("kill", at=2)] + tallies(100), envs_per_worker=1)
    env.reset()
    env.step([0, 0])
    start = time.perf_counter()
    with pytest.raises(WorkerDiedError, match="worker 0 .*SIGKILL"):
        env.step([0, 0])
    assert time.perf_counter() - start < 10
    with pytest.raises(ClosedEnvironmentError, match="worker died"):
        env.step([0, 0])
    env.close()
    with pytest.raises(ClosedEnvironmentError):
        env.reset()


def step_through_a_restart(env) -> tuple:
    """Reset ``env`` (4 envs, 2 per worker), step it, kill worker 1 and step again: that step's results."""
    env.reset()
    env.step([1] * 4)
    os.kill(env.worker_pids[1], signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        return env.step([1] * 4)


def test_restarts_are_opt_in(no_leaks):
    env = ParallelVectorEnv(tallies(100, 100, 100, 100), envs_per_worker=2, max_restarts=1)
    try:
        obs, _, _, truncated, _ = step_through_a_restart(env)
        assert truncated.tolist() == [False, False, True, True] and obs.tolist() == [2, 2, 0, 0]
        assert env.restarts == [0, 1] and env.get_attr("limit") == (100,) * 4
        obs, rewards, *_ = env.step([1] * 4)  # NEXT_STEP: the truncated envs' reset step
        assert obs.tolist() == [3, 3, 0, 0] and rewards.tolist() == [1, 1, 0, 0]
        assert env.step([1] * 4)[0].tolist() == [4, 4, 1, 1]
    finally:
        env.close()


def test_a_reset_after_a_restart_leaves_no_reset_step_behind(no_leaks):
    # NEXT_STEP: the restarted envs' reset step stands for the reset that follows their truncation; a reset the
    # caller makes first replaces it, and the next step steps every env
    env = ParallelVectorEnv(tallies(100, 100, 100, 100), envs_per_worker=2, max_restarts=1)
    try:
        assert step_through_a_restart(env)[3].tolist() == [False, False, True, True]
        assert env.reset()[0].tolist() == [0, 0, 0, 0]
        obs, rewards, *_ = env.step([1] * 4)
        assert obs.tolist() == [1, 1, 1, 1] and rewards.tolist() == [1, 1, 1, 1]
    finally:
        env.close()


def test_spawned_workers_take_closures(no_leaks):
    limit = 2
    env = ParallelVectorEnv([lambda: TallyEnv(limit)] * 2, context="spawn")
    try:
        env.reset()
        assert env.step([1, 1])[0].tolist() == [1, 1] and env.get_attr("limit") == (2, 2)
    finally:
        env.close()
