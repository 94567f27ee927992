"""ParallelVectorEnv (``tdcollect.envs.vector``) as gymnasium's vector-env users rely on it: the three autoreset
modes, partial resets, seeding, infos, ``call``/``get_attr``/``set_attr``, the async call order and timeouts, and
equality with gymnasium's own ``SyncVectorEnv`` (spaces and errors: ``test_vector_gym_spaces.py``)."""
from __future__ import annotations

import functools
import multiprocessing
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from tdcollect.envs.vector import ParallelVectorEnv
from tests.gym_envs import GatedResetEnv, SampleEnv, seeded_cartpole, tallies

pytestmark = pytest.mark.timeout(120)


# ----------------------------------------------------------------- construction
def test_spaces_metadata_and_split(no_leaks):
    env = ParallelVectorEnv([seeded_cartpole(i) for i in range(6)], envs_per_worker=3)
    try:
        assert env.num_envs == 6 and repr(env) == "ParallelVectorEnv(num_envs=6, workers=2x3)"
        assert len(env.worker_pids) == 2 and os.getpid() not in env.worker_pids
        assert env.single_observation_space == gym.make("CartPole-v1").observation_space
        assert env.observation_space.shape == (6, 4) and env.action_space == spaces.MultiDiscrete([2] * 6)
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP and env.metadata["render_fps"] == 50
        assert env.render_mode is None
    finally:
        env.close()


@pytest.mark.parametrize("kwargs, error", [
    ({"observation_mode": "odd"}, ValueError), ({"autoreset_mode": "Sometimes"}, ValueError),
    ({"context": "teleport"}, ValueError), ({"envs_per_worker": 3}, ValueError), ({"num_workers": 0}, ValueError),
])
def test_bad_arguments_raise_before_anything_starts(kwargs, error, no_leaks):
    with pytest.raises(error):
        ParallelVectorEnv(tallies(3, 3, 3, 3), **kwargs)


def test_an_env_instead_of_a_constructor_shows_the_fix(no_leaks):
    with pytest.raises(TypeError, match="lambda"):
        ParallelVectorEnv([gym.make("CartPole-v1")])


def test_importing_the_facades_leaves_stable_baselines3_alone():
    code = "import sys, tdcollect.envs, tdcollect.envs.vector; print('stable_baselines3' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# ----------------------------------------------------------------- the same data as gymnasium's own loop
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_equal_to_sync_vector_env(mode, no_leaks):
    fns = [seeded_cartpole(i) for i in range(4)]
    ours, theirs = ParallelVectorEnv(fns, autoreset_mode=mode), SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert (ours.observation_space, ours.action_space) == (theirs.observation_space, theirs.action_space)
        a, b = ours.reset(seed=7), theirs.reset(seed=7)
        assert data_equivalence(a, b, exact=True)
        ended = 0
        for _ in range(150):
            actions = theirs.action_space.sample()
            a, b = ours.step(actions), theirs.step(actions)
            assert data_equivalence(a, b, exact=True), (a, b)
            done = a[2] | a[3]
            ended += done.sum()
            if mode == AutoresetMode.DISABLED and done.any():
                mask = {"reset_mask": done}
                assert data_equivalence(ours.reset(options=dict(mask)), theirs.reset(options=dict(mask)), exact=True)
        assert ended >= 4
    finally:
        ours.close()
        theirs.close()


