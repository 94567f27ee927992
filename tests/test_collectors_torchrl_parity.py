"""Our collectors beside TorchRL's on the same arguments: batch keys, dtypes and devices; ``compact_obs``,
``use_buffers``, ``fake_tensordict()``; per-worker policy factories and weights."""
import functools

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.envs import GymWrapper, InitTracker, TransformedEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv, DiscreteActionVecMockEnv
from torchrl.weight_update import SharedMemWeightSyncScheme

from tdcollect.collectors import Collector, MultiSyncCollector

pytestmark = pytest.mark.timeout(120)


def tracked_env():
    return TransformedEnv(ContinuousActionVecMockEnv(), InitTracker())


def keys_of(batch) -> set:
    return set(batch.keys(True, True))


@pytest.mark.parametrize("compact_obs", [False, True])
@pytest.mark.parametrize("use_buffers", [True, False])
def test_compact_obs_and_use_buffers_give_torchrls_keys(compact_obs, use_buffers, no_leaks):
    kwargs = {"frames_per_batch": 10, "total_frames": 10, "compact_obs": compact_obs, "use_buffers": use_buffers}
    policy = RandomPolicy(tracked_env().action_spec)
    theirs = TorchRLCollector(tracked_env, policy, **kwargs)
    try:
        reference = next(iter(theirs))
    finally:
        theirs.shutdown()
    with Collector(tracked_env, policy, **kwargs) as ours:
        mine = next(iter(ours))
        fake = ours.fake_tensordict()
    assert keys_of(mine) == keys_of(reference)
    assert (("next", "observation") in keys_of(mine)) is not compact_obs
    assert mine.batch_size == reference.batch_size == fake.batch_size and fake.names == mine.names
    assert keys_of(fake) == keys_of(mine)
    assert all(not leaf.any() for leaf in fake.values(True, True)), "fake_tensordict() is zeros"


class OneHotInt64Policy(nn.Module):
    """Writes int64 one-hot actions (the env's spec is bool): the batch keeps what the policy wrote, as TorchRL's."""

    def forward(self, tensordict):
        obs = tensordict["observation"]
        return tensordict.set("action", nn.functional.one_hot(obs.argmax(-1), obs.shape[-1]))


def test_batch_holds_the_actions_in_the_policys_dtype(no_leaks):
    with Collector(DiscreteActionVecMockEnv, OneHotInt64Policy(), frames_per_batch=5, total_frames=5) as ours:
        batch = next(iter(ours))
    assert batch["action"].dtype == torch.int64 and (batch["action"].sum(-1) == 1).all()


class DeviceCheckingPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, tensordict):
        self.seen.append(tensordict.device)
        return tensordict.set("action", torch.zeros(tensordict.shape + (7,)))


@pytest.mark.parametrize("kwargs, policy_sees, batch_device", [
    ({}, None, None),
    ({"policy_device": "cpu"}, torch.device("cpu"), None),
    ({"device": "cpu"}, torch.device("cpu"), torch.device("cpu")),
    ({"policy_device": "cpu", "env_device": "cpu"}, torch.device("cpu"), torch.device("cpu")),
])
def test_devices_of_the_policys_tensordicts_and_of_batches(kwargs, policy_sees, batch_device, no_leaks):
    policy = DeviceCheckingPolicy()
    with Collector(ContinuousActionVecMockEnv, policy, frames_per_batch=3, total_frames=3, **kwargs) as ours:
        batch = next(iter(ours))
    assert set(policy.seen) == {policy_sees}
    assert batch.device == batch_device


def bias_policy(value: float):
    """A factory: a linear policy whose action is ``value`` everywhere."""
    module = nn.Linear(7, 7)
    with torch.no_grad():
        module.weight.zero_()
        module.bias.fill_(value)
    return TensorDictModule(module, ["observation"], ["action"])


