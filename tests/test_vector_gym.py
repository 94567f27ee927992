"""ParallelVectorEnv (``tdcollect.envs.vector``) as gymnasium's vector-env users rely on it: the three autoreset
modes, partial resets, seeding, infos, ``call``/``get_attr``/``set_attr``, the async call order and timeouts,
spaces (Dict/Tuple included), errors and dead workers, and equality with gymnasium's own ``SyncVectorEnv``."""
from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces

from tdcollect.envs.errors import EnvWorkerError, WorkerDiedError
from tdcollect.envs.vector import ParallelVectorEnv, SpaceMismatchError

pytestmark = pytest.mark.timeout(120)


class TallyEnv(gym.Env):
    """obs: steps since the last reset (the reset seed at reset, 0 without one); reward: the action; terminates
    once ``limit`` steps are done. Infos: the reset's ``{"seeded": seed}``, and ``{"tally": n}`` at every step
    (``info_every`` > 0: every ``info_every``-th step only)."""

    def __init__(self, limit: int = 3, info_every: int = 1, big_info_at: int = -1):
        self.observation_space = spaces.Discrete(1000)
        self.action_space = spaces.Discrete(10)
        self.limit, self.info_every, self.big_info_at = limit, info_every, big_info_at
        self.count, self.options_seen = 0, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0 if seed is None else seed
        self.options_seen = options
        return self.count, ({"seeded": seed} if seed is not None else {})

    def step(self, action):
        self.count += 1
        info = {"tally": self.count} if self.count % self.info_every == 0 else {}
        if self.count == self.big_info_at:
            info["big"] = np.arange(5000)  # larger than a mailbox slot
        return self.count, float(action), self.count >= self.limit, False, info

    def scaled(self, k, offset=0):
        return self.limit * k + offset


class SleepyEnv(gym.Env):
    """step sleeps ``float(action)`` seconds; reset sleeps ``reset_s``."""

    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = spaces.Box(0, 10, (), np.float32)

    def __init__(self, reset_s: float = 0.0):
        self.reset_s = reset_s

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(self.reset_s)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(float(action))
        return np.ones(2, np.float32), 0.0, False, False, {}

    def slow_answer(self, seconds):
        time.sleep(seconds)
        return "late"


class EnvError(Exception):
    """An exception type of the user's own."""


class FailingEnv(TallyEnv):
    """Raises ``error`` at step ``at`` (``"kill"``: SIGKILLs its own process)."""

    def __init__(self, error="value", at: int = 2):
        super().__init__(limit=100)
        self.error, self.at = error, at

    def step(self, action):
        if self.count + 1 == self.at:
            if self.error == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise {"value": ValueError("bad step"), "own": EnvError("own bad step"), "os": OSError(5, "io")}[self.error]
        return super().step(action)


class SampleEnv(gym.Env):
    """Observations sampled from ``obs_space``; checks its actions are in ``act_space``; ends every 3 steps."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, obs_space, act_space=None, render_mode=None):
        self.observation_space, self.action_space = obs_space, act_space or spaces.Discrete(3)
        self.render_mode, self.count = render_mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.count = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.count += 1
        return self.observation_space.sample(), 1.0, self.count % 3 == 0, False, {}

    def render(self):
        return np.full((4, 6, 3), self.count, np.uint8)


def tallies(*limits, **kwargs):
    return [lambda limit=limit: TallyEnv(limit, **kwargs) for limit in limits]


def seeded_cartpole(i):
    def make():
        env = gym.make("CartPole-v1")
        env.action_space.seed(i)
        return env
    return make


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


class GatedResetEnv(SleepyEnv):
    """A SleepyEnv whose reset waits until the file ``gate`` exists."""

    def __init__(self, gate: str):
        super().__init__()
        self.gate = gate

    def reset(self, *, seed=None, options=None):
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        return super().reset(seed=seed, options=options)


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


def test_an_unsupported_space_is_a_clear_error(no_leaks):
    with pytest.raises(TypeError, match="Text") as caught:
        ParallelVectorEnv([lambda: SampleEnv(spaces.Text(5))])
    assert isinstance(caught.value, ValueError)
    # the words gymnasium's AsyncVectorEnv raises for dynamic spaces, which code written for it looks for
    assert "has a dynamic shape so its not possible to make a static shared memory." in str(caught.value)


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


def test_restarts_are_opt_in(no_leaks):
    env = ParallelVectorEnv(tallies(100, 100, 100, 100), envs_per_worker=2, max_restarts=1)
    try:
        env.reset()
        env.step([1] * 4)
        os.kill(env.worker_pids[1], signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="restarting worker 1"):
            obs, _, _, truncated, _ = env.step([1] * 4)
        assert truncated.tolist() == [False, False, True, True] and obs.tolist() == [2, 2, 0, 0]
        assert env.restarts == [0, 1] and env.get_attr("limit") == (100,) * 4
        obs, rewards, *_ = env.step([1] * 4)  # NEXT_STEP: the truncated envs' reset step
        assert obs.tolist() == [3, 3, 0, 0] and rewards.tolist() == [1, 1, 0, 0]
        assert env.step([1] * 4)[0].tolist() == [4, 4, 1, 1]
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
