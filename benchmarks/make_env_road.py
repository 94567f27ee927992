"""TorchRL's own way to write an env, ``make_env()`` returning ``TransformedEnv(GymEnv(...), transforms)``, on
TorchRL's classes and on ours, interleaved rounds in one run:

    python -m benchmarks.make_env_road [--rounds 3] [--part envs|collector|all] [--json PATH]

``envs``: Pendulum with TorchRL's SAC four (``InitTracker, StepCounter, DoubleToFloat, RewardSum``), 16 envs,
env steps/s of a ``step_and_maybe_reset`` loop with random actions:

* ``torchrl_16`` - TorchRL's ``ParallelEnv(16, make_env)``;
* ``ours_per_env_2x8`` - our ``ParallelEnv(2, make_env, envs_per_worker=8)``: the transforms per env, in the maker;
* ``ours_moved_2x8`` - the same transforms on the batch, moved to the workers (``move_transforms_to_workers``).

``collector``: a one-env ``Collector(make_env(), policy)`` (TorchRL's DQN, DDPG, A2C and PPO-MuJoCo scripts' shape),
frames/s, TorchRL's and ours, with a random policy (``None``) and with a DQN-style MLP (``QValueActor`` over
``MLP(64, 64)``), on CartPole under ``[RewardSum, StepCounter]`` (TorchRL's DQN maker), Pendulum under the SAC
four (a deterministic MLP actor), and Pendulum under the SAC four and a transform of the user's own, which has no
native op (``pendulum_own``: the env takes TorchRL's step, and ours steps it as it is).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.pipeline_timing import interleaved, medians, steps_per_second

ENV_SYSTEMS = ["torchrl_16", "ours_per_env_2x8", "ours_moved_2x8"]
COLLECTOR_CASES = [(env, policy) for env in ("cartpole_dqn", "pendulum_sac", "pendulum_own")
                   for policy in ("random", "mlp")]


def pendulum_sac():
    """Pendulum under TorchRL's SAC four, per env."""
    from torchrl.envs import DoubleToFloat, GymEnv, InitTracker, RewardSum, StepCounter, TransformedEnv

    env = TransformedEnv(GymEnv("Pendulum-v1"))
    for transform in (InitTracker(), StepCounter(), DoubleToFloat(), RewardSum()):
        env.append_transform(transform)
    return env


def cartpole_dqn():
    """CartPole under TorchRL's DQN maker's transforms, per env."""
    from torchrl.envs import GymEnv, RewardSum, StepCounter, TransformedEnv

    env = TransformedEnv(GymEnv("CartPole-v1"))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    return env


def _bonus_transform():
    """A user's own transform (no native op: the env takes TorchRL's step whatever steps it)."""
    from torchrl.envs import Transform

    class RewardBonus(Transform):
        def __init__(self):
            super().__init__(in_keys=["reward"], out_keys=["reward"])

        def _apply_transform(self, reward):
            return reward + 0.1

    return RewardBonus()


def pendulum_own():
    """Pendulum under the SAC four and a transform of the user's own, per env: the env takes TorchRL's step (the
    one-env road must still be no slower than TorchRL's)."""
    env = pendulum_sac()
    env.append_transform(_bonus_transform())
    return env


def bare_pendulum():
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")


def build_env(system: str):
    from torchrl.envs import Compose, DoubleToFloat, InitTracker, RewardSum, StepCounter, TransformedEnv
    from torchrl.envs import ParallelEnv as TorchRLParallelEnv

    from tdcollect.envs import ParallelEnv, move_transforms_to_workers

    if system == "torchrl_16":
        return TorchRLParallelEnv(16, pendulum_sac)
    if system == "ours_per_env_2x8":
        return ParallelEnv(2, pendulum_sac, envs_per_worker=8)
    batched = TransformedEnv(ParallelEnv(2, bare_pendulum, envs_per_worker=8),
                             Compose(InitTracker(), StepCounter(), DoubleToFloat(), RewardSum()))
    return move_transforms_to_workers(batched)


def time_env(system: str, steps: int) -> float:
    env = build_env(system)
    try:
        return steps_per_second(env, 16, steps, warmup=50, mode="steps")
    finally:
        env.close()


def policy_for(case: str, env):
    """``None`` (random) or the MLP policy of ``case`` (``"<env>/<policy>"``)."""
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.modules import MLP, QValueActor

    env_name, policy = case.split("/")
    if policy == "random":
        return None
    observations = env.observation_spec["observation"].shape[-1]
    if env_name == "cartpole_dqn":
        net = MLP(in_features=observations, out_features=env.action_spec.shape[-1], num_cells=[64, 64])
        return QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    net = torch.nn.Sequential(MLP(in_features=observations, out_features=1, num_cells=[64, 64]), torch.nn.Tanh())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


def time_collector(system: str, frames: int) -> float:
    """Frames/s of ``system`` (``"<torchrl|ours>:<env>/<policy>"``) after its first batch."""
    import torch

    from tdcollect.collectors import Collector

    impl, case = system.split(":")
    if impl == "torchrl":
        from torchrl.collectors import Collector as TorchRLCollector

        Collector = TorchRLCollector  # noqa: N806 - the class timed
    maker = {"cartpole_dqn": cartpole_dqn, "pendulum_sac": pendulum_sac, "pendulum_own": pendulum_own}[
        case.split("/")[0]]
    env = maker()
    torch.manual_seed(0)
    collector = Collector(env, policy_for(case, env), frames_per_batch=500, total_frames=frames + 500)
    batches = iter(collector)
    next(batches)
    start = time.perf_counter()
    collected = sum(batch.numel() for batch in batches)
    rate = collected / (time.perf_counter() - start)
    collector.shutdown()
    return rate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part", choices=["envs", "collector", "all"], default="all")
    parser.add_argument("--steps", type=int, default=300, help="steps of the env loop (16 envs each)")
    parser.add_argument("--frames", type=int, default=3000, help="frames timed per collector")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results: dict = {}
    if args.part in ("envs", "all"):
        rates = interleaved(ENV_SYSTEMS, args.rounds, lambda system: time_env(system, args.steps), "envs ")
        results["envs"] = {"rates": rates, "medians": medians(rates)}
    if args.part in ("collector", "all"):
        systems = [f"{impl}:{env}/{policy}" for env, policy in COLLECTOR_CASES for impl in ("torchrl", "ours")]
        rates = interleaved(systems, args.rounds, lambda system: time_collector(system, args.frames), "collector ")
        results["collector"] = {"rates": rates, "medians": medians(rates)}
    for part, result in results.items():
        print(f"\n{part}: medians of {args.rounds} rounds")
        for system, rate in result["medians"].items():
            print(f"  {system:32s} {rate:9.0f}")
    if "collector" in results:
        med = results["collector"]["medians"]
        for env, policy in COLLECTOR_CASES:
            case = f"{env}/{policy}"
            ratio = med["ours:" + case] / med["torchrl:" + case]
            print(f"  one-env Collector {case:22s} ours / TorchRL's: {ratio:.2f}")
    if "envs" in results:
        med = results["envs"]["medians"]
        print(f"  per-env maker / moved: {med['ours_per_env_2x8'] / med['ours_moved_2x8']:.2f}; "
              f"per-env maker / TorchRL's: {med['ours_per_env_2x8'] / med['torchrl_16']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
