"""TorchRL's own way to write an env, ``TransformedEnv(GymEnv(...), transforms)`` per env, on the native road
(``envs/transforms/per_env.py``): the same data as TorchRL's own classes over the same constructors, key by key
(``torch.equal``, dtypes and shapes), on a ``SerialEnv``, a ``ParallelEnv`` (2 x 2), a one-env ``Collector`` and a
``MultiSyncCollector``; a step of some envs; the road each env takes, and why where it is TorchRL's."""
from __future__ import annotations

import functools
import gc
import importlib.util
from pathlib import Path

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.data import OneHot
from torchrl.envs import CatFrames, Compose, DoubleToFloat, GymEnv, TransformedEnv
from torchrl.envs import SerialEnv as TorchRLSerialEnv
from torchrl.envs.transforms import (
    CatTensors,
    ExcludeTransform,
    FlattenObservation,
    InitTracker,
    ObservationNorm,
    RewardClipping,
    RewardScaling,
    RewardSum,
    RNDTransform,
    SignTransform,
    StepCounter,
    UnsqueezeTransform,
    VecNorm,
)

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.transforms.per_env import NATIVE
from tests.test_gymenv_road import actions_for, assert_same, run_loop
from tests.test_worker_transforms import torchvision_for_resize  # noqa: F401 - a fixture (Resize)

pytestmark = pytest.mark.timeout(180)

STEPS = 120
SOTA = Path(__file__).resolve().parent.parent.parent / "shared" / "torchrl-tests" / "sota-implementations"


def transformed(name: str, transforms, **kwargs) -> TransformedEnv:
    """``TransformedEnv(GymEnv(name), transforms())``, as TorchRL's ``make_env`` helpers build one env."""
    return TransformedEnv(GymEnv(name, **kwargs), transforms())


def dqn_transforms():
    """TorchRL's DQN scripts' per-env transforms."""
    return Compose(RewardSum(), StepCounter())


def sac_transforms():
    """TorchRL's SAC scripts' four, the step counter truncating before the env's own limit (the worker resets)."""
    return Compose(InitTracker(), StepCounter(17), DoubleToFloat(), RewardSum())


def stacked_transforms():
    """A frame stack per env (``CatFrames`` over the observation), an init flag, a step count and a return."""
    return Compose(InitTracker(), CatFrames(N=3, dim=-1, in_keys=["observation"]), StepCounter(25), RewardSum())


class NotNative(RewardSum):
    """TorchRL's ``RewardSum`` under another name: it has no native op."""


def normalized_transforms():
    """Fixed observation and reward normalization (``ObservationNorm``, ``RewardScaling``) under a step count."""
    return Compose(ObservationNorm(loc=torch.tensor([0.1, -0.2, 0.3]), scale=torch.tensor([1.5, 2.0, 0.5]),
                                   in_keys=["observation"], standard_normal=True),
                   RewardScaling(loc=0.5, scale=0.1), StepCounter(25), RewardSum())


def reshaping_transforms():
    """Entries made, reshaped, joined and dropped (``UnsqueezeTransform``, ``FlattenObservation``, ``CatTensors``,
    ``ExcludeTransform``), the reward clipped."""
    return Compose(UnsqueezeTransform(-1, in_keys=["observation"], out_keys=["column"]),
                   FlattenObservation(-2, -1, in_keys=["column"], out_keys=["flat"]),
                   SignTransform(in_keys=["flat"]),  # (other values than the observation's, for CatTensors' order)
                   CatTensors(in_keys=["observation", "flat"], out_key="both", del_keys=False),
                   ExcludeTransform("column"), RewardClipping(-0.5, 0.5), StepCounter(25))


