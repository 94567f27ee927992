"""ParallelVecEnv (``tdcollect.envs.vector``) as a Stable-Baselines3 ``VecEnv``: ``make_vec_env`` and PPO, the same
data as ``DummyVecEnv``, ``terminal_observation`` / ``TimeLimit.truncated`` infos, calls with indices, seeds and
options, images, ``VecNormalize`` / ``VecFrameStack``, dead workers; and SB3's own vec-env test file run
against it (``tests/sb3_suite``)."""
from __future__ import annotations

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize  # noqa: E402

from tdcollect.envs.engine.errors import WorkerDiedError  # noqa: E402
from tdcollect.envs.vector import ParallelVecEnv  # noqa: E402
from tests.sb3_suite import runner  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class NoteEnv(gym.Env):
    """obs: steps since reset, as a float Box(1,) (a Dict {"n", "flag"} with ``as_dict``); terminates after
    ``limit`` steps; remembers the options and seed of its last reset; ``render()`` an rgb frame."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, limit=3, as_dict=False, render_mode="rgb_array", die_at=-1):
        box = spaces.Box(0, 100, (1,), np.float32)
        self.observation_space = spaces.Dict({"n": box, "flag": spaces.Discrete(2)}) if as_dict else box
        self.action_space = spaces.Discrete(2)
        self.limit, self.as_dict, self.render_mode, self.die_at = limit, as_dict, render_mode, die_at
        self.count, self.options_seen, self.seed_seen = 0, None, None

    def _obs(self):
        n = np.array([self.count], np.float32)
        return {"n": n, "flag": self.count % 2} if self.as_dict else n

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count, self.options_seen, self.seed_seen = 0, options, seed
        return self._obs(), {"fresh": True}

    def step(self, action):
        self.count += 1
        if self.count == self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.count == 2 and action == 1:
            raise ValueError("action 1 at step 2")
        return self._obs(), 1.0, self.count >= self.limit, False, {"count": self.count}

    def render(self):
        return np.full((2, 3, 3), self.count, np.uint8)

    def times(self, k, plus=0):
        return self.limit * k + plus


def notes(*limits, **kwargs):
    return [lambda limit=limit: Monitor(NoteEnv(limit, **kwargs)) for limit in limits]


def test_same_data_as_dummy_vec_env(no_leaks):
    short = {"max_episode_steps": 9}
    ours = make_vec_env("CartPole-v1", n_envs=4, seed=3, vec_env_cls=ParallelVecEnv, env_kwargs=short)
    theirs = make_vec_env("CartPole-v1", n_envs=4, seed=3, vec_env_cls=DummyVecEnv, env_kwargs=short)
    try:
        assert repr(ours) == "ParallelVecEnv(num_envs=4, workers=2x2)" and ours.render_mode == "rgb_array"
        assert np.array_equal(ours.reset(), theirs.reset()) and ours.reset_infos == theirs.reset_infos
        truncated = episodes = 0
        for t in range(60):
            actions = np.array([(t * 7 + i) % 2 for i in range(4)])
            (o1, r1, d1, i1), (o2, r2, d2, i2) = ours.step(actions), theirs.step(actions)
            assert np.array_equal(o1, o2) and np.array_equal(r1, r2) and np.array_equal(d1, d2)
            assert r1.dtype == np.float32 and d1.dtype == np.bool_
            for a, b in zip(i1, i2):
                assert a.keys() == b.keys() and a["TimeLimit.truncated"] == b["TimeLimit.truncated"]
                if "terminal_observation" in a:
                    assert np.array_equal(a["terminal_observation"], b["terminal_observation"])
                    assert (a["episode"]["r"], a["episode"]["l"]) == (b["episode"]["r"], b["episode"]["l"])
                    episodes += 1
                    truncated += a["TimeLimit.truncated"]
        assert episodes >= 20 and truncated >= 1
    finally:
        ours.close()
        theirs.close()


def test_terminal_observations_and_reset_infos(no_leaks):
    env = ParallelVecEnv([lambda: NoteEnv(2, as_dict=True), lambda: NoteEnv(3, as_dict=True)])
    try:
        obs = env.reset()
        assert obs["n"].shape == (2, 1) and obs["flag"].tolist() == [0, 0]
        assert env.reset_infos == [{"fresh": True}, {"fresh": True}]
        env.step(np.array([0, 0]))
        obs, rewards, dones, infos = env.step(np.array([0, 0]))
        assert dones.tolist() == [True, False] and obs["n"][:, 0].tolist() == [0, 2]
        assert infos[0]["terminal_observation"]["n"].tolist() == [2] and infos[0]["count"] == 2
        assert infos[0]["TimeLimit.truncated"] is False and "terminal_observation" not in infos[1]
        assert env.reset_infos[0] == {"fresh": True}
    finally:
        env.close()


def test_calls_with_indices(no_leaks):
    env = ParallelVecEnv(notes(1, 2, 3, 4), envs_per_worker=2)
    try:
        assert env.get_attr("limit") == [1, 2, 3, 4] and env.get_attr("limit", indices=2) == [3]
        assert env.env_method("times", 10, indices=[3, 0], plus=1) == [41, 11]
        env.set_attr("limit", 7, indices=[-1])
        assert env.get_attr("limit", indices=[1, -1]) == [2, 7]
        env.set_attr("label", "x")  # on the outermost wrapper (Monitor) only
        assert env.get_attr("label") == ["x"] * 4 and env.has_attr("label") and not env.has_attr("nope")
        assert env.env_is_wrapped(Monitor) == [True] * 4 and env.env_is_wrapped(gym.wrappers.TimeLimit, 1) == [False]
        with pytest.raises(IndexError):
            env.get_attr("limit", indices=[4])
        with pytest.raises(AttributeError):
            env.get_attr("nope")
    finally:
        env.close()


def test_seeds_and_options_reach_the_next_reset_only(no_leaks):
    env = ParallelVecEnv(notes(3, 3, 3))
    try:
        assert env.seed(7) == [7, 8, 9]
        env.set_options({"level": 2})
        env.reset()
        assert env.get_attr("seed_seen") == [7, 8, 9] and env.get_attr("options_seen") == [{"level": 2}] * 3
        env.set_options([{"a": 1}, {}, {"c": 3}])
        env.reset()
        assert env.get_attr("seed_seen") == [None] * 3 and env.get_attr("options_seen") == [{"a": 1}, None, {"c": 3}]
    finally:
        env.close()


def test_images_and_render(no_leaks):
    env = ParallelVecEnv(notes(5, 5, 5, 5))
    try:
        env.reset()
        env.step(np.zeros(4, np.int64))
        images = env.get_images()
        assert len(images) == 4 and images[0].tolist() == np.ones((2, 3, 3)).tolist()
        assert env.render().shape == (4, 6, 3)
    finally:
        env.close()
    env = ParallelVecEnv(notes(5, 5, render_mode=None))
    try:
        with pytest.warns(UserWarning, match="rgb_array"):
            assert env.get_images() == [None, None]
    finally:
        env.close()


def test_ppo_under_vec_normalize_and_frame_stack(no_leaks):
    env = VecNormalize(VecFrameStack(make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=ParallelVecEnv), 2))
    try:
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1, device="cpu", seed=0)
        model.learn(256)
        assert model.num_timesteps == 256 and len(model.ep_info_buffer) > 0  # Monitor's episode infos came back
    finally:
        env.close()


def test_start_method_is_checked_before_anything_starts(no_leaks):
    with pytest.raises(ValueError, match="cannot find context for 'nope'"):
        ParallelVecEnv(notes(3, 3), start_method="nope")
    with pytest.raises(ValueError, match="multiply"):
        ParallelVecEnv(notes(3, 3, 3), num_workers=2)


def test_an_env_exception_keeps_its_type(no_leaks):
    env = ParallelVecEnv(notes(9, 9))
    try:
        env.reset()
        env.step(np.array([0, 0]))
        with pytest.raises(ValueError, match="action 1 at step 2"):
            env.step(np.array([0, 1]))
    finally:
        env.close()


def test_a_dead_worker_is_one_clear_error_not_an_eof(no_leaks):
    env = ParallelVecEnv([lambda: NoteEnv(9, die_at=2), lambda: NoteEnv(9)])
    env.reset()
    env.step(np.array([0, 0]))
    start = time.perf_counter()
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        env.step(np.array([0, 0]))
    assert time.perf_counter() - start < 10
    with pytest.raises(RuntimeError, match="worker died"):
        env.reset()
    env.close()


def test_restarted_envs_end_their_episode_as_truncated(no_leaks):
    env = ParallelVecEnv(notes(50, 50, 50, 50), envs_per_worker=2, max_restarts=1)
    try:
        env.reset()
        env.step(np.zeros(4, np.int64))
        os.kill(env.worker_pids[0], signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="restarting worker 0"):
            obs, _, dones, infos = env.step(np.zeros(4, np.int64))
        assert dones.tolist() == [True, True, False, False] and obs[:, 0].tolist() == [0, 0, 2, 2]
        assert infos[0]["TimeLimit.truncated"] and "terminal_observation" in infos[1]
        assert env.restarts == [1, 0] and env.step(np.zeros(4, np.int64))[0][:, 0].tolist() == [1, 1, 3, 3]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.long  # (half a minute: in the long tier, which CI runs)
@pytest.mark.timeout(900)
def test_stable_baselines3_vec_env_suite_passes(tmp_path, no_leaks):
    """SB3's own tests/test_vec_envs.py (from the installed version's sdist) with SubprocVecEnv -> ParallelVecEnv."""
    outcomes = runner.run_suite(runner.suite_file(), tmp_path / "report.xml")
    ours = [name for name in outcomes if "ParallelVecEnv" in name]
    assert len(outcomes) >= 30 and len(ours) >= 10, outcomes
    failed = {name for name, outcome in outcomes.items() if outcome in ("failed", "error")}
    unexpected = {name for name in failed if name.split("[")[0] not in runner.EXPECTED_FAILURES}
    assert not unexpected, f"SB3's vec-env tests failing against ParallelVecEnv: {sorted(unexpected)}"
    skipped = {name.split("[")[0] for name, outcome in outcomes.items() if outcome == "skipped"}
    assert skipped <= set(runner.EXPECTED_SKIPS), skipped


def test_step_async_begins_the_step_in_the_workers_and_step_wait_finishes_it(tmp_path, no_leaks):
    from tests.helpers import GatedEnv, wait_for_file

    gated = functools.partial(GatedEnv, str(tmp_path), at_step=1)
    env = ParallelVecEnv([gated, gated], num_workers=2)
    try:
        env.reset()
        env.step_async(np.array([1, 2]))
        wait_for_file(str(tmp_path / "entered"))  # the workers step before step_wait: nothing of ours waits for it
        with pytest.raises(RuntimeError, match="call step_wait"):
            env.get_attr("count")
        with pytest.raises(RuntimeError, match="call step_wait"):
            env.step_async(np.array([1, 2]))
        open(tmp_path / "open", "w").close()
        obs, rewards, dones, _ = env.step_wait()
        assert obs[:, :2].tolist() == [[1, 1], [1, 2]] and rewards.tolist() == [1, 2]
        assert env.get_attr("count") == [1, 1]
    finally:
        env.close()
