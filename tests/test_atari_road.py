"""gymnasium's Atari preprocessing on the native road (``envs/libs/atari.py``): the same data as the same makers
stepped in this process through gymnasium's own wrappers (our seed chain, the same actions, episode ends and the
resets that follow them), over several games and option sets; the rollout a worker records; the road each env
takes; and mutants of each step of the road, which these comparisons must catch."""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.group import seed_chain
from tdcollect.envs.libs import atari

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from gymnasium.wrappers import (  # noqa: E402 - after the skips (AtariPreprocessing needs cv2 when built)
    AtariPreprocessing,
    FrameStackObservation,
    RecordEpisodeStatistics,
)

STEPS = 120
NUM_ENVS = 4
SEED = 7
KEYS = ("observation", "next_observation", "reward", "terminated", "truncated")


def make(game: str, stack: int | None = 4, make_kwargs: dict | None = None, **options):
    """``[FrameStackObservation(]AtariPreprocessing(gym.make("ALE/<game>-v5", frameskip=1, ...), **options)[,
    stack)]`` (module level: it pickles by reference)."""
    import ale_py

    gym.register_envs(ale_py)
    env = AtariPreprocessing(gym.make(f"ALE/{game}-v5", **{"frameskip": 1, **(make_kwargs or {})}), **options)
    return env if stack is None else FrameStackObservation(env, stack)


def zero_padded(game: str, **options):
    """The stack padded with zeros after a reset (``padding_type="zero"``)."""
    return FrameStackObservation(make(game, stack=None, **options), 4, padding_type="zero")


#: games x option sets; each crosses episode ends (a TimeLimit, or lives lost with terminal_on_life_loss)
CASES = {
    "pong-defaults-time-limit": functools.partial(make, "Pong", make_kwargs={"max_episode_steps": 160}),
    "breakout-life-loss-skip-3-stack-2": functools.partial(make, "Breakout", stack=2, frame_skip=3,
                                                           terminal_on_life_loss=True),
    "space-invaders-scaled-newaxis-no-stack": functools.partial(
        make, "SpaceInvaders", stack=None, scale_obs=True, grayscale_newaxis=True, screen_size=(64, 48),
        noop_max=4, make_kwargs={"max_episode_steps": 150}),
    "pong-rgb-skip-1-stack-3": functools.partial(make, "Pong", stack=3, frame_skip=1, grayscale_obs=False,
                                                 make_kwargs={"max_episode_steps": 70}),
    "boxing-ale-skip-4-zero-padding": functools.partial(
        zero_padded, "Boxing", frame_skip=1, noop_max=5, make_kwargs={"frameskip": 4, "max_episode_steps": 25}),
}


def fixed_actions(make_env) -> np.ndarray:
    """``[STEPS, NUM_ENVS]`` actions of the env's action space, from a seeded generator."""
    env = make_env()
    try:
        count = int(env.action_space.n)
    finally:
        env.close()
    return np.random.default_rng(1).integers(0, count, size=(STEPS, NUM_ENVS))