def test_a_policy_factory_per_worker_and_per_worker_weights(no_leaks):
    factories = [functools.partial(bias_policy, float(w)) for w in range(2)]
    with MultiSyncCollector([ContinuousActionVecMockEnv] * 2, policy_factory=factories, frames_per_batch=10,
                            weight_sync_schemes={"policy": SharedMemWeightSyncScheme(per_worker_weights=True)},
                            check_actions=False) as collector:
        it = iter(collector)
        actions = next(it)["action"]
        assert (actions[0] == 0).all() and (actions[1] == 1).all()
        weights = TensorDict({"module": {"weight": torch.zeros(7, 7), "bias": torch.full((7,), 5.0)}})
        collector.update_policy_weights_({1: weights})
        actions = next(it)["action"]
        assert (actions[0] == 0).all() and (actions[1] == 5).all(), "only worker 1 loads the weights"
    with pytest.raises(ValueError, match="one per worker"):
        MultiSyncCollector([ContinuousActionVecMockEnv] * 2, policy_factory=factories[:1], frames_per_batch=10)
    with pytest.raises(ValueError, match="per-worker weights"):
        MultiSyncCollector([ContinuousActionVecMockEnv] * 2, bias_policy(0.0), frames_per_batch=10,
                           weight_sync_schemes={"policy": SharedMemWeightSyncScheme(per_worker_weights=True)})


@pytest.mark.parametrize("close_env", [True, False])
def test_shutdown_closes_an_env_given_as_an_instance_as_torchrls_does(close_env, no_leaks):
    """TorchRL's ``Collector.shutdown()`` closes the env it was given (a script that then calls ``env.close()``
    gets TorchRL's "closed environment" error); ``close_env=False`` leaves it open, unless the collector collected
    its total frames (TorchRL's closes its env then). Ours does the same, on a batched env given as an instance
    (each its own library's ``SerialEnv``: TorchRL's ``ParallelEnv`` would spawn fresh interpreters for the same
    check); a collector built from a constructor always closes its env."""
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    from tdcollect.envs import ParallelEnv, SerialEnv

    closed = {}
    for name, collector_cls, env_cls in (("theirs", TorchRLCollector, TorchRLSerialEnv),
                                         ("ours", Collector, SerialEnv)):
        env = env_cls(2, DiscreteActionVecMockEnv)
        try:
            collector = collector_cls(env, None, frames_per_batch=10, total_frames=100)
            next(iter(collector))
            collector.shutdown(close_env=close_env)
            closed[name, "shut down"] = env.is_closed
            env.rollout(2)  # a closed env starts again on use
            collector = collector_cls(env, None, frames_per_batch=10, total_frames=20)
            for _ in collector:
                pass
            closed[name, "all frames"] = env.is_closed
            collector.shutdown(close_env=False)
        finally:
            if not env.is_closed:
                env.close()
    assert closed == {(name, when): close_env if when == "shut down" else True
                      for name in ("theirs", "ours") for when in ("shut down", "all frames")}
    built = Collector(functools.partial(ParallelEnv, 2, DiscreteActionVecMockEnv), None, frames_per_batch=10,
                      total_frames=10)
    built.shutdown(close_env=False)
    assert built.env.is_closed


def test_a_one_env_policy_output_that_is_an_input_tensor_is_kept(no_leaks):
    """A one-env collector's policy may write an input tensor itself under a new key (an identity copier, as in
    TorchRL's ``test_excluded_keys``): the batch holds that key, as TorchRL's does."""
    copier = TensorDictModule(lambda x: x, in_keys=["observation"], out_keys=["copied"])
    policy = TensorDictSequential(TensorDictModule(nn.Linear(7, 7), ["observation"], ["action"]), copier)
    with Collector(ContinuousActionVecMockEnv(), policy, frames_per_batch=4, total_frames=4) as ours:
        batch = next(iter(ours))
    assert torch.equal(batch["copied"], batch["observation"])


def test_our_collectors_are_torchrls_base_collectors():
    """TorchRL's trainers check ``isinstance(collector, BaseCollector)`` before they take one: ours pass it."""
    from torchrl.collectors import BaseCollector

    from tdcollect.collectors import AsyncCollector, MultiAsyncCollector

    for cls in (Collector, MultiSyncCollector, MultiAsyncCollector, AsyncCollector):
        assert issubclass(cls, BaseCollector), cls
    with Collector(DiscreteActionVecMockEnv, None, frames_per_batch=5, total_frames=5) as ours:
        assert isinstance(ours, BaseCollector)


