"""Collector and MultiSyncCollector: batches, policies, weights, seeding, TorchRL arguments."""
import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tests.helpers import CountingEnv, cartpole

pytestmark = pytest.mark.timeout(90)
KEYS = {"observation", "action", "done", "terminated", "truncated", ("next", "observation"), ("next", "reward"),
        ("next", "done"), ("next", "terminated"), ("next", "truncated"), ("collector", "traj_ids")}


def mlp_policy():
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    return TensorDictModule(ArgMax(net), ["observation"], ["action"])


class ArgMax(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x).argmax(-1)


class ConstantAction(nn.Module):
    """Picks argmax of a bias: the action is fully decided by the weights (for weight-update tests)."""

    def __init__(self, n_actions=3, favourite=0):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_actions))
        with torch.no_grad():
            self.bias[favourite] = 1.0

    def forward(self, obs):
        return (obs[..., :1] * 0 + self.bias).argmax(-1)


@pytest.mark.parametrize("env_kind", ["parallel", "serial", "factory"])
def test_collector_batches(env_kind, no_leaks):
    env = {"parallel": lambda: ParallelEnv(2, cartpole, envs_per_worker=2),
           "serial": lambda: SerialEnv(4, cartpole), "factory": lambda: cartpole}[env_kind]()
    collector = Collector(env, mlp_policy(), frames_per_batch=64, total_frames=256)
    batches = list(collector)
    shape = (64,) if env_kind == "factory" else (4, 16)  # TorchRL's layout: [T] for an unbatched env
    assert len(batches) == len(collector) == 4
    for batch in batches:
        assert batch.batch_size == shape and batch.numel() == 64
        assert set(batch.keys(True, True)) == KEYS
    assert collector.frames == 256
    collector.shutdown()
    if env_kind != "factory":
        assert env.is_closed is True  # as TorchRL's: closed once the total frames are collected
        env.close()


def test_consecutive_batches_continue_trajectories(no_leaks):
    with Collector(SerialEnv(3, functools.partial(CountingEnv, episode_len=7)), None, frames_per_batch=15,
                   total_frames=60) as collector:
        previous = None
        for batch in collector:
            obs, ids = batch["observation"][..., 0], batch["collector", "traj_ids"]
            if previous is not None:
                prev_obs, prev_ids, prev_done = previous
                continuing = ~prev_done
                assert torch.equal(ids[continuing, 0], prev_ids[continuing])
                assert torch.equal(obs[continuing, 0], prev_obs[continuing] + 1)
                assert (obs[prev_done, 0] == 0).all()
            previous = (obs[:, -1], ids[:, -1], batch["next", "done"][:, -1, 0])
            # a new id exactly where an episode started
            starts = batch["observation"][..., 0] == 0
            changed = torch.cat([torch.zeros(3, 1, dtype=torch.bool), ids[:, 1:] != ids[:, :-1]], 1)
            assert torch.equal(changed[:, 1:], starts[:, 1:])