def in_process(make_env, seed: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    """One env stepped here through gymnasium's wrappers: reset with ``seed``, stepped with ``actions``, reset
    (unseeded) after an episode's end, as the batched envs auto-reset."""
    env = make_env()
    try:
        obs, _ = env.reset(seed=seed)
        out = {key: [] for key in KEYS}
        for action in actions:
            out["observation"].append(np.array(obs))
            next_obs, reward, terminated, truncated, _ = env.step(np.int64(action))
            out["next_observation"].append(np.array(next_obs))
            out["reward"].append(np.float32(reward))
            out["terminated"].append(terminated)
            out["truncated"].append(truncated)
            obs = env.reset()[0] if terminated or truncated else next_obs
    finally:
        env.close()
    return {key: np.asarray(value) for key, value in out.items()}


def stepped(env, actions: np.ndarray) -> dict[str, np.ndarray]:
    """A ``step_and_maybe_reset`` loop of a batched env over ``actions``: ``{key: [NUM_ENVS, STEPS, ...]}``."""
    env.set_seed(SEED)
    td = env.reset()
    rows = {key: [] for key in KEYS}
    for t in range(actions.shape[0]):
        td["action"] = torch.as_tensor(actions[t])
        rows["observation"].append(td["observation"].clone())
        out, td = env.step_and_maybe_reset(td)
        rows["next_observation"].append(out["next", "observation"].clone())
        for key in ("reward", "terminated", "truncated"):
            rows[key].append(out["next", key].reshape(NUM_ENVS).clone())
    return {key: torch.stack(value, 1).numpy() for key, value in rows.items()}


def assert_gymnasiums_data(ours: dict, make_env, actions: np.ndarray, what: str) -> int:
    """``ours`` equals each env stepped in this process (env ``i`` seeded by our seed chain); returns the number of
    episode ends crossed."""
    ends = 0
    for i, seed in enumerate(seed_chain(SEED, NUM_ENVS)):
        theirs = in_process(make_env, seed, actions[:, i])
        ends += int(theirs["terminated"].sum() + theirs["truncated"].sum())
        for key, value in theirs.items():
            mine = ours[key][i].reshape(value.shape)
            assert mine.dtype == value.dtype, f"{what}: env {i}, {key}: {mine.dtype} != {value.dtype}"
            np.testing.assert_array_equal(mine, value, err_msg=f"{what}: env {i}, {key}")
    return ends


@pytest.mark.parametrize("name", list(CASES))
def test_the_native_road_gives_gymnasiums_data(name, no_leaks):
    """2 workers x 2 envs against each env stepped here through gymnasium's wrappers."""
    make_env = CASES[name]
    actions = fixed_actions(make_env)
    with ParallelEnv(2, make_env, envs_per_worker=2) as env:
        roads = env.roads()
        ours = stepped(env, actions)
    assert roads == [atari.NATIVE] * NUM_ENVS, roads
    ends = assert_gymnasiums_data(ours, make_env, actions, name)
    assert ends > 0, "no episode ended: the loop must cross an episode's end"


def test_a_rollout_recorded_in_the_workers_is_the_step_by_step_one():
    """``ParallelEnv.rollout`` (recorded by the workers straight into its storage) against ``SerialEnv.rollout``
    (step by step in this process), the same seeds and random actions, across episode ends."""
    make_env = CASES["breakout-life-loss-skip-3-stack-2"]
    with ParallelEnv(2, make_env, envs_per_worker=2) as parallel, SerialEnv(NUM_ENVS, make_env) as serial:
        assert parallel.roads() == serial.roads() == [atari.NATIVE] * NUM_ENVS
        rollouts = []
        for env in (parallel, serial):
            env.set_seed(SEED)
            torch.manual_seed(3)
            rollouts.append(env.rollout(STEPS, break_when_any_done=False))
    ours, theirs = rollouts
    assert theirs["next", "done"].any()
    for key in theirs.keys(True, True):
        assert torch.equal(ours[key], theirs[key]), key


def wrapped_inside():
    import ale_py

    gym.register_envs(ale_py)
    return FrameStackObservation(AtariPreprocessing(RecordEpisodeStatistics(gym.make("ALE/Pong-v5", frameskip=1))), 4)


def wrapped_outside():
    return RecordEpisodeStatistics(make("Pong"))


class MyPreprocessing(AtariPreprocessing):
    """A subclass (it may step in its own way)."""


def subclassed():
    import ale_py

    gym.register_envs(ale_py)
    return MyPreprocessing(gym.make("ALE/Pong-v5", frameskip=1))


def ram_observations():
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", frameskip=1)


@pytest.mark.parametrize("make_env, reason", [
    (wrapped_inside, "RecordEpisodeStatistics between AtariPreprocessing and the ALE env"),
    (wrapped_outside, "RecordEpisodeStatistics wraps AtariPreprocessing"),
    (subclassed, "MyPreprocessing is a subclass of AtariPreprocessing"),
])
def test_what_the_road_does_not_cover_keeps_the_wrappers_step(make_env, reason):
    """The reason is in ``roads()``, and the data are still gymnasium's (its own wrappers step it)."""
    actions = fixed_actions(make_env)[:40]
    with SerialEnv(NUM_ENVS, make_env) as env:
        roads = env.roads()
        ours = stepped(env, actions)
    assert roads == [f"{atari.WRAPPERS_STEP}: {reason}"] * NUM_ENVS, roads
    assert_gymnasiums_data(ours, make_env, actions, reason)


def test_an_ale_env_without_preprocessing_is_not_this_familys():
    env = ram_observations()
    try:
        assert atari.chain_of(env) == (None, None)
        assert atari.native_stepper(env) is None
    finally:
        env.close()


class ReadsOneFrameEarly(atari.AtariFrames):
    SCREEN_READS = (3, 2)


class ResizesLinearly(atari.AtariFrames):
    INTERPOLATION = "INTER_LINEAR"


class StacksNewestFirst(atari.AtariFrames):
    @staticmethod
    def _write_stack(queue, out):
        for j, frame in enumerate(reversed(queue)):
            out[j] = frame


class CountsNoLivesLost(atari.AtariFrames):
    def __init__(self, env, chain):
        super().__init__(env, chain)
        self.life_loss = False


@pytest.mark.parametrize("mutant, name", [
    (ReadsOneFrameEarly, "pong-defaults-time-limit"),
    (ResizesLinearly, "pong-defaults-time-limit"),
    (StacksNewestFirst, "pong-defaults-time-limit"),
    (CountsNoLivesLost, "breakout-life-loss-skip-3-stack-2"),
])
def test_a_mutant_of_the_road_differs_from_gymnasium(mutant, name, monkeypatch):
    """Each step of the road changed (a frame read one early, another resize, the stack shifted the other way, the
    lives not counted): the comparison above fails (in this process: a ``SerialEnv`` takes the same road)."""
    make_env = CASES[name]
    actions = fixed_actions(make_env)
    monkeypatch.setattr(atari, "AtariFrames", mutant)
    with SerialEnv(NUM_ENVS, make_env) as env:
        ours = stepped(env, actions)
    with pytest.raises(AssertionError):
        assert_gymnasiums_data(ours, make_env, actions, mutant.__name__)


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_the_gymnasium_face_gives_sync_vector_envs_data(mode, no_leaks):
    """``ParallelVectorEnv`` (its workers step the chain natively, through ``Family.native_env``) against
    gymnasium's ``SyncVectorEnv`` of the same constructors: observations, rewards, ends and infos, in each
    autoreset mode (a partial reset of the ended envs in ``disabled``)."""
    from gymnasium.utils.env_checker import data_equivalence
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from tdcollect.envs.vector import ParallelVectorEnv

    make_env = CASES["breakout-life-loss-skip-3-stack-2"]
    fns = [make_env] * NUM_ENVS
    ours = ParallelVectorEnv(fns, envs_per_worker=2, autoreset_mode=AutoresetMode[mode])
    theirs = SyncVectorEnv(fns, autoreset_mode=AutoresetMode[mode])
    try:
        assert ours.get_attr("tdcollect_road") == (atari.NATIVE,) * NUM_ENVS
        assert data_equivalence(ours.reset(seed=SEED), theirs.reset(seed=SEED), exact=True)
        ended = 0
        for actions in fixed_actions(make_env):
            a, b = ours.step(actions), theirs.step(actions)
            assert data_equivalence(a, b, exact=True), (a[1:], b[1:])
            done = a[2] | a[3]
            ended += int(done.sum())
            if mode == "DISABLED" and done.any():
                mask = {"reset_mask": done}
                assert data_equivalence(ours.reset(options=dict(mask)), theirs.reset(options=dict(mask)), exact=True)
        assert ended > 0
    finally:
        ours.close()
        theirs.close()


def torchrl_wrapped(name: str):
    """TorchRL's ``GymWrapper`` over a chain of :data:`CASES` (module level: it pickles by reference)."""
    from torchrl.envs import GymWrapper

    return GymWrapper(CASES[name](), categorical_action_encoding=True)


def test_torchrls_gym_wrapper_over_the_chain_gives_torchrls_data(no_leaks):
    """TorchRL's ``GymWrapper`` around the chain: our ``ParallelEnv`` (TorchRL's GymEnv road, the chain inside on
    the native one) against TorchRL's own ``SerialEnv`` of the same constructor: every key of a
    ``step_and_maybe_reset`` loop across episode ends."""
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    make_env = functools.partial(torchrl_wrapped, "breakout-life-loss-skip-3-stack-2")
    actions = fixed_actions(CASES["breakout-life-loss-skip-3-stack-2"])
    outputs = []
    roads = None
    for build in (lambda: TorchRLSerialEnv(NUM_ENVS, make_env), lambda: ParallelEnv(2, make_env, envs_per_worker=2)):
        env = build()
        try:
            if isinstance(env, ParallelEnv):
                roads = env.roads()
            env.set_seed(SEED)
            td = env.reset()
            steps = []
            for t in range(STEPS):
                td["action"] = torch.as_tensor(actions[t])
                out, td = env.step_and_maybe_reset(td)
                steps.append(out.clone())
            outputs.append(torch.stack(steps, 1))
        finally:
            env.close()
    theirs, ours = outputs
    assert roads is not None and all(road.endswith(atari.NATIVE) and road.startswith("native") for road in roads), roads
    assert theirs["next", "done"].any()
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    for key in theirs.keys(True, True):
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


def test_steps_through_the_wrappers_and_native_steps_mix(no_leaks):
    """The road's state is the wrappers' own: steps taken through ``env.step`` (as ``env_method("step")`` would)
    between native ones, and a reset, leave the next native steps gymnasium's (observations, rewards, ends, infos)."""
    from gymnasium.utils.env_checker import data_equivalence

    make_env = CASES["breakout-life-loss-skip-3-stack-2"]
    ours_env, theirs = make_env(), make_env()
    ours = atari.native_env(ours_env)
    try:
        assert isinstance(ours, atari.AtariFrames)
        assert data_equivalence(ours.reset(seed=SEED), theirs.reset(seed=SEED), exact=True)
        for t, action in enumerate(fixed_actions(make_env)[:, 0]):
            through_wrappers = t % 10 in (3, 4)
            a = (ours_env if through_wrappers else ours).step(np.int64(action))
            b = theirs.step(np.int64(action))
            assert data_equivalence(a, b, exact=True), t
            if t == 60 or a[2] or a[3]:
                assert data_equivalence(ours.reset(), theirs.reset(), exact=True)
    finally:
        ours_env.close()
        theirs.close()