def test_a_process_collector_takes_a_batched_env_instance_as_torchrls_does(no_leaks):
    """A ``ParallelEnv`` instance given to a process collector (TorchRL's trainer configs do it) is copied into
    each worker: a new env of the same constructors there (ours pickle as TorchRL's batched envs do)."""
    from torchrl.envs import GymEnv

    from tdcollect.envs import ParallelEnv

    env = ParallelEnv(1, functools.partial(GymEnv, "CartPole-v1"))
    try:
        with MultiSyncCollector([env, env], None, frames_per_batch=20, total_frames=40) as ours:
            batches = list(ours)
    finally:
        env.close()
    assert [tuple(batch.batch_size) for batch in batches] == [(2, 1, 10), (2, 1, 10)]  # (as TorchRL's layout)


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_getattr_env_policy_and_rb_as_torchrls(kind, no_leaks):
    """TorchRL's SAC and CQL trainers read ``collector.getattr_env("full_action_spec_unbatched")``."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    policy = bias_policy(0.5)
    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    make = ContinuousActionVecMockEnv
    if kind == "Collector":
        collector = Collector(make, policy, frames_per_batch=10, total_frames=10, replay_buffer=buffer)
    else:
        collector = MultiSyncCollector([make, make], policy, frames_per_batch=10, total_frames=10,
                                       replay_buffer=buffer)
    with collector:
        assert collector.getattr_env("full_action_spec_unbatched") == make().full_action_spec_unbatched
        assert collector.getattr_policy("out_keys") == ["action"]
        assert collector.getattr_rb("storage") is buffer.storage
        with pytest.raises(AttributeError):
            collector.getattr_env("no_such_attribute")


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_an_exploration_module_without_a_spec_gets_the_envs(kind, no_leaks):
    """TorchRL's TD3 trainer config builds ``AdditiveGaussianModule(spec=None)``: TorchRL's collectors give it the
    env's action spec before they call the policy; ours too (else: "spec has not been set")."""
    from torchrl.modules import AdditiveGaussianModule

    policy = TensorDictSequential(bias_policy(0.5), AdditiveGaussianModule(spec=None, sigma_init=0.1))
    make = ContinuousActionVecMockEnv
    collector = (Collector(make, policy, frames_per_batch=10, total_frames=10) if kind == "Collector" else
                 MultiSyncCollector([make, make], policy, frames_per_batch=10, total_frames=10))
    with collector:
        batch = next(iter(collector))
    assert batch["action"].shape[-1] == 7
    assert not torch.equal(batch["action"], torch.full_like(batch["action"], 0.5))  # the noise was added


def noisy_bias_policy(width: int):
    from torchrl.modules import AdditiveGaussianModule

    module = nn.Linear(width, 1)
    with torch.no_grad():
        module.weight.zero_()
        module.bias.fill_(0.5)
    return TensorDictSequential(TensorDictModule(module, ["observation"], ["action"]),
                                AdditiveGaussianModule(spec=None, sigma_init=0.1))


def test_set_seed_seeds_the_env_and_leaves_the_callers_rng_as_torchrls(no_leaks):
    """TorchRL's ``Collector.set_seed`` seeds its env, not the torch RNG of the caller's process: the random
    actions of ``init_random_frames`` and a noisy policy's draws go on from the user's own ``torch.manual_seed``,
    so ours draws the same actions as TorchRL's after the same seeds (seeding the RNG with the env's seed here
    gave other actions, and the same noise whatever seed the user picked). A gymnasium env: its reset draws
    nothing from torch."""
    from torchrl.envs import GymEnv

    actions, states = {}, {}
    for name, cls in (("torchrl", TorchRLCollector), ("ours", Collector)):
        torch.manual_seed(0)
        collector = cls(GymEnv("Pendulum-v1"), noisy_bias_policy(3), frames_per_batch=10, total_frames=30,
                        init_random_frames=10)
        collector.set_seed(7)
        states[name] = torch.get_rng_state()
        actions[name] = torch.cat([batch["action"] for batch in collector])
        collector.shutdown()
    assert torch.equal(states["ours"], states["torchrl"])
    assert torch.equal(actions["ours"], actions["torchrl"])
    assert not torch.equal(actions["ours"][:10], actions["ours"][10:20])  # (random, then the noisy policy)


