"""Collectors run the policy under TorchRL's exploration type, ``ExplorationType.RANDOM`` by default: a
``ProbabilisticActor`` samples its actions in every worker, as under TorchRL's own collectors."""
import functools

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.utils import ExplorationType
from torchrl.modules import ProbabilisticActor

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import SerialEnv
from tests.helpers import CountingEnv

pytestmark = pytest.mark.timeout(90)


class NearUniformLogits(nn.Module):
    """Logits [0.1, 0] whatever the observation: argmax is always action 0, sampling picks it 52.5% of the time."""

    def __init__(self):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([0.1, 0.0]))

    def forward(self, obs):
        return self.logits.expand(*obs.shape[:-1], 2)


def near_uniform_actor():
    """A standard TorchRL actor with its default interaction type (TensorDict's: deterministic)."""
    return ProbabilisticActor(TensorDictModule(NearUniformLogits(), ["observation"], ["logits"]), in_keys=["logits"],
                              distribution_class=torch.distributions.Categorical, return_log_prob=True)


FACTORY = functools.partial(CountingEnv, episode_len=1000, n_actions=2)


def _collectors(**kwargs):
    return {
        "Collector": lambda: Collector(SerialEnv(2, FACTORY), near_uniform_actor(), frames_per_batch=200,
                                       total_frames=400, **kwargs),
        "MultiSyncCollector": lambda: MultiSyncCollector([FACTORY] * 2, near_uniform_actor(), frames_per_batch=200,
                                                         total_frames=400, **kwargs),
    }


def _argmax_share(collector) -> float:
    with collector:
        actions = torch.cat([batch["action"].flatten() for batch in collector])
    assert actions.numel() == 400
    return (actions == 0).float().mean().item()


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_collectors_sample_stochastic_actors_by_default(kind, no_leaks):
    share = _argmax_share(_collectors()[kind]())
    assert 0.35 < share < 0.70, f"{share:.0%} argmax actions: the actor did not sample"


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_exploration_type_deterministic_takes_the_mode(kind, no_leaks):
    assert _argmax_share(_collectors(exploration_type=ExplorationType.DETERMINISTIC)[kind]()) == 1.0


def test_exploration_type_is_checked():
    with pytest.raises(ValueError, match="exploration_type must be an ExplorationType or its name"):
        Collector(SerialEnv(1, FACTORY), None, frames_per_batch=10, exploration_type="sampling")
    with pytest.raises(ValueError, match="exploration_type must be an ExplorationType or its name"):
        Collector(SerialEnv(1, FACTORY), None, frames_per_batch=10, exploration_type=2)


@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector"])
def test_exploration_type_by_name_as_torchrl_configs_pass_it(kind, no_leaks):
    # TorchRL's trainer configs pass exploration_type="RANDOM"; TorchRL's collectors take a name in any case
    assert _argmax_share(_collectors(exploration_type="DETERMINISTIC")[kind]()) == 1.0
    share = _argmax_share(_collectors(exploration_type="random")[kind]())
    assert 0.35 < share < 0.70, f"{share:.0%} argmax actions: the actor did not sample"
