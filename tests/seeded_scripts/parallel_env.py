"""A seeded TorchRL script of a ``ParallelEnv`` of 4 envs (``tdcollect run`` lays it out as 2 workers x 2 envs on
2 cores), a categorical policy sampling its actions, a gradient step per batch, TorchRL's CSV logger.
``python parallel_env.py LOG_DIR`` and ``tdcollect run parallel_env.py LOG_DIR`` log the same numbers."""
import sys

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import ParallelEnv, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor
from torchrl.record.loggers.csv import CSVLogger


def make_env():
    return GymEnv("CartPole-v1")


def main(log_dir: str) -> None:
    torch.manual_seed(1)
    env = TransformedEnv(ParallelEnv(4, make_env), StepCounter())
    env.append_transform(RewardSum())
    env.set_seed(1)
    net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    actor = ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=OneHotCategorical, spec=env.action_spec, return_log_prob=True)
    optim = torch.optim.Adam(actor.parameters(), lr=1e-2)
    logger = CSVLogger("parallel_env", log_dir=log_dir)
    collector = Collector(env, actor, frames_per_batch=128, total_frames=640)
    for i, batch in enumerate(collector):
        logits = net(batch["observation"])  # (the batch holds no graph: the policy ran without gradients)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 2), batch["action"].argmax(-1).reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
        logger.log_scalar("loss", loss.item(), step=i)
        logger.log_scalar("done", batch["next", "done"].float().sum().item(), step=i)
        logger.log_scalar("episode_reward", batch["next", "episode_reward"].max().item(), step=i)
    collector.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