def construction_policies(env) -> dict:
    """Policies TorchRL's ``Collector`` calls when it is built (no policy; a sampling actor whose spec does not name
    its outputs; a noise module after an actor) and does not (an actor whose spec names its output)."""
    from tensordict.nn import NormalParamExtractor
    from torchrl.modules import Actor, AdditiveGaussianModule, ProbabilisticActor, TanhNormal

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 2), NormalParamExtractor())
    sampling = ProbabilisticActor(TensorDictModule(net, ["observation"], ["loc", "scale"]), in_keys=["loc", "scale"],
                                  distribution_class=TanhNormal, spec=env.action_spec, return_log_prob=True)
    actor = Actor(nn.Linear(3, 1), spec=env.action_spec_unbatched)
    noisy = TensorDictSequential(Actor(nn.Linear(3, 1), spec=env.action_spec_unbatched),
                                 AdditiveGaussianModule(spec=env.action_spec_unbatched))
    return {"none": None, "sampling": sampling, "actor": actor, "noisy": noisy}


@pytest.mark.parametrize("kind", ["none", "sampling", "actor", "noisy"])
def test_construction_draws_from_the_callers_rng_what_torchrls_draws(kind, no_leaks):
    """TorchRL's ``Collector`` calls the policy once when built unless its spec names its outputs (no policy: its
    ``RandomPolicy`` draws an action; a noise module draws noise); our probe for the buffers drew from the caller's
    RNG whatever the policy: a seeded script's first actions were other than TorchRL's. Same generator state after
    construction, same first batch."""
    from torchrl.envs import GymEnv

    states, batches = {}, {}
    for name, cls in (("torchrl", TorchRLCollector), ("ours", Collector)):
        env = GymEnv("Pendulum-v1")
        env.set_seed(5)
        policy = construction_policies(env)[kind]
        torch.manual_seed(1)
        collector = cls(env, policy, frames_per_batch=8, total_frames=8)
        states[name] = torch.get_rng_state()
        batches[name] = next(iter(collector))
        collector.shutdown()
    assert torch.equal(states["ours"], states["torchrl"])
    for key in ("observation", "action", ("next", "observation"), ("next", "reward")):
        assert torch.equal(batches["ours"][key], batches["torchrl"][key]), key


class NumpyDrawingEnv(gymnasium.Env):
    """A gymnasium env whose first observation comes from numpy's global RNG (as many hand-written envs do)."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.value = np.random.uniform(-1.0, 1.0, (1,)).astype(np.float32)
        return self.value, {}

    def step(self, action):
        return self.value, 0.0, False, False, {}


def numpy_drawing_env():
    return GymWrapper(NumpyDrawingEnv())


def test_a_process_collectors_set_seed_seeds_numpy_in_its_workers_as_torchrls(no_leaks):
    """TorchRL's process collectors seed each worker's torch *and numpy* RNGs with the worker's seed: an env
    drawing from ``np.random`` gives the same data after the same ``set_seed``, whatever the parent's numpy state."""
    firsts = []
    for parent_seed in (1, 2):
        np.random.seed(parent_seed)  # (inherited by forked workers)
        with MultiSyncCollector([numpy_drawing_env] * 2, None, frames_per_batch=4, total_frames=4) as collector:
            collector.set_seed(3)
            firsts.append(next(iter(collector))["observation"])
    assert torch.equal(firsts[0], firsts[1])
    assert not torch.equal(firsts[0][0], firsts[0][1])  # (each worker its own seed)


@pytest.mark.parametrize("workers", [1, 4])
def test_collector_set_seed_goes_on_from_where_torchrls_does(workers, no_leaks):
    """TorchRL's ``Collector.set_seed`` on a built collector seeds the envs (a ``GymEnv``'s seeding is a reset of
    the gymnasium env) and steps on from there, its first step's ``"observation"`` still the one from before the
    seed. Ours starts each env's seeded episode (``seed_episodes``; its next reset started the episode after it):
    every value of the batches is TorchRL's but that first observation of each env, which is the seeded episode's
    own (what the gymnasium env's ``reset(seed=...)`` returns for that env's seed)."""
    from torchrl.envs import GymEnv
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    from tdcollect.envs import ParallelEnv
    from tdcollect.envs.engine.group import seed_chain

    def make():
        return GymEnv("Pendulum-v1")

    batches = {}
    for name, cls, env in (("torchrl", TorchRLCollector, TorchRLSerialEnv(workers, make)),
                           ("ours", Collector, ParallelEnv(workers, make))):
        torch.manual_seed(0)
        collector = cls(env, None, frames_per_batch=20 * workers, total_frames=40 * workers)
        collector.set_seed(11)
        batches[name] = [batch.clone() for batch in collector]
        collector.shutdown()
    ours, theirs = batches["ours"], batches["torchrl"]
    for key in theirs[0].keys(True, True):
        if key[0] == "collector" or key == "observation":
            continue
        for a, b in zip(ours, theirs):
            assert torch.equal(a[key], b[key]), key
    assert torch.equal(ours[1]["observation"], theirs[1]["observation"])
    assert torch.equal(ours[0]["observation"][:, 1:], theirs[0]["observation"][:, 1:])
    for i, seed in enumerate(seed_chain(11, workers)):
        seeded, _ = make()._env.reset(seed=seed)
        assert torch.equal(ours[0]["observation"][i, 0], torch.as_tensor(seeded, dtype=torch.float32)), i


