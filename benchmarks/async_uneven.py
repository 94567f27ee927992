"""Does asynchronous stepping pay? ``AsyncParallelEnv`` against the synchronous ``ParallelEnv`` on envs with
uneven step times (and, as a control, on the even ``costly`` workload).

``uneven`` = CartPole-v1 whose every step also burns CPU for a time drawn from an exponential distribution
(mean 1 ms, seeded per env; ``uneven200``: mean 200 µs): a synchronous step waits for the slowest worker, an
asynchronous one serves the first ``batch_workers`` workers that finish, while the main process pays ~0.2 ms
per ``recv`` + ``send`` on this 2-core VM. Same envs, same workers, random actions; env steps/s, the
median of ``--rounds`` interleaved rounds, with the serial ``SyncVectorEnv`` loop of the same envs.

``atari`` / ``atari84`` (ALE Pong-v5, raw frames / 84x84x4 as training sees them): the same rows plus EnvPool's
C++ pool of the same game, synchronous (``batch_size = num_envs``) and asynchronous (``batch_size`` = the envs of
``batch_workers`` workers, its ``send`` / ``recv`` with env ids), ``workers`` threads.

    python -m benchmarks.async_uneven --rounds 3
    python -m benchmarks.async_uneven --workloads atari atari84 --rounds 3 --out benchmarks/results/async_atari.json
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

from .anchors import ENVPOOL_TASKS
from .workloads import burn_cpu, make_atari, make_atari84, make_costly

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


WORKLOADS = {"uneven": make_uneven, "uneven200": make_uneven200, "costly": make_costly, "atari": make_atari,
             "atari84": make_atari84}
# (workload, workers, envs per worker, batch_workers)
CONFIGS = {"uneven": [(2, 1, 1), (2, 4, 1), (4, 1, 2), (4, 4, 2)], "uneven200": [(2, 1, 1), (4, 4, 2)],
           "costly": [(2, 1, 1), (4, 4, 2)], "atari": [(2, 4, 1), (4, 2, 2)], "atari84": [(2, 4, 1), (4, 2, 2)]}


def run_serial(workload: str, num_envs: int, env_steps: int) -> float:
    env = gym.vector.SyncVectorEnv([WORKLOADS[workload]] * num_envs)
    try:
        env.reset(seed=0)
        n = env.single_action_space.n
        actions = np.random.default_rng(0).integers(0, n, size=(env_steps // num_envs, num_envs))
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
        batch, n = batch_workers * per_worker, int(env.full_action_spec["action"].space.n)
        for _ in range(5):
            td = env.recv()
            env.send(td.set("action", torch.randint(0, n, (batch,))))
        done, start = 0, time.perf_counter()
        while done < env_steps:
            td = env.recv()
            env.send(td.set("action", torch.randint(0, n, (batch,))))
            done += batch
        return done / (time.perf_counter() - start)


def run_envpool(workload: str, workers: int, per_worker: int, batch_workers: int | None, env_steps: int) -> float:
    """EnvPool's C++ pool (``workers`` threads) of the same game: synchronous steps of every env when
    ``batch_workers`` is None, else asynchronous ``recv`` / ``send`` of the first ``batch_workers * per_worker``
    envs ready."""
    import envpool

    task, options = ENVPOOL_TASKS[workload]
    num_envs = workers * per_worker
    batch = num_envs if batch_workers is None else batch_workers * per_worker
    env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, batch_size=batch, num_threads=workers,
                       seed=0, **options)
    rng, n = np.random.default_rng(0), env.action_space.n
    try:
        if batch_workers is None:
            env.reset()
            start = time.perf_counter()
            for _ in range(env_steps // num_envs):
                env.step(rng.integers(0, n, num_envs))
            return env_steps // num_envs * num_envs / (time.perf_counter() - start)
        env.async_reset()
        for _ in range(5):
            info = env.recv()[-1]
            env.send(rng.integers(0, n, batch), info["env_id"])
        done, start = 0, time.perf_counter()
        while done < env_steps:
            info = env.recv()[-1]
            env.send(rng.integers(0, n, batch), info["env_id"])
            done += batch
        return done / (time.perf_counter() - start)
    finally:
        env.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=2000, help="env steps timed per run")
    p.add_argument("--out", default="benchmarks/results/async_uneven.json")
    p.add_argument("--workloads", nargs="+", choices=list(CONFIGS), default=["uneven", "uneven200", "costly"])
    args = p.parse_args(argv)
    rows = []
    for workload in args.workloads:
        for workers, per_worker, batch_workers in CONFIGS[workload]:
            rows.append(measure(workload, workers, per_worker, batch_workers, args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


def measure(workload: str, workers: int, per_worker: int, batch_workers: int, args) -> dict:
    """One row: every system once per round, rounds interleaved; medians and async / sync ratios."""
    systems = {
        "serial": lambda: run_serial(workload, workers * per_worker, args.env_steps),
        "sync": lambda: run_sync(workload, workers, per_worker, args.env_steps),
        "async": lambda: run_async(workload, workers, per_worker, batch_workers, args.env_steps),
    }
    if workload in ENVPOOL_TASKS:
        systems["envpool_sync"] = lambda: run_envpool(workload, workers, per_worker, None, args.env_steps)
        systems["envpool_async"] = lambda: run_envpool(workload, workers, per_worker, batch_workers,
                                                       args.env_steps)
    rates = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, run in systems.items():
            rates[name].append(run())
    row = {"workload": workload, "workers": workers, "envs_per_worker": per_worker,
           "batch_workers": batch_workers, "rounds": rates,
           **{name: statistics.median(values) for name, values in rates.items()},
           "async_vs_sync": statistics.median(a / s for a, s in zip(rates["async"], rates["sync"]))}
    if "envpool_async" in rates:
        row["async_vs_envpool_async"] = statistics.median(
            a / e for a, e in zip(rates["async"], rates["envpool_async"]))
    print(f"{workload:7s} {workers} workers x {per_worker} envs, batch {batch_workers} workers: "
          + "  ".join(f"{name} {row[name]:8,.0f}" for name in systems)
          + f" steps/s  (async / sync {row['async_vs_sync']:.2f}x"
          + (f", async / EnvPool async {row['async_vs_envpool_async']:.2f}x" if "envpool_async" in row else "")
          + ")", flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main())
