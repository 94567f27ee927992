"""Is ``autotune``'s pick as fast as the best point of a longer grid? Per workload, the grid is every split of
``num_envs`` over 1..``--max-workers`` workers with both waits (block, poll 1 ms), each point timed for
``--seconds`` of ``rollout(--steps)`` chunks after a warm-up rollout; rounds interleave the grid (shuffled) and one
``autotune`` run (its default 30 s budget). The grid rate of a point is its median over rounds; each autotune
pick is scored as its point's grid rate over the best point's.

    python -m benchmarks.autotune_check [--workloads cheap costly atari] [--rounds 3] [--max-workers 4]
                                        [--num-envs N] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from tdcollect.envs import ParallelEnv, autotune
from tdcollect.envs.engine.platform_policy import SPIN_S

from .workloads import WORKLOADS

NUM_ENVS = {"cheap": 16, "costly": 8, "atari": 8}


def grid_rate(make, workers: int, per_worker: int, spin_s: float, steps: int, seconds: float) -> float:
    """Env steps/s of ``rollout(steps)`` chunks for at least ``seconds``, after one warm-up chunk."""
    with ParallelEnv(workers, make, envs_per_worker=per_worker, spin_s=spin_s) as env:
        env.set_seed(0)
        env.rollout(steps, break_when_any_done=False)
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or not done:
            env.rollout(steps, break_when_any_done=False)
            done += steps * workers * per_worker
    return done / elapsed


def check(workload: str, rounds: int, max_workers: int, seconds: float, steps: int, num_envs: int | None) -> dict:
    make, num_envs = WORKLOADS[workload], num_envs or NUM_ENVS[workload]
    points = [(w, num_envs // w, spin) for w in range(1, max_workers + 1) if num_envs % w == 0
              for spin in (0.0, SPIN_S)]
    rates = {point: [] for point in points}
    picks = []
    rng = random.Random(0)
    for r in range(rounds):
        for point in rng.sample(points, len(points)):
            rates[point].append(grid_rate(make, *point, steps=steps, seconds=seconds))
        tuning = autotune(make, num_envs, max_workers=max_workers)
        picks.append({"point": [tuning.num_workers, tuning.envs_per_worker, tuning.spin_s],
                      "autotune_s": tuning.seconds, "autotune_rate": tuning.steps_per_s,
                      "serial_rate": tuning.serial_steps_per_s})
        print(f"{workload} round {r + 1}: pick {picks[-1]['point']}", flush=True)
    medians = {point: statistics.median(v) for point, v in rates.items()}
    best_point = max(medians, key=medians.get)
    for pick in picks:
        pick["grid_rate"] = medians[tuple(pick["point"])]
        pick["of_best"] = pick["grid_rate"] / medians[best_point]
    return {"workload": workload, "num_envs": num_envs, "best_point": list(best_point),
            "grid": [{"point": list(p), "rates": rates[p], "median": medians[p]} for p in points], "picks": picks}


def _name(point) -> str:
    return f"{point[0]}x{point[1]} {'block' if point[2] == 0 else 'poll'}"


def table(results: list[dict]) -> str:
    lines = ["| workload | envs | grid's best (workers x envs, wait) | its env steps/s | autotune picks | "
             "pick / best (each run) | autotune s |", "|---|---|---|---|---|---|---|"]
    for res in results:
        best = next(g for g in res["grid"] if g["point"] == res["best_point"])
        picks = ", ".join(_name(p["point"]) for p in res["picks"])
        scores = ", ".join(f"{p['of_best']:.2f}" for p in res["picks"])
        budget = ", ".join(f"{p['autotune_s']:.0f}" for p in res["picks"])
        lines.append(f"| {res['workload']} | {res['num_envs']} | {_name(res['best_point'])} | {best['median']:,.0f} "
                     f"| {picks} | {scores} | {budget} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(NUM_ENVS), choices=list(NUM_ENVS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--num-envs", type=int, default=None, help="every workload's (default: NUM_ENVS)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for workload in args.workloads:  # written after each, so that a run cut short keeps what it measured
        results.append(check(workload, args.rounds, args.max_workers, args.seconds, args.steps, args.num_envs))
        (out / "autotune.json").write_text(json.dumps(results, indent=1))
        (out / "autotune.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
