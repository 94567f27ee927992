"""A seeded TorchRL script with ``init_random_frames`` (the collector's random actions first) and exploration noise
(``AdditiveGaussianModule`` over a deterministic actor, annealed per batch), a replay buffer sampled for a critic
loss, TorchRL's CSV logger, over a ``ParallelEnv`` of 2 envs. ``python random_frames_and_noise.py LOG_DIR`` and
``tdcollect run random_frames_and_noise.py LOG_DIR`` log the same numbers."""
import sys

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import DoubleToFloat, ParallelEnv, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import AdditiveGaussianModule, TanhModule
from torchrl.record.loggers.csv import CSVLogger


def make_env():
    return GymEnv("Pendulum-v1")


def main(log_dir: str) -> None:
    torch.manual_seed(2)
    env = TransformedEnv(ParallelEnv(2, make_env), DoubleToFloat())
    env.set_seed(2)
    actor = TensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 1)), ["observation"], ["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=env.action_spec_unbatched))
    noise = AdditiveGaussianModule(spec=env.action_spec_unbatched, sigma_init=0.5, sigma_end=0.1,
                                   annealing_num_steps=400)
    critic = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    optim = torch.optim.Adam(critic.parameters(), lr=1e-3)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(2000), batch_size=32)
    logger = CSVLogger("random_frames_and_noise", log_dir=log_dir)
    collector = Collector(env, TensorDictSequential(actor, noise), frames_per_batch=80, total_frames=480,
                          init_random_frames=160)
    for i, batch in enumerate(collector):
        noise.step(batch.numel())
        buffer.extend(batch.reshape(-1))
        sample = buffer.sample()
        value = critic(torch.cat([sample["observation"], sample["action"]], -1))
        loss = (value - sample["next", "reward"]).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        logger.log_scalar("loss", loss.item(), step=i)
        logger.log_scalar("action", batch["action"].abs().mean().item(), step=i)
        logger.log_scalar("reward", batch["next", "reward"].mean().item(), step=i)
    collector.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
