"""Weight updates through every policy form each collector accepts, and leaves of dtypes numpy lacks."""
import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tests.helpers import CountingEnv
from tests.test_collectors import ConstantAction

pytestmark = pytest.mark.timeout(90)

POLICY_FORMS = {
    "nn.Module": lambda module: module,
    "TensorDictModule": lambda module: TensorDictModule(module, ["observation"], ["action"]),
}


@pytest.mark.parametrize("form", list(POLICY_FORMS))
@pytest.mark.parametrize("weights_from", ["tensordict", "module"])
def test_collector_update_policy_weights_with_weights(form, weights_from, no_leaks):
    module = ConstantAction(3, favourite=0)
    policy = POLICY_FORMS[form](module)
    factory = functools.partial(CountingEnv, episode_len=50)
    with Collector(SerialEnv(2, factory), policy, frames_per_batch=10, total_frames=-1) as collector:
        it = iter(collector)
        assert (next(it)["action"] == 0).all()
        new = POLICY_FORMS[form](ConstantAction(3, favourite=2))  # the same structure as the user's policy
        collector.update_policy_weights_(TensorDict.from_module(new).data if weights_from == "tensordict" else new)
        assert (next(it)["action"] == 2).all()
        assert module.bias.tolist() == [0.0, 0.0, 1.0], "the user's module holds the new weights"


@pytest.mark.parametrize("form", list(POLICY_FORMS))
def test_multisync_update_policy_weights_with_weights(form, no_leaks):
    module = ConstantAction(3, favourite=0)
    factory = functools.partial(CountingEnv, episode_len=50)
    with MultiSyncCollector([factory] * 2, POLICY_FORMS[form](module), frames_per_batch=10) as collector:
        it = iter(collector)
        assert (next(it)["action"] == 0).all()
        collector.update_policy_weights_(POLICY_FORMS[form](ConstantAction(3, favourite=1)))
        assert (next(it)["action"] == 1).all()
        assert collector.weight_versions == [1, 1]


class BFloat16Env(EnvBase):
    """A TorchRL env whose observation is bfloat16 (a dtype numpy does not have): observation = step + 0.5."""

    def __init__(self):
        super().__init__(batch_size=())
        self.observation_spec = Composite(observation=Unbounded((3,), dtype=torch.bfloat16))
        self.action_spec = Categorical(2)
        self.reward_spec = Unbounded((1,))
        self.count = 0

    def _obs(self) -> torch.Tensor:
        return torch.full((3,), self.count + 0.5, dtype=torch.bfloat16)

    def _reset(self, tensordict=None, **kwargs):
        self.count = 0
        return TensorDict({"observation": self._obs(), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _step(self, tensordict):
        self.count += 1
        done = torch.tensor([self.count >= 3])
        return TensorDict({"observation": self._obs(), "reward": torch.ones(1), "done": done,
                           "terminated": done.clone()}, [])

    def _set_seed(self, seed):
        return seed


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_bfloat16_leaves(kind, no_leaks):
    env = SerialEnv(2, BFloat16Env) if kind == "serial" else ParallelEnv(2, BFloat16Env, mp_start_method="fork")
    with env:
        assert env.observation_spec["observation"].dtype == torch.bfloat16
        rollout = env.rollout(4, break_when_any_done=False)
    obs, next_obs = rollout["observation"], rollout["next", "observation"]
    assert obs.dtype == next_obs.dtype == torch.bfloat16
    # steps 1, 2, 3 (episode ends, reset to 0), then 1 again
    assert next_obs[:, :, 0].float().tolist() == [[1.5, 2.5, 3.5, 1.5]] * 2
    assert obs[:, :, 0].float().tolist() == [[0.5, 1.5, 2.5, 0.5]] * 2
