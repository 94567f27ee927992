"""Does asynchronous stepping pay? ``AsyncParallelEnv`` against the synchronous ``ParallelEnv`` on envs with
uneven step times (and, as a control, on the even ``costly`` workload).

``uneven`` = CartPole-v1 whose every step also burns CPU for a time drawn from an exponential distribution
(mean 1 ms, seeded per env; ``uneven200``: mean 200 µs): a synchronous step waits for the slowest worker, an
asynchronous one serves the first ``batch_workers`` workers that finish, while the main process pays ~0.2 ms
per ``recv`` + ``send`` on this 2-core VM. Same envs, same workers, random actions; env steps/s, the
median of ``--rounds`` interleaved rounds, with the serial ``SyncVectorEnv`` loop of the same envs.

    python -m benchmarks.async_uneven --rounds 3
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from .workloads import burn_cpu, make_costly

MEAN_BURN_S = 1e-3
_SEEDS = itertools.count()


class UnevenStep(gym.Wrapper):
    """Burns CPU for an exponentially distributed time (mean ``mean_s``) on every step."""

    def __init__(self, env: gym.Env, mean_s: float = MEAN_BURN_S, seed: int = 0):
        super().__init__(env)
        self.mean_s = mean_s
        self._rng = np.random.default_rng(seed)

    def step(self, action):
        burn_cpu(self._rng.exponential(self.mean_s))
        return self.env.step(action)


def make_uneven(mean_s: float = MEAN_BURN_S) -> gym.Env:
    # a different stream per env: the seed mixes the process id and a per-process counter
    return UnevenStep(gym.make("CartPole-v1"), mean_s, seed=os.getpid() * 1000 + next(_SEEDS))


def make_uneven200() -> gym.Env:
    return make_uneven(200e-6)


WORKLOADS = {"uneven": make_uneven, "uneven200": make_uneven200, "costly": make_costly}


def run_serial(workload: str, num_envs: int, env_steps: int) -> float:
    env = gym.vector.SyncVectorEnv([WORKLOADS[workload]] * num_envs)
    try:
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, size=(env_steps // num_envs, num_envs))
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        return actions.size / (time.perf_counter() - start)
    finally:
        env.close()


def run_sync(workload: str, workers: int, per_worker: int, env_steps: int) -> float:
    from tdcollect.envs import ParallelEnv

    with ParallelEnv(workers, WORKLOADS[workload], envs_per_worker=per_worker) as env:
        env.rollout(5, break_when_any_done=False)
        steps = env_steps // (workers * per_worker)
        start = time.perf_counter()
        env.rollout(steps, break_when_any_done=False)
        return steps * workers * per_worker / (time.perf_counter() - start)


def run_async(workload: str, workers: int, per_worker: int, batch_workers: int, env_steps: int) -> float:
    from tdcollect.envs import AsyncParallelEnv

    with AsyncParallelEnv(workers, WORKLOADS[workload], batch_workers=batch_workers,
                          envs_per_worker=per_worker) as env:
        env.async_reset()
        batch = batch_workers * per_worker
        for _ in range(5):
            td = env.recv()
            env.send(td.set("action", torch.randint(0, 2, (batch,))))
        done, start = 0, time.perf_counter()
        while done < env_steps:
            td = env.recv()
            env.send(td.set("action", torch.randint(0, 2, (batch,))))
            done += batch
        return done / (time.perf_counter() - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=2000, help="env steps timed per run")
    p.add_argument("--out", default="benchmarks/results/async_uneven.json")
    args = p.parse_args(argv)
    # (workload, workers, envs per worker, batch_workers)
    configs = [("uneven", 2, 1, 1), ("uneven", 2, 4, 1), ("uneven", 4, 1, 2), ("uneven", 4, 4, 2),
               ("uneven200", 2, 1, 1), ("uneven200", 4, 4, 2), ("costly", 2, 1, 1), ("costly", 4, 4, 2)]
    rows = []
    for workload, workers, per_worker, batch_workers in configs:
        rates = {"serial": [], "sync": [], "async": []}
        for _ in range(args.rounds):
            rates["serial"].append(run_serial(workload, workers * per_worker, args.env_steps))
            rates["sync"].append(run_sync(workload, workers, per_worker, args.env_steps))
            rates["async"].append(run_async(workload, workers, per_worker, batch_workers, args.env_steps))
        row = {"workload": workload, "workers": workers, "envs_per_worker": per_worker,
               "batch_workers": batch_workers, "rounds": rates,
               **{name: statistics.median(values) for name, values in rates.items()},
               "async_vs_sync": statistics.median(a / s for a, s in zip(rates["async"], rates["sync"]))}
        rows.append(row)
        print(f"{workload:7s} {workers} workers x {per_worker} envs, batch {batch_workers} workers: "
              f"serial {row['serial']:8,.0f}  sync {row['sync']:8,.0f}  async {row['async']:8,.0f} steps/s  "
              f"(async / sync {row['async_vs_sync']:.2f}x)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
