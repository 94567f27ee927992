"""Batches go straight into TorchRL's GAE, ClipPPOLoss and replay buffers; TorchRL envs and transforms work
in our collectors; TorchRL's own collector accepts our ParallelEnv."""
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import ParallelEnv
from tests.helpers import cartpole

pytestmark = pytest.mark.timeout(120)


def ppo_modules():
    actor_net = TensorDictModule(
        nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)), ["observation"], ["logits"]
    )
    actor = ProbabilisticActor(actor_net, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
                               return_log_prob=True)
    critic = ValueOperator(nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)), in_keys=["observation"])
    return actor, critic


def test_batch_into_gae_ppo_loss_and_replay_buffer(no_leaks):
    actor, critic = ppo_modules()
    with MultiSyncCollector([cartpole] * 2, actor, frames_per_batch=128, total_frames=128) as collector:
        batch = next(iter(collector))
    assert batch.batch_size == (2, 64)
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    with torch.no_grad():
        gae(batch)
    assert batch["advantage"].shape == (2, 64, 1) and torch.isfinite(batch["advantage"]).all()
    loss_module = ClipPPOLoss(actor, critic)
    losses = loss_module(batch.reshape(-1))
    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
    total.backward()
    assert all(p.grad is not None for p in actor.parameters())
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    buffer.extend(batch.reshape(-1))
    assert len(buffer) == 128 and buffer.sample(16).batch_size == (16,)


def test_torchrl_env_with_transform_in_our_collectors(no_leaks):
    def make():
        return TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=5))

    with MultiSyncCollector([make] * 2, None, frames_per_batch=40, total_frames=40) as collector:
        batch = next(iter(collector))
    assert ("next", "step_count") in batch.keys(True, True)
    assert batch["next", "step_count"].max() <= 5
    assert batch["next", "truncated"].any()
    with Collector(make, None, frames_per_batch=10, total_frames=10) as collector:
        assert next(iter(collector)).batch_size == (10,)  # TorchRL's layout for an unbatched env


def test_torchrl_collector_accepts_our_parallel_env(no_leaks):
    from torchrl.collectors import Collector as TorchRLCollector

    env = ParallelEnv(2, cartpole, envs_per_worker=2)
    actor, _ = ppo_modules()
    collector = TorchRLCollector(env, actor, frames_per_batch=64, total_frames=128)
    batches = list(collector)
    collector.shutdown()
    env.close()
    assert len(batches) == 2 and batches[0].numel() == 64
    assert ("next", "reward") in batches[0].keys(True, True)


def test_torchrl_pipeline_evaluates_after_its_collector_closed_our_env(no_leaks):
    """TorchRL's PPO tutorial pipeline: TorchRL's Collector closes the env at total_frames; the evaluation
    rollout after training (or at the last batch) must restart it, as TorchRL's ParallelEnv does."""
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs.utils import ExplorationType, check_env_specs, set_exploration_type

    env = TransformedEnv(ParallelEnv(2, cartpole, envs_per_worker=2), StepCounter())
    check_env_specs(env)
    actor, _ = ppo_modules()
    collector = TorchRLCollector(env, actor, frames_per_batch=64, total_frames=128)
    for _ in collector:
        pass
    collector.shutdown()
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        evaluation = env.rollout(50, actor)
    assert evaluation["next", "reward"].shape[0] == 4 and evaluation["next", "step_count"].max() >= 1
    assert not env.is_closed
    env.close()


def test_our_collector_rebinds_to_an_env_that_was_closed_and_restarted(no_leaks):
    env = ParallelEnv(2, cartpole)
    with Collector(env, None, frames_per_batch=20, total_frames=-1) as collector:
        it = iter(collector)
        first = next(it)
        env.close()  # e.g. closed by other code; the next batch restarts it and steps the new workers
        second = next(it)
        assert not env.is_closed and second.batch_size == first.batch_size
        assert torch.isfinite(second["next", "observation"]).all()
        env.rollout(3)  # the env's own API still works beside the collector
        third = next(it)
        assert (third["observation"] != 0).any()
    env.close()
