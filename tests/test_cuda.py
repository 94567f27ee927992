"""CUDA devices (skipped without one; run on a GPU machine). Batched envs with ``device="cuda"``: specs and outputs
there, the same values as on the CPU, for every public call. Collectors: the policy runs where ``policy_device``
says and batches land where ``storing_device`` / ``device`` say, with the same values as a CPU policy; weight
updates from a CUDA policy reach the workers; TorchRL's own ``Collector`` steps our ``ParallelEnv`` with a CUDA
policy. The policy's choice is exact in float32 (one small integer feature), so CPU and GPU runs must agree
action for action."""
import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tests.helpers import CountingEnv

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
COUNTING = functools.partial(CountingEnv, episode_len=7)


class Argmax(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, obs):
        return self.linear(obs).argmax(-1)


def count_policy(sign: float = 1.0) -> TensorDictModule:
    """Action 1 once an episode's step count passes 2.5, else 0 (``sign=-1``: the other way round); exact on
    any device."""
    linear = nn.Linear(3, 3)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[1, 0] = sign
        linear.bias.copy_(torch.tensor([0.0, -2.5 * sign, -1e3]))
    return TensorDictModule(Argmax(linear), in_keys=["observation"], out_keys=["action"])


def expected_actions(obs: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    return ((sign * obs[..., 0] - 2.5 * sign) > 0).long()


def batches(collector, n: int = 2) -> list:
    out = []
    for batch in collector:
        out.append(batch)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_cuda_policy_gives_the_cpu_policy_batches(cls, no_leaks):
    runs = {}
    for device in ("cpu", "cuda"):
        with cls([COUNTING] * 2, count_policy().to(device), frames_per_batch=28, total_frames=56,
                 policy_device=device) as collector:
            collector.set_seed(0)
            runs[device] = batches(collector)
    for cpu, cuda in zip(runs["cpu"], runs["cuda"]):
        assert cuda.device == torch.device("cpu")  # storing_device unset: TorchRL's default keeps the env's device
        assert (cuda["action"] == expected_actions(cuda["observation"])).all()
        if cls is MultiSyncCollector:  # (MultiAsync's batches come in the order the workers finish)
            assert (cpu == cuda).all()


def test_device_cuda_stores_batches_on_the_gpu(no_leaks):
    with MultiSyncCollector([COUNTING] * 2, count_policy(), frames_per_batch=28, total_frames=28, device="cuda",
                            env_device="cpu") as collector:
        (batch,) = batches(collector, 1)
    assert batch.device.type == "cuda" and batch["action"].device.type == "cuda"
    assert (batch["action"] == expected_actions(batch["observation"])).all()
    with Collector(COUNTING, count_policy(), frames_per_batch=14, total_frames=14, policy_device="cuda",
                   storing_device="cuda") as single:
        (batch,) = batches(single, 1)
    assert batch["action"].device.type == "cuda"
    assert (batch["action"] == expected_actions(batch["observation"])).all()


def test_weights_from_a_cuda_policy_reach_the_workers(no_leaks):
    policy = count_policy().to("cuda")
    with MultiSyncCollector([COUNTING] * 2, policy, frames_per_batch=28, total_frames=-1,
                            policy_device="cuda") as collector:
        iterator = iter(collector)
        first = next(iterator)
        assert (first["action"] == expected_actions(first["observation"])).all() and first["action"].any()
        with torch.no_grad():
            policy.module.linear.weight.neg_()
            policy.module.linear.bias.copy_(torch.tensor([0.0, 2.5, -1e3]))
        collector.update_policy_weights_()
        second = next(iterator)
    assert (second["action"] == expected_actions(second["observation"], sign=-1.0)).all()
    assert (second["action"] != expected_actions(second["observation"])).all()  # the old weights' choice nowhere


def test_torchrl_collector_steps_our_parallel_env_with_a_cuda_policy(no_leaks):
    from torchrl.collectors import Collector as TorchRLCollector

    env = ParallelEnv(2, COUNTING, envs_per_worker=2)
    try:
        collector = TorchRLCollector(env, count_policy().to("cuda"), frames_per_batch=40, total_frames=80,
                                     policy_device="cuda", env_device="cpu", storing_device="cpu")
        for batch in collector:
            assert batch.device == torch.device("cpu") and batch.batch_size == (4, 10)
            assert (batch["action"] == expected_actions(batch["observation"])).all()
        collector.shutdown()
    finally:
        env.close(raise_if_closed=False)


def on_cuda(td) -> bool:
    return td.device.type == "cuda" and all(leaf.device.type == "cuda" for leaf in td.values(True, True))


def every_call(env, device: str) -> list:
    """reset, step, step_and_maybe_reset, a partial reset and a policy rollout of ``env``, seeded."""
    policy = count_policy().to(device)
    env.set_seed(0)
    outs = [env.reset()]
    td = outs[0].set("action", torch.ones(env.batch_size, dtype=torch.int64, device=device))
    outs.append(env.step(td.clone())["next"])
    root = outs[0]
    for _ in range(8):
        stepped, root = env.step_and_maybe_reset(policy(root))
        outs += [stepped, root]
    mask = torch.zeros((*env.batch_size, 1), dtype=torch.bool, device=device)
    mask[0] = True
    outs.append(env.reset(TensorDict({"_reset": mask}, env.batch_size, device=device)))
    outs.append(env.rollout(12, policy, break_when_any_done=False))
    return outs


@pytest.mark.parametrize("cls", [ParallelEnv, SerialEnv])
def test_device_cuda_batched_env_gives_the_cpu_data_on_the_gpu(cls, no_leaks):
    runs = {}
    for device in ("cpu", "cuda"):
        with cls(4, COUNTING, device=device) as env:
            assert env.device.type == device
            assert all(spec.device.type == device for spec in (env.full_observation_spec, env.full_action_spec,
                                                               env.full_reward_spec, env.full_done_spec))
            runs[device] = every_call(env, device)
            random = env.rollout(5, break_when_any_done=False)
            assert random.batch_size == (4, 5) and random.device.type == device
    for cpu, cuda in zip(runs["cpu"], runs["cuda"], strict=True):
        assert on_cuda(cuda)
        assert (cuda.cpu() == cpu).all()


def test_continuous_actions_from_the_gpu(no_leaks):
    """Bounded actions on the GPU are checked against the spec's bounds on their way to the CPU buffers."""
    import gymnasium as gym

    with ParallelEnv(2, lambda: gym.make("Pendulum-v1"), envs_per_worker=2, device="cuda",
                     check_actions="raise") as env:
        root = env.reset()
        root["action"] = torch.zeros((4, 1), device="cuda")
        stepped, root = env.step_and_maybe_reset(root)
        assert on_cuda(stepped) and on_cuda(root)
        root["action"] = torch.full((4, 1), 5.0, device="cuda")  # outside [-2, 2]
        with pytest.raises(ValueError, match="outside its spec"):
            env.step_and_maybe_reset(root)