def test_episode_stats_match_rewards(no_leaks):
    # CountingEnv: reward = action; with the constant policy (action 2) an episode of 4 steps returns 8
    with Collector(SerialEnv(2, functools.partial(CountingEnv, episode_len=4)), ConstantAction(3, 2),
                   frames_per_batch=6, total_frames=30) as collector:
        returns, lengths = [], []
        for _ in collector:
            returns += collector.episode_stats["returns"].tolist()
            lengths += collector.episode_stats["lengths"].tolist()
    assert returns and set(returns) == {8.0} and set(lengths) == {4}
    assert len(returns) == 2 * (30 // 2 // 4)


@pytest.mark.parametrize("policy_kind", ["none", "module", "callable", "tdmodule"])
def test_policy_kinds(policy_kind, no_leaks):
    policy = {"none": None, "module": ArgMax(nn.Linear(4, 2)),
              "callable": lambda td: td.set("action", torch.ones(td.shape[0], dtype=torch.int64)),
              "tdmodule": mlp_policy()}[policy_kind]
    with Collector(SerialEnv(2, cartpole), policy, frames_per_batch=20, total_frames=20) as collector:
        batch = next(iter(collector))
    assert batch["action"].dtype == torch.int64 and ((batch["action"] == 0) | (batch["action"] == 1)).all()
    if policy_kind == "callable":
        assert (batch["action"] == 1).all()


def test_frames_per_batch_is_rounded_up_to_a_multiple_of_envs_with_torchrls_warning(no_leaks):
    with pytest.warns(UserWarning, match=r"frames_per_batch \(10\) is not exactly divisible by the number of envs"):
        collector = Collector(SerialEnv(3, cartpole), None, frames_per_batch=10, total_frames=10)
    with collector:
        assert next(iter(collector)).batch_size == (3, 4)


def test_torchrl_arguments(no_leaks):
    env = SerialEnv(2, functools.partial(CountingEnv, episode_len=100))
    with Collector(env, ConstantAction(3, 0), frames_per_batch=20, total_frames=60, init_random_frames=20,
                   max_frames_per_traj=4, reset_at_each_iter=True) as collector:
        batches = list(collector)
    assert (batches[0]["action"] != 0).any()  # random actions first
    assert (batches[1]["action"] == 0).all()
    for batch in batches:
        assert (batch["observation"][:, 0, 0] == 0).all()  # reset at each iteration
        assert batch["next", "truncated"][:, 3::4].all() and batch["next", "done"][:, 3::4].all()
        assert batch["observation"][..., 0].max() <= 3
    env.close()


def test_split_trajs(no_leaks):
    with Collector(SerialEnv(2, functools.partial(CountingEnv, episode_len=3)), None, frames_per_batch=16,
                   total_frames=16, split_trajs=True) as collector:
        batch = next(iter(collector))
    assert ("collector", "mask") in batch.keys(True, True)
    assert batch.shape[-1] == 3


def test_multisync_batches_and_keys(no_leaks):
    with MultiSyncCollector([cartpole] * 2, mlp_policy(), frames_per_batch=128, total_frames=512) as collector:
        batches = list(collector)
        assert len(batches) == len(collector) == 4
        assert collector.envs_per_worker == [1, 1]
    for batch in batches:
        assert batch.batch_size == (2, 64) and set(batch.keys(True, True)) == KEYS


@pytest.mark.parametrize("factory", [
    lambda: SerialEnv(2, cartpole),
    lambda: ParallelEnv(2, cartpole),
    lambda: __import__("torchrl.envs", fromlist=["GymEnv"]).GymEnv("CartPole-v1", categorical_action_encoding=True),
], ids=["serial", "parallel-in-process", "torchrl-gymenv"])
def test_multisync_env_kinds(factory, no_leaks):
    with MultiSyncCollector(factory, None, num_workers=2, frames_per_batch=40, total_frames=80) as collector:
        per_worker = collector.envs_per_worker[0]
        batch = next(iter(collector))
    # TorchRL's layout (cat_results="stack"): [workers, T] for unbatched envs, [workers, *env_batch, T] for batched
    steps = 40 // (2 * per_worker)
    shape = (2, steps) if per_worker == 1 else (2, per_worker, steps)
    assert batch.batch_size == shape
    assert batch["next", "reward"].shape == (*shape, 1)


def test_weight_updates_reach_every_worker(no_leaks):
    policy = ConstantAction(3, favourite=0)
    factory = functools.partial(CountingEnv, episode_len=50)
    with MultiSyncCollector([factory] * 2, policy, frames_per_batch=20, total_frames=-1) as collector:
        it = iter(collector)
        assert (next(it)["action"] == 0).all()
        assert collector.weight_versions == [0, 0]
        with torch.no_grad():  # as TorchRL's on the CPU: the workers act with the trainer's own tensors
            policy.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        assert (next(it)["action"] == 2).all(), "every worker must act with the trainer's weights"
        assert collector.weight_versions == [0, 0], "no new version is marked before update_policy_weights_"
        collector.update_policy_weights_()
        next(it)
        assert collector.weight_versions == [1, 1]
        collector.update_policy_weights_(TensorDict({"bias": torch.tensor([0.0, 1.0, 0.0])}, []))
        assert (next(it)["action"] == 1).all()
        assert policy.bias.tolist() == [0.0, 1.0, 0.0], "the given weights are the trainer's module's too"


def test_async_batches_never_follow_one_with_newer_weights(no_leaks):
    """A batch in flight when the weights change comes before any batch collected with the new ones (TorchRL's
    order), even when the worker holding it is the slow one."""
    from tdcollect.collectors import MultiAsyncCollector
    from tests.helpers import SlowEnv

    fast, slow = functools.partial(CountingEnv, episode_len=50), functools.partial(SlowEnv, delay=0.01)
    with MultiAsyncCollector([fast, slow], ConstantAction(3), frames_per_batch=10, total_frames=-1,
                             track_policy_version=True) as collector:
        it = iter(collector)
        for _ in range(3):
            next(it)
        collector.update_policy_weights_()
        # the slow worker's batch in flight takes ~0.1 s, the fast one's a few ms: many of them are ready first
        versions = [int(next(it)["next", "policy_version"].max()) for _ in range(60)]
    assert versions == sorted(versions) and versions[-1] == 1, versions


def test_same_seed_same_batches(no_leaks):
    runs = []
    for _ in range(2):
        with MultiSyncCollector([cartpole] * 2, None, frames_per_batch=40, total_frames=80) as collector:
            collector.set_seed(3)
            runs.append(torch.cat([b["observation"] for b in collector]))
    assert torch.equal(runs[0], runs[1])
    with Collector(SerialEnv(2, cartpole), None, frames_per_batch=40, total_frames=80) as collector:
        collector.set_seed(3)
        serial = torch.cat([b["observation"] for b in collector])
    assert serial.shape == runs[0].shape


def test_direct_module_path_equals_tensordict_module():
    from tdcollect.collectors.policies import UnwrappedModule, make_policy

    module = mlp_policy()
    policy = make_policy(module, None)
    assert isinstance(policy, UnwrappedModule)
    td = TensorDict({"observation": torch.randn(5, 4)}, [5])
    assert torch.equal(policy(td.clone())["action"], module(td.clone())["action"])
    # a module whose out keys were selected (two outputs, one kept) must not take the shortcut: it writes "a" only
    selected = TensorDictModule(TwoOutputs(), ["observation"], ["a", "b"]).select_out_keys("a")
    policy = make_policy(selected, None)
    assert not isinstance(policy, UnwrappedModule)
    out = policy(td.clone())
    assert "a" in out.keys() and "b" not in out.keys()


class TwoOutputs(nn.Module):
    def forward(self, observation):
        return observation[..., :2], observation[..., 2:]


class SampleWithLogits(nn.Module):
    """Samples the action from a linear layer's logits; returns (action, logits)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, obs):
        logits = self.linear(obs)
        return torch.multinomial(logits.softmax(-1), 1).squeeze(-1), logits


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_direct_module_collects_what_the_tensordict_path_collects(cls, no_leaks):
    """A plain TensorDictModule runs on the env's buffer tensors (no TensorDict per step); the batches must
    be those of the same module called through a TensorDict (several outputs, sampling, episode ends)."""
    torch.manual_seed(0)
    module = TensorDictModule(SampleWithLogits(), ["observation"], ["action", "logits"])
    batches = []
    for policy in (module, lambda td: module(td)):
        if cls is Collector:
            collector = Collector(SerialEnv(2, cartpole), policy, frames_per_batch=128, total_frames=256)
        else:
            collector = MultiSyncCollector([functools.partial(SerialEnv, 2, cartpole)] * 2, policy,
                                           frames_per_batch=128, total_frames=256)
        collector.set_seed(3)
        torch.manual_seed(3)  # (the policy samples in this process for Collector: its RNG is the caller's)
        batches.append([b.clone() for b in collector])
        collector.shutdown()
    for direct, generic in zip(*batches):
        assert "logits" in direct.keys() and direct["next", "done"].any()
        assert (direct == generic).all()


@pytest.mark.parametrize("cls", ["Collector", "MultiSyncCollector"])
def test_set_seed_between_batches_starts_new_trajectories(cls, no_leaks):
    long_counting = functools.partial(CountingEnv, episode_len=100)
    if cls == "Collector":
        collector = Collector(SerialEnv(2, long_counting), None, frames_per_batch=8, total_frames=-1)
    else:
        collector = MultiSyncCollector([long_counting] * 2, None, frames_per_batch=8, total_frames=-1)
    with collector:
        it = iter(collector)
        first = next(it).clone()
        collector.set_seed(1)
        second = next(it)
    ids_before, ids_after = first["collector", "traj_ids"][:, -1], second["collector", "traj_ids"][:, 0]
    assert set(ids_before.tolist()).isdisjoint(ids_after.tolist())
    assert second["next", "observation"][:, 0, 0].tolist() == [1.0, 1.0]  # the episodes really restarted
