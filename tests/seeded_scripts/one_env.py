"""A seeded TorchRL script of one env: a ``GymEnv`` under TorchRL's transforms, seeded before its ``Collector``,
a stochastic policy (``ProbabilisticActor`` sampling), a few gradient steps per batch, TorchRL's CSV logger.
``python one_env.py LOG_DIR`` and ``tdcollect run one_env.py LOG_DIR`` log the same numbers."""
import sys

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import DoubleToFloat, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.record.loggers.csv import CSVLogger


def main(log_dir: str) -> None:
    torch.manual_seed(0)
    env = TransformedEnv(GymEnv("Pendulum-v1"), DoubleToFloat())
    env.append_transform(StepCounter(50))
    env.append_transform(RewardSum())
    env.set_seed(0)
    net = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2), NormalParamExtractor())
    actor = ProbabilisticActor(TensorDictModule(net, ["observation"], ["loc", "scale"]), in_keys=["loc", "scale"],
                               distribution_class=TanhNormal, spec=env.action_spec, return_log_prob=True)
    optim = torch.optim.Adam(actor.parameters(), lr=1e-3)
    logger = CSVLogger("one_env", log_dir=log_dir)
    collector = Collector(env, actor, frames_per_batch=64, total_frames=320)
    for i, batch in enumerate(collector):
        loc, _ = net(batch["observation"])  # (the batch holds no graph: the policy ran without gradients)
        loss = ((loc - batch["action"]).pow(2) * batch["next", "reward"].neg()).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        logger.log_scalar("loss", loss.item(), step=i)
        logger.log_scalar("reward", batch["next", "reward"].mean().item(), step=i)
        logger.log_scalar("episode_reward", batch["next", "episode_reward"].max().item(), step=i)
    collector.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
