"""The first rollout of a fresh ParallelEnv against a serial loop: what a user times first.

Each sample runs in a fresh Python process (a fresh heap: nothing recycled yet). The serial row steps
``workers * envs_per_worker`` envs one after the other in a Python loop (gymnasium's ``SyncVectorEnv``, random
actions) for ``--steps`` steps after a reset; ours builds ``ParallelEnv(workers, make, envs_per_worker=k)``, resets
it, and times ``rollout(steps, break_when_any_done=False)`` twice: the first (its output storage new to the
process) and the second (the recycler's memory). Rounds are interleaved (serial, ours, serial, ...); the table gives
the median frames/s and the ratio to the serial loop's median.

    python -m benchmarks.first_rollout [--workload atari] [--workers 2] [--envs-per-worker 4] [--steps 100]
                                       [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def serial_child(workload: str, n_envs: int, steps: int) -> dict:
    import gymnasium as gym

    from .workloads import WORKLOADS

    envs = gym.vector.SyncVectorEnv([WORKLOADS[workload]] * n_envs)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    seconds = time.perf_counter() - start
    envs.close()
    return {"serial": n_envs * steps / seconds}


def ours_child(workload: str, workers: int, per_worker: int, steps: int) -> dict:
    from tdcollect.envs import ParallelEnv

    from .workloads import WORKLOADS

    rates = {}
    with ParallelEnv(workers, WORKLOADS[workload], envs_per_worker=per_worker) as env:
        env.set_seed(0)
        env.reset()
        for name in ("first rollout", "second rollout"):
            start = time.perf_counter()
            out = env.rollout(steps, break_when_any_done=False)
            rates[name] = out.numel() / (time.perf_counter() - start)
            del out  # (a training loop lets go of its last rollout before the next one)
    return rates


def sample(kind: str, args) -> dict:
    """One sample in a fresh process."""
    spec = json.dumps({"kind": kind, "workload": args.workload, "workers": args.workers,
                       "per_worker": args.envs_per_worker, "steps": args.steps})
    out = subprocess.run([sys.executable, "-m", "benchmarks.first_rollout", "--child", spec],
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{kind} sample failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="atari")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        if spec["kind"] == "serial":
            result = serial_child(spec["workload"], spec["workers"] * spec["per_worker"], spec["steps"])
        else:
            result = ours_child(spec["workload"], spec["workers"], spec["per_worker"], spec["steps"])
        print(json.dumps(result))
        return
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for kind in ("serial", "ours"):
            for name, rate in sample(kind, args).items():
                rows.setdefault(name, []).append(rate)
    serial = statistics.median(rows["serial"])
    print(f"{args.workload}, {args.workers} workers x {args.envs_per_worker} envs, rollout({args.steps}), "
          f"{args.rounds} interleaved rounds (a fresh process per sample)\n")
    print("| row | frames/s (median) | samples | x serial |\n|---|---:|---|---:|")
    for name, rates in rows.items():
        median = statistics.median(rates)
        print(f"| {name} | {median:,.0f} | {', '.join(f'{r:,.0f}' for r in rates)} | {median / serial:.2f} |")


if __name__ == "__main__":
    main()