def sota_utils(folder: str, name: str):
    """TorchRL's ``sota-implementations/<folder>/<name>`` as shipped (pinned in ``../shared/torchrl-tests``), loaded
    as a module of its own (not in ``sys.modules``: its functions travel to the workers by value)."""
    path = SOTA / folder / name
    if not path.is_file():
        pytest.skip(f"TorchRL's scripts are not beside the project ({path})")
    spec = importlib.util.spec_from_file_location(f"sota_{folder}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ppo_mujoco_maker():
    """TorchRL's PPO-MuJoCo ``make_env`` (``VecNorm``, ``ClipTransform``, ``RewardSum``, ``StepCounter``,
    ``DoubleToFloat`` per env), its episodes cut at 30 steps."""
    pytest.importorskip("mujoco")
    utils = sota_utils("ppo", "utils_mujoco.py")
    return functools.partial(utils.make_env, "HalfCheetah-v4", "cpu", max_episode_steps=30)


def impala_maker():
    """TorchRL's IMPALA ``make_env`` (Atari: ``NoopResetEnv``, ``EndOfLifeTransform``, the pixel transforms, a
    per-env ``VecNorm`` after ``DoubleToFloat``) on Breakout, whose lives end inside episodes."""
    ale_py = pytest.importorskip("ale_py")
    import gymnasium

    gymnasium.register_envs(ale_py)
    utils = sota_utils("impala", "utils.py")
    return functools.partial(utils.make_env, "BreakoutNoFrameskip-v4", "cpu", "gymnasium")


def with_rnd(make, networks):
    """``make()`` under TorchRL's ``RNDTransform`` as TorchRL's RND script appends it (``normalize_obs=False``), with
    the same seeded networks in every env (drawn without touching the global RNG), in train mode (its running reward
    statistics update at each step, each env's its own)."""
    env = make()
    with torch.random.fork_rng():
        torch.manual_seed(11)
        target, predictor = networks(env.observation_spec["observation"].shape[-1], embed_dim=8)
    rnd = RNDTransform(target, predictor, normalize_obs=False)
    env.append_transform(rnd)
    rnd.train()  # (appended, a transform is in eval mode: in train mode its reward statistics move, per env)
    return env


def rnd_mujoco_maker():
    """TorchRL's PPO-MuJoCo ``make_env`` (as RND's ``utils_mujoco.make_env``) and the RND script's ``RNDTransform``
    (a network's intrinsic reward, with running reward statistics, per env)."""
    rnd = sota_utils("rnd", "utils_mujoco.py")
    return functools.partial(with_rnd, ppo_mujoco_maker(), rnd.make_rnd_networks)


MAKERS = {
    "dqn-cartpole": functools.partial(transformed, "CartPole-v1", dqn_transforms),
    "sac-pendulum": functools.partial(transformed, "Pendulum-v1", sac_transforms),
    "sac-halfcheetah": functools.partial(transformed, "HalfCheetah-v4", sac_transforms, max_episode_steps=30),
    "catframes-pendulum": functools.partial(transformed, "Pendulum-v1", stacked_transforms),
    "normalized-pendulum": functools.partial(transformed, "Pendulum-v1", normalized_transforms),
    "reshaped-pendulum": functools.partial(transformed, "Pendulum-v1", reshaping_transforms),
}
#: TorchRL's own makers, read from its scripts (their module is loaded when the test runs)
SOTA_MAKERS = {"ppo-mujoco": ppo_mujoco_maker, "impala-atari": impala_maker, "rnd-mujoco": rnd_mujoco_maker}


def needs(name: str) -> None:
    if "halfcheetah" in name:
        pytest.importorskip("mujoco")


@pytest.mark.parametrize("name", [*MAKERS, *SOTA_MAKERS])
def test_per_env_transforms_give_torchrls_data_natively(name, no_leaks):
    """A ``SerialEnv`` of 4 and a ``ParallelEnv`` of 2 workers x 2 envs of the same constructor against TorchRL's
    ``SerialEnv`` of 4: a 120-step ``step_and_maybe_reset`` loop with episode ends (lives lost, on Atari),
    step-count truncations and a partial reset; every env on the native road. An env's random draws
    (``NoopResetEnv``) come from its process's torch RNG, seeded by ``set_seed`` with its first env's seed: so with
    them, one worker of 4 envs here and this process's RNG seeded the same way for TorchRL's."""
    needs(name)
    make = MAKERS[name] if name in MAKERS else SOTA_MAKERS[name]()
    draws = name == "impala-atari"
    theirs_env = TorchRLSerialEnv(4, make)
    try:
        actions = actions_for(theirs_env, STEPS)
        theirs, theirs_partial = run_loop(theirs_env, actions, seed_this_process=draws)
    finally:
        theirs_env.close()
    ended = theirs["next", "end-of-life"] if draws else theirs["next", "done"]
    assert ended.any(), "the loop must see episodes (or lives) end"
    workers = 1 if draws else 2
    for ours_env in (SerialEnv(4, make), ParallelEnv(workers, make, envs_per_worker=4 // workers)):
        try:
            assert ours_env.roads() == [NATIVE] * 4
            ours, ours_partial = run_loop(ours_env, actions, seed_this_process=draws)
        finally:
            ours_env.close()
        assert_same(ours, theirs, f"{type(ours_env).__name__} steps")
        assert_same(ours_partial, theirs_partial, f"{type(ours_env).__name__} partial reset")


def test_a_step_of_some_envs_steps_only_their_transforms(no_leaks):
    """A ``"_step"`` entry steps those envs only: their step counts, returns and frame stacks move on, the others'
    stay (an env just reset keeps its root, its ``"is_init"`` too, while another ends), as on TorchRL's ``SerialEnv``
    (its per-env transforms step with their env)."""
    make = MAKERS["catframes-pendulum"]
    envs = {"theirs": TorchRLSerialEnv(3, make), "ours": SerialEnv(3, make),
            "parallel": ParallelEnv(1, make, envs_per_worker=3)}
    out = {}
    try:
        assert envs["ours"].roads() == [NATIVE] * 3
        for label, env in envs.items():
            env.set_seed(1)
            root = env.reset()
            steps = []
            for t, action in enumerate(actions_for(env, 80)):
                root.update(action)
                # env 1 ends (its step count) at t = 74, while env 2, which ended at t = 73, waits for t = 76
                root.set("_step", torch.tensor([t % 2 == 1, True, t % 3 == 1]))
                stepped, root = env.step_and_maybe_reset(root)
                steps.append(stepped.exclude("_step").clone())
            out[label] = torch.stack(steps)
    finally:
        for env in envs.values():
            env.close()
    counts = out["theirs"]["next", "step_count"]
    assert not torch.equal(counts[:, 0], counts[:, 1]), "the envs must have stepped apart"
    assert_same(out["ours"], out["theirs"], "SerialEnv, partial steps")
    assert_same(out["parallel"], out["theirs"], "ParallelEnv, partial steps")


def test_what_has_no_native_op_keeps_torchrls_step_and_says_why(no_leaks):
    env = SerialEnv(2, functools.partial(transformed, "CartPole-v1", lambda: Compose(NotNative(), StepCounter())))
    try:
        roads = env.roads()
        env.rollout(5)
    finally:
        env.close()
    assert roads == ["TorchRL's step: per-env transforms: NotNative has no native version"] * 2


def test_a_primer_keeps_torchrls_step_and_says_why(no_leaks):
    """``TensorDictPrimer`` carries the step's input entries forward (a policy's recurrent state): TorchRL's step."""
    from torchrl.data import Unbounded
    from torchrl.envs import TensorDictPrimer

    from tdcollect.envs.transforms.ops import PRIMER_REASON

    def make():
        return transformed("CartPole-v1", lambda: Compose(TensorDictPrimer(hidden=Unbounded(shape=(4,))),
                                                         StepCounter()))

    env = SerialEnv(2, make)
    try:
        roads = env.roads()
        assert env.rollout(5)["next", "hidden"].shape == (2, 5, 4)
    finally:
        env.close()
    assert roads == [f"TorchRL's step: per-env transforms: {PRIMER_REASON}"] * 2


def test_per_env_transforms_with_other_settings_keep_torchrls_step(no_leaks):
    """Envs whose transforms differ in their settings (here the step limit) cannot share one op: TorchRL's step."""
    makers = [functools.partial(transformed, "CartPole-v1", functools.partial(StepCounter, limit))
              for limit in (5, 9)]
    env = SerialEnv(2, makers)
    try:
        assert env.roads() == ["TorchRL's step: per-env transforms with other settings in different envs"] * 2
    finally:
        env.close()


class StepPolicy(nn.Module):
    """An action from the env's step count alone (no RNG: TorchRL's collectors and ours get the same actions, on
    every maker here: each counts its steps): a one-hot index, or a point between a box's bounds."""

    def __init__(self, spec):
        super().__init__()
        self.n = spec.space.n if isinstance(spec, OneHot) else None
        self.dtype = spec.dtype
        if self.n is None:
            self.register_buffer("low", spec.space.low.clone())
            self.register_buffer("high", spec.space.high.clone())

    def forward(self, step_count):
        if self.n is not None:
            index = (step_count.squeeze(-1) * 7 + 3) % self.n
            return torch.nn.functional.one_hot(index, self.n).to(self.dtype)
        fraction = ((step_count * 5) % 11).to(self.low.dtype) / 10
        return (self.low + (self.high - self.low) * fraction).to(self.dtype)


def policy_of(env) -> TensorDictModule:
    return TensorDictModule(StepPolicy(env.full_action_spec["action"]), in_keys=["step_count"], out_keys=["action"])


def maker_of(name: str):
    needs(name)
    return MAKERS[name] if name in MAKERS else SOTA_MAKERS[name]()


def seeded(make, seed: int):
    """``make()`` seeded (its env, and this process's torch RNG) before anything resets it."""
    env = make()
    env.set_seed(seed)
    torch.manual_seed(seed)
    return env


def ended(data) -> torch.Tensor:
    """Episode ends, or lives lost (Atari)."""
    if ("next", "end-of-life") in data.keys(True, True):
        return data["next", "end-of-life"]
    return data["next", "done"]


@pytest.mark.parametrize("name", [*MAKERS, *SOTA_MAKERS])
def test_a_one_env_collector_gives_torchrls_batches_natively(name, no_leaks):
    """``Collector(make_env(), policy)``: one env, on the native road in this process, against TorchRL's
    ``Collector`` of the same env and policy (three batches of 40 frames, episode ends among them)."""
    make = maker_of(name)
    kwargs = {"frames_per_batch": 40, "total_frames": 120}
    batches, envs = {}, {}
    for label, cls in (("theirs", TorchRLCollector), ("ours", Collector)):
        env = envs[label] = make()
        env.set_seed(5)  # (before the collector's first reset: TorchRL's set_seed does not start new episodes)
        torch.manual_seed(5)  # (NoopResetEnv's draws)
        collector = cls(env, policy_of(env), **kwargs)
        if label == "ours":
            roads = collector.env.roads()
        batches[label] = torch.cat([batch.clone() for batch in collector])
        collector.shutdown()
    assert roads == [NATIVE]
    assert ended(batches["theirs"]).any()
    assert_same(batches["ours"], batches["theirs"], "one-env Collector batches")
    assert_same_vecnorm_statistics(envs["ours"], envs["theirs"])
    del envs, env, collector  # (a VecNorm holds a multiprocessing lock: a semaphore, freed with it)
    gc.collect()


def test_a_one_env_collector_steps_an_env_without_a_native_road_as_it_is(no_leaks):
    """An env whose transforms have no native op takes TorchRL's step whatever wraps it: the one-env ``Collector``
    steps it as it is, as TorchRL's does (no one-env SerialEnv copying its outputs), with TorchRL's batches."""
    def make():
        return transformed("CartPole-v1", lambda: Compose(NotNative(), StepCounter(7)))

    batches = {}
    for label, cls in (("theirs", TorchRLCollector), ("ours", Collector)):
        env = make()
        env.set_seed(3)
        collector = cls(env, policy_of(env), frames_per_batch=30, total_frames=90)
        if label == "ours":
            stepped = collector.env
        batches[label] = torch.cat([batch.clone() for batch in collector])
        collector.shutdown()
        if label == "ours":
            assert stepped is env
            assert env.is_closed  # (closed by shutdown, as TorchRL's collector closes the env it was given)
    assert batches["ours"].batch_size == batches["theirs"].batch_size == (90,)
    assert ended(batches["theirs"]).any()
    assert_same(batches["ours"], batches["theirs"], "one-env Collector batches on TorchRL's step")


def assert_same_vecnorm_statistics(ours, theirs) -> None:
    """A per-env ``VecNorm``'s statistics are the env's own, where a script reads them (PPO-MuJoCo saves its
    ``loc`` / ``scale``): equal to TorchRL's after the same steps."""
    norms = [[part for part in env.transform if isinstance(part, VecNorm)] for env in (ours, theirs)]
    for mine, reference in zip(*norms):
        assert_same(mine._td, reference._td, "VecNorm statistics")
        for a, b in zip(mine._get_loc_scale(), reference._get_loc_scale()):
            assert_same(a, b, "VecNorm loc / scale")


@pytest.mark.parametrize("name", ["sac-pendulum", "ppo-mujoco", "impala-atari", "rnd-mujoco"])
def test_multisync_batches_equal_the_serial_envs_native_data(name, no_leaks):
    """``MultiSyncCollector([make_env] * 2, policy)``: each worker's env on the native road; its batches hold the
    data of TorchRL's ``SerialEnv`` of the same constructor stepped with the same actions (each worker's constructor
    seeds its env and its process's torch RNG, whose draws ``NoopResetEnv`` takes, before the first reset)."""
    make = maker_of(name)
    probe = make()
    policy = policy_of(probe)
    probe.close()
    del probe  # (its VecNorm's lock: a semaphore, freed with it)
    gc.collect()
    makers = [functools.partial(seeded, make, seed) for seed in (4, 5)]
    collector = MultiSyncCollector(makers, policy, frames_per_batch=60, total_frames=60, cat_results="stack")
    try:
        batch = next(iter(collector))
        roads = collector.map_fn("env.roads")  # one list per worker
    finally:
        collector.shutdown()
    assert roads == [[NATIVE], [NATIVE]]
    for worker in range(2):
        env = TorchRLSerialEnv(1, makers[worker])
        try:
            root = env.reset()
            steps = []
            for _ in range(batch.shape[-1]):
                stepped, root = env.step_and_maybe_reset(policy(root))
                steps.append(stepped.clone())
        finally:
            env.close()
        theirs = torch.stack(steps, -1)[0]
        ours = batch[worker].exclude("collector")
        assert_same(ours.select(*theirs.keys(True, True)), theirs, f"worker {worker}'s batch")


def test_the_reset_root_holds_the_transforms_entries(no_leaks):
    """The root a policy reads holds the transforms' entries (``"step_count"``, ``"episode_reward"``, ...) as TorchRL's
    ``TransformedEnv`` gives them after a reset."""
    make = MAKERS["dqn-cartpole"]
    ours, theirs = SerialEnv(2, make), TorchRLSerialEnv(2, make)
    try:
        for env in (ours, theirs):
            env.set_seed(0)
        assert_same(ours.reset(), theirs.reset(), "reset")
    finally:
        ours.close()
        theirs.close()


def test_a_per_env_vecnorm_keeps_each_envs_statistics_in_its_own_transform():
    """The ``VecNorm`` op over 2 rows against 2 of TorchRL's ``VecNorm`` called on each env's entries: the same
    outputs, the statistics in each env's own transform (its ``loc``), statistics it held already going on, and a
    frozen one taking no update."""
    from tensordict import TensorDict

    from tdcollect.envs.transforms.ops import op_for

    def vecnorm():
        return VecNorm(in_keys=["observation"], decay=0.9, eps=1e-2, new_api=False)

    theirs = [vecnorm(), vecnorm()]
    owners = [vecnorm(), vecnorm()]
    warm = TensorDict({"observation": torch.tensor([0.5, -1.0], dtype=torch.float64)}, [])
    for transform in (theirs[1], owners[1]):  # env 1's VecNorm holds statistics already
        transform._call(warm.clone())
    op = op_for(owners[0], 2, torch.float32)
    op.adopt(owners)
    torch.manual_seed(0)
    for step in range(6):
        if step == 3:
            theirs[0].freeze()
            owners[0].freeze()
        values = torch.randn(2, 2, dtype=torch.float64)
        data = {"observation": values}
        op.step(data)
        for i in range(2):
            reference = theirs[i]._call(TensorDict({"observation": values[i].clone()}, []))["observation"]
            assert torch.equal(data["observation"][i], reference), (step, i)
    for mine, reference in zip(owners, theirs):
        assert_same(mine._td, reference._td, "statistics")
        assert_same(mine.loc, reference.loc, "loc")
