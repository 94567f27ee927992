"""Our PPO example, timed to solve CartPole-v1, against Stable-Baselines3 PPO in the same run.

MultiSyncCollector (2 workers x 16 CartPole envs, batches of 512 frames) + TorchRL's ``GAE`` and
``ClipPPOLoss``; the same algorithm and settings as ``tutorials/03_ppo_multisync.ipynb``. "Solved" = the mean
return of the last 20 finished episodes reaches 450; the clock starts before the collector is built, so
worker start-up counts (as it does for SB3, whose clock starts before its vec-env is built).

    python -m benchmarks.ppo_cartpole --seeds 0 1 2            # ours, SB3 DummyVecEnv, SB3 SubprocVecEnv
    python -m benchmarks.ppo_cartpole --seeds 0 --systems ours
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import SerialEnv

from .sb3_ppo_cartpole import SOLVE_RETURN, SOLVE_WINDOW, solve_time_sb3, write_json

SETTINGS = dict(num_workers=2, envs_per_worker=16, steps_per_batch=16, max_frames=150_000, gamma=0.98,
                lmbda=0.8, epochs=20, minibatch=512, lr=3e-3, lr_decay_frames=100_000, clip=0.2,
                value_coef=0.5, max_grad_norm=0.5)


def sixteen_cartpoles():
    return SerialEnv(SETTINGS["envs_per_worker"], lambda: gym.make("CartPole-v1"))


def _mlp(out_features: int, last_gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out_features))
    for layer in net:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain=2**0.5)
            nn.init.zeros_(layer.bias)
    nn.init.orthogonal_(net[-1].weight, gain=last_gain)
    return net


def solve_time_ours(seed: int) -> dict:
    """Train until solved (or ``max_frames``); ``{"seconds", "frames", "solved", "seed", "collect_fps"}``."""
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    s = SETTINGS
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    actor = ProbabilisticActor(
        TensorDictModule(_mlp(2, 0.01), in_keys=["observation"], out_keys=["logits"]), in_keys=["logits"],
        distribution_class=torch.distributions.Categorical, return_log_prob=True)  # the collector samples it
    critic = ValueOperator(_mlp(1, 1.0), in_keys=["observation"])
    advantage = GAE(gamma=s["gamma"], lmbda=s["lmbda"], value_network=critic)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=s["clip"], entropy_bonus=False,
                              critic_coeff=s["value_coef"], loss_critic_type="l2", normalize_advantage=True,
                              functional=False)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=s["lr"], eps=1e-5)
    recent = deque(maxlen=SOLVE_WINDOW)
    start = time.perf_counter()
    collect_seconds = 0.0
    solved = False
    collector = MultiSyncCollector([sixteen_cartpoles] * s["num_workers"], actor,
                                   frames_per_batch=s["num_workers"] * s["envs_per_worker"] * s["steps_per_batch"],
                                   total_frames=s["max_frames"])
    try:
        collector.set_seed(seed)
        wait = time.perf_counter()
        for batch in collector:
            collect_seconds += time.perf_counter() - wait
            recent.extend(collector.episode_stats["returns"].tolist())
            if len(recent) == SOLVE_WINDOW and statistics.fmean(recent) >= SOLVE_RETURN:
                solved = True
                break
            for group in optimizer.param_groups:
                group["lr"] = s["lr"] * max(0.0, 1.0 - collector.frames / s["lr_decay_frames"])
            with torch.no_grad():
                advantage(batch)
            data = batch.reshape(-1)
            for _ in range(s["epochs"]):
                for index in torch.randperm(len(data)).split(s["minibatch"]):
                    losses = loss_module(data[index])
                    optimizer.zero_grad()
                    (losses["loss_objective"] + losses["loss_critic"]).backward()
                    nn.utils.clip_grad_norm_(loss_module.parameters(), s["max_grad_norm"])
                    optimizer.step()
            collector.update_policy_weights_()
            wait = time.perf_counter()
        seconds = time.perf_counter() - start
    finally:
        collector.shutdown()
        torch.set_num_threads(threads)
    return {"system": "tdcollect MultiSyncCollector PPO", "seed": seed, "seconds": seconds,
            "frames": collector.frames, "solved": solved, "collect_fps": collector.frames / collect_seconds}


SYSTEMS = {
    "ours": solve_time_ours,
    "sb3_dummy": lambda seed: {"system": "SB3 PPO DummyVecEnv", **solve_time_sb3("DummyVecEnv", seed)},
    "sb3_subproc": lambda seed: {"system": "SB3 PPO SubprocVecEnv", **solve_time_sb3("SubprocVecEnv", seed)},
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="time to solve CartPole-v1: our PPO example against SB3 PPO")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    results = []
    for seed in args.seeds:  # interleaved, so that a noisy spell hits every system alike
        for name in args.systems:
            r = SYSTEMS[name](seed)
            results.append(r)
            print(f"{r['system']:32s} seed={seed} solved={r['solved']!s:5s} {r['seconds']:6.2f} s "
                  f"{r['frames']:7d} frames", flush=True)
    print("\n| system | seeds | solved | median s to 450 | median frames |\n|---|---:|---:|---:|---:|")
    for name in args.systems:
        rows = [r for r, n in zip(results, [n for _ in args.seeds for n in args.systems]) if n == name]
        print(f"| {rows[0]['system']} | {len(rows)} | {sum(r['solved'] for r in rows)} | "
              f"{statistics.median(r['seconds'] for r in rows):.1f} | "
              f"{statistics.median(r['frames'] for r in rows):,.0f} |")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