@pytest.mark.parametrize("limit", [20, 7])
def test_max_frames_per_traj_resets_as_torchrls(limit, no_leaks):
    """``max_frames_per_traj`` at the env's own time limit (20: both end the episode at the same step) and below
    it: TorchRL resets each ended env once. Ours reset an env that ended at the limit twice (its own end's reset,
    then the limit's), so its next episodes started from other states than TorchRL's."""
    from torchrl.envs import DoubleToFloat, GymEnv
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    from tdcollect.envs import SerialEnv

    def make():
        return GymEnv("Pendulum-v1", max_episode_steps=20)

    batches = {}
    for name, cls, batched in (("torchrl", TorchRLCollector, TorchRLSerialEnv), ("ours", Collector, SerialEnv)):
        env = TransformedEnv(batched(2, make), DoubleToFloat())
        env.set_seed(3)
        torch.manual_seed(0)
        collector = cls(env, None, frames_per_batch=60, total_frames=120, max_frames_per_traj=limit)
        batches[name] = [batch.clone() for batch in collector]
        collector.shutdown()
    for ours, theirs in zip(batches["ours"], batches["torchrl"]):
        for key in theirs.keys(True, True):
            if key[0] != "collector":
                assert torch.equal(ours[key], theirs[key]), key


def _threads_at_each_batch(kind: str, ours: bool, batches: int = 3) -> tuple[list[int], bool, int]:
    """What a script that updates on every batch sees: torch's threads in this process at each batch (the last one
    included, before the loop is left), whether the env is closed by then (a ``Collector``'s), and the threads after
    shutdown. ``kind``: a ``Collector`` over a ``ParallelEnv`` of 2, or a ``MultiSyncCollector`` of 2 workers;
    ``ours``: tdcollect's classes, else TorchRL's."""
    from torchrl.collectors import MultiSyncCollector as TorchRLMultiSyncCollector
    from torchrl.envs import GymEnv
    from torchrl.envs import ParallelEnv as TorchRLParallelEnv

    from tdcollect.envs import ParallelEnv

    make = functools.partial(GymEnv, "Pendulum-v1")
    kwargs = {"frames_per_batch": 20, "total_frames": 20 * batches}
    env = None
    if kind == "Collector":
        env = (ParallelEnv if ours else TorchRLParallelEnv)(2, make)
        collector = (Collector if ours else TorchRLCollector)(env, None, **kwargs)
    else:
        collector = (MultiSyncCollector if ours else TorchRLMultiSyncCollector)([make] * 2, None, **kwargs)
    threads = []
    try:
        for _ in collector:
            threads.append(torch.get_num_threads())
        closed_at_last_batch = env is None or env.is_closed
    finally:
        collector.shutdown()
        if env is not None:
            env.close(raise_if_closed=False)
    return threads, closed_at_last_batch, torch.get_num_threads()


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_torch_threads_at_every_batch_and_after_are_torchrls(kind, no_leaks):
    """TorchRL's Collector closes its env inside the ``next()`` that returns the last batch, and closing TorchRL's
    ParallelEnv gives this process its torch threads back: a script's update on the last batch runs with them.
    TorchRL's MultiSyncCollector lowers them while its workers run and gives them back at shutdown. Ours: the same
    threads at every batch and after shutdown, and a Collector's env closed by its last batch."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        theirs = _threads_at_each_batch(kind, ours=False)
        torch.set_num_threads(2)
        ours = _threads_at_each_batch(kind, ours=True)
    finally:
        torch.set_num_threads(before)
    assert ours == theirs, (ours, theirs)
    assert ours[1]
