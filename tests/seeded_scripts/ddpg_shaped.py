"""A seeded DDPG-shaped TorchRL script: a seeded env (``set_seed`` on the env, never on the collector), the
collector's random frames first (``init_random_frames``), then a deterministic actor with Ornstein-Uhlenbeck
exploration noise; every batch goes into a replay buffer (memory-mapped storage) sampled for DDPG's actor and value
losses with target networks; TorchRL's CSV logger logs the losses and rewards.

    python ddpg_shaped.py LOG_DIR [ENVS] [--ours] [--prefetch N] [--updates N] [--total-frames N]

``ENVS`` (default 1): 1 is ``ParallelEnv(1, ..., serial_for_single=True)`` (as TorchRL's ``ddpg.py``); 4 is
``ParallelEnv(4, ...)``, which ``tdcollect run`` lays out as 2 workers x 2 envs on 2 cores. ``--ours``: the same
loop with tdcollect's classes imported directly (4 envs: ``ParallelEnv(2, ..., envs_per_worker=2)``).
``--prefetch N``: the replay buffer samples N batches ahead in threads (TorchRL's ``ddpg.py`` asks for 3): those
threads draw the sample indices from torch's global generator in the order the OS runs them, so the numbers then
depend on the machine's load with TorchRL's own classes too (``benchmarks/same_numbers.py`` measures it, with more
updates per batch and more batches: ``--updates``, default 16, ``--total-frames``, default 1,200)."""
import argparse
import functools

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs import Compose, DoubleToFloat, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import MLP, OrnsteinUhlenbeckProcessModule, TanhModule, ValueOperator
from torchrl.objectives import DDPGLoss, SoftUpdate
from torchrl.record.loggers.csv import CSVLogger

FRAMES_PER_BATCH = 200
TOTAL_FRAMES = 1200
INIT_RANDOM_FRAMES = 400
UPDATES_PER_BATCH = 16


def make_env():
    return GymEnv("Pendulum-v1")


def classes(ours: bool):
    if ours:
        from tdcollect.collectors import Collector
        from tdcollect.envs import ParallelEnv
    else:
        from torchrl.collectors import Collector
        from torchrl.envs import ParallelEnv
    return ParallelEnv, Collector


def batched_env(parallel_env, envs: int, ours: bool):
    if envs == 1:
        return parallel_env(1, make_env, serial_for_single=True)
    if ours:
        return parallel_env(envs // 2, make_env, envs_per_worker=2)
    return parallel_env(envs, functools.partial(GymEnv, "Pendulum-v1"))


def main(log_dir: str, envs: int, ours: bool, prefetch: int, updates: int = UPDATES_PER_BATCH,
         total_frames: int = TOTAL_FRAMES) -> None:
    parallel_env, collector_class = classes(ours)
    torch.manual_seed(0)
    env = batched_env(parallel_env, envs, ours)
    env.set_seed(42)
    env = TransformedEnv(env, Compose(InitTracker(), StepCounter(200), DoubleToFloat(), RewardSum()))
    spec = env.action_spec_unbatched
    actor = TensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)), ["observation"], ["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec))
    value = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[64]), in_keys=["observation", "action"])
    explore = TensorDictSequential(actor, OrnsteinUhlenbeckProcessModule(spec=spec, annealing_num_steps=1000))
    collector = collector_class(env, explore, frames_per_batch=FRAMES_PER_BATCH, total_frames=total_frames,
                                init_random_frames=INIT_RANDOM_FRAMES)
    buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(10_000), batch_size=64, prefetch=prefetch or None)
    loss = DDPGLoss(actor, value, loss_function="l2", delay_actor=True, delay_value=True)
    target_update = SoftUpdate(loss, eps=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    logger = CSVLogger("ddpg_shaped", log_dir=log_dir)
    frames = 0
    for batch in collector:
        frames += batch.numel()
        buffer.extend(batch.reshape(-1))
        logger.log_scalar("reward", batch["next", "reward"].mean().item(), step=frames)
        if frames < INIT_RANDOM_FRAMES:
            continue
        actor_losses, value_losses = [], []
        for _ in range(updates):
            losses = loss(buffer.sample())
            optim.zero_grad()
            (losses["loss_actor"] + losses["loss_value"]).backward()
            optim.step()
            target_update.step()
            actor_losses.append(losses["loss_actor"].detach())
            value_losses.append(losses["loss_value"].detach())
        explore[-1].step(batch.numel())
        logger.log_scalar("loss_actor", torch.stack(actor_losses).mean().item(), step=frames)
        logger.log_scalar("loss_value", torch.stack(value_losses).mean().item(), step=frames)
        collector.update_policy_weights_()
    collector.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("log_dir")
    parser.add_argument("envs", nargs="?", type=int, default=1, choices=[1, 4])
    parser.add_argument("--ours", action="store_true")
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--updates", type=int, default=UPDATES_PER_BATCH)
    parser.add_argument("--total-frames", type=int, default=TOTAL_FRAMES)
    args = parser.parse_args()
    main(args.log_dir, args.envs, args.ours, args.prefetch, args.updates, args.total_frames)