# ----------------------------------------------------------------- autoreset modes
def test_next_step_mode_resets_on_the_step_after_the_end(no_leaks):
    env = ParallelVectorEnv(tallies(1, 2, 3), autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        assert env.reset()[0].tolist() == [0, 0, 0]
        expected = [  # obs, rewards, terminations (actions 4, 5, 6)
            ([1, 1, 1], [4, 5, 6], [True, False, False]),
            ([0, 2, 2], [0, 5, 6], [False, True, False]),  # env 0 resets: its action is ignored, reward 0
            ([1, 0, 3], [4, 0, 6], [True, False, True]),
            ([0, 1, 0], [0, 5, 0], [False, False, False]),
        ]
        for obs, rewards, terminations in expected:
            o, r, te, tr, _ = env.step(np.array([4, 5, 6]))
            assert (o.tolist(), r.tolist(), te.tolist(), tr.tolist()) == (obs, rewards, terminations, [False] * 3)
            assert r.dtype == np.float64 and te.dtype == tr.dtype == np.bool_
    finally:
        env.close()


def test_same_step_mode_returns_the_reset_observation_and_the_final_one_in_infos(no_leaks):
    env = ParallelVectorEnv(tallies(1, 2, 3, info_every=2), autoreset_mode="SameStep")
    try:
        env.reset()
        o, r, te, _, info = env.step([1, 1, 1])
        assert o.tolist() == [0, 1, 1] and te.tolist() == [True, False, False]
        assert info["final_obs"].tolist() == [1, None, None] and info["_final_obs"].tolist() == [True, False, False]
        assert info["final_info"] == {} and "tally" not in info
        o, r, te, _, info = env.step([1, 1, 1])
        assert o.tolist() == [0, 0, 2] and te.tolist() == [True, True, False]
        assert info["final_obs"].tolist() == [1, 2, None]
        assert info["final_info"]["tally"].tolist() == [0, 2, 0]
        assert info["final_info"]["_tally"].tolist() == [False, True, False]
        assert info["tally"].tolist() == [0, 0, 2] and info["_tally"].tolist() == [False, False, True]
    finally:
        env.close()


def test_disabled_mode_keeps_ended_envs_until_a_partial_reset(no_leaks):
    env = ParallelVectorEnv(tallies(1, 2, 3), autoreset_mode=AutoresetMode.DISABLED)
    try:
        env.reset()
        o, _, te, _, _ = env.step([1, 1, 1])
        assert o.tolist() == [1, 1, 1] and te.tolist() == [True, False, False]
        o, _, te, _, _ = env.step([1, 1, 1])  # env 0 is stepped on past its end: no reset of its own
        assert o.tolist() == [2, 2, 2] and te.tolist() == [True, True, False]
        o, info = env.reset(seed=[None, 40, 50], options={"reset_mask": te})
        assert o.tolist() == [0, 40, 2]
        assert info["seeded"].tolist() == [0, 40, 0] and info["_seeded"].tolist() == [False, True, False]
        o, _, te, _, _ = env.step([1, 1, 1])
        assert o.tolist() == [1, 41, 3] and te.tolist() == [True, True, True]
    finally:
        env.close()


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_partial_reset_leaves_the_other_envs_as_they_are(mode, no_leaks):
    env = ParallelVectorEnv([seeded_cartpole(i) for i in range(4)], autoreset_mode=mode)
    try:
        first, _ = env.reset(seed=[1, 2, 3, 4])
        for _ in range(3):
            now, *_ = env.step(np.zeros(4, np.int64))
        mask = np.array([True, False, True, False])
        again, _ = env.reset(seed=[1, 2, 3, 4], options={"reset_mask": mask})
        assert np.array_equal(again[mask], first[mask]) and np.array_equal(again[~mask], now[~mask])
        assert env.np_random_seed == (1, 2, 3, 4)
    finally:
        env.close()


@pytest.mark.parametrize("mask, error", [
    ([True, False, True], TypeError), (np.array([True, False]), ValueError), (np.array([[True] * 3]), ValueError),
    (np.array([1, 0, 1]), TypeError), (np.zeros(3, bool), ValueError),
])
def test_bad_reset_masks(mask, error, no_leaks):
    env = ParallelVectorEnv(tallies(3, 3, 3), autoreset_mode=AutoresetMode.DISABLED)
    try:
        with pytest.raises(error, match="reset_mask"):
            env.reset(options={"reset_mask": mask})
        options = {"reset_mask": np.array([True, False, True]), "level": 2}
        env.reset(options=options)
        assert "reset_mask" in options and env.get_attr("options_seen") == ({"level": 2}, None, {"level": 2})
    finally:
        env.close()


# ----------------------------------------------------------------- seeds and infos
def test_seeds_and_reset_infos(no_leaks):
    env = ParallelVectorEnv(tallies(3, 3, 3, 3))
    try:
        obs, info = env.reset(seed=5)
        assert obs.tolist() == [5, 6, 7, 8] and env.np_random_seed == (5, 6, 7, 8)
        assert info["seeded"].tolist() == [5, 6, 7, 8] and info["_seeded"].all()
        obs, info = env.reset(seed=[1, None, 3, None])
        assert obs.tolist() == [1, 0, 3, 0] and info["_seeded"].tolist() == [True, False, True, False]
        with pytest.raises(ValueError, match="one seed per env"):
            env.reset(seed=[1, 2])
    finally:
        env.close()


def test_step_infos_come_back_whatever_their_size(no_leaks):
    env = ParallelVectorEnv(tallies(100, 100, 100, 100, info_every=2, big_info_at=4), envs_per_worker=2)
    try:
        env.reset()
        assert env.step([0] * 4)[4] == {}
        info = env.step([0] * 4)[4]
        assert info["tally"].tolist() == [2] * 4 and info["_tally"].all()
        env.step([0] * 4)
        info = env.step([0] * 4)[4]
        assert info["big"].shape == (4, 5000) and np.array_equal(info["big"][3], np.arange(5000))
        assert env.step([0] * 4)[4] == {}
    finally:
        env.close()


def test_works_under_gymnasium_vector_wrappers(no_leaks):
    env = gym.wrappers.vector.RecordEpisodeStatistics(ParallelVectorEnv(tallies(2, 3)))
    try:
        env.reset()
        infos = [env.step([1, 1])[4] for _ in range(3)]
        assert infos[1]["episode"]["r"].tolist() == [2.0, 0.0] and infos[2]["episode"]["l"].tolist() == [0, 3]
    finally:
        env.close()


# ----------------------------------------------------------------- calls
def test_call_get_attr_set_attr(no_leaks):
    env = ParallelVectorEnv(tallies(1, 2, 3, 4), envs_per_worker=2)
    try:
        assert env.get_attr("limit") == (1, 2, 3, 4)
        assert env.call("scaled", 10, offset=1) == (11, 21, 31, 41)
        env.set_attr("limit", [5, 6, 7, 8])
        assert env.call("limit") == (5, 6, 7, 8)
        env.set_attr("limit", 9)
        assert env.get_attr("limit") == (9,) * 4
        with pytest.raises(ValueError, match="one per env"):
            env.set_attr("limit", [1, 2])
        with pytest.raises(AttributeError, match="no_such_thing"):
            env.get_attr("no_such_thing")
        with pytest.raises(ValueError, match="step"):
            env.call("step", 0)
        assert env.get_attr("limit") == (9,) * 4  # still usable after an error in a call
    finally:
        env.close()


def test_render_returns_each_envs_frame(no_leaks):
    env = ParallelVectorEnv([lambda: SampleEnv(spaces.Discrete(4), render_mode="rgb_array")] * 2)
    try:
        env.reset()
        env.step([1, 1])
        frames = env.render()
        assert env.render_mode == "rgb_array" and len(frames) == 2 and frames[1].shape == (4, 6, 3)
        assert frames[0][0, 0, 0] == 1
    finally:
        env.close()


# ----------------------------------------------------------------- async order and timeouts
def test_async_calls_in_order_and_out_of_order(no_leaks):
    env = ParallelVectorEnv(tallies(3, 3))
    try:
        with pytest.raises(NoAsyncCallError, match="Calling `reset_wait` without any prior call to `reset_async`"):
            env.reset_wait()
        env.reset_async(seed=[3, 4])
        with pytest.raises(AlreadyPendingCallError, match="Calling `step_async` while waiting for a pending call to "
                           "`reset` to complete"):
            env.step_async([1, 1])
        assert env.reset_wait()[0].tolist() == [3, 4]
        with pytest.raises(NoAsyncCallError):
            env.step_wait()
        env.step_async([2, 2])
        for blocked in (lambda: env.reset(), lambda: env.call("limit"), lambda: env.set_attr("limit", 1)):
            with pytest.raises(AlreadyPendingCallError):
                blocked()
        obs, rewards, *_ = env.step_wait()
        assert obs.tolist() == [4, 5] and rewards.tolist() == [2.0, 2.0]
        env.call_async("scaled", 2)
        assert env.call_wait() == (6, 6)
        env.step_async([1, 1])
        with pytest.warns(UserWarning, match="pending"):
            env.close()
    finally:
        env.close()


def test_wait_timeouts_leave_the_call_pending(no_leaks, tmp_path):
    gate = str(tmp_path / "open")
    env = ParallelVectorEnv([functools.partial(GatedResetEnv, gate)] * 2)
    try:
        env.reset_async()
        with pytest.raises(multiprocessing.TimeoutError):
            env.reset_wait(timeout=0.05)  # the resets cannot end before the gate opens
        open(gate, "w").close()
        assert env.reset_wait()[0].shape == (2, 2)
        env.step_async(np.array([0.0, 0.4], np.float32))
        with pytest.raises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.05)
        assert env.step_wait(timeout=5)[0].tolist() == [[1, 1], [1, 1]]
        env.call_async("slow_answer", 0.4)
        with pytest.raises(multiprocessing.TimeoutError):
            env.call_wait(timeout=0.05)
        assert env.call_wait() == ("late", "late")
        env.step_async(np.array([0.0, 1.0], np.float32))
    finally:
        start = time.perf_counter()
        with pytest.warns(UserWarning):
            env.close(terminate=True)
        assert time.perf_counter() - start < 5
