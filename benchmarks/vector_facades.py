"""Steps/s of the vector facades against the loops their users run today, CartPole-v1, one run.

``engine``: tdcollect's ParallelEnv stepped through its buffer API (what the facades run on). gymnasium side:
``ParallelVectorEnv`` (2 workers x 32 envs) against a serial ``SyncVectorEnv`` loop of the same 64
envs and gymnasium's ``AsyncVectorEnv`` (one process per env). Stable-Baselines3 side: ``ParallelVecEnv``
(2 x 32) against ``SubprocVecEnv`` (one process per env) and ``DummyVecEnv`` (serial). Random actions, drawn
before the clock starts; every system is timed for ``--seconds`` per round after a warm-up, the systems
interleaved round by round (this machine is noisy); the table gives the median steps/s and the median of the
per-round ratios to the serial loop.

    python -m benchmarks.vector_facades                       # 3 rounds, 2 x 32
    python -m benchmarks.vector_facades --rounds 5 --workers 2 --envs-per-worker 32 --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym
import numpy as np

SYSTEMS = ("serial", "engine", "gym_facade", "gym_async", "sb3_facade", "sb3_subproc", "sb3_dummy")


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def build(system: str, num_envs: int, envs_per_worker: int):
    """``(step(actions), close())`` of ``system`` over ``num_envs`` CartPoles, reset."""
    fns = [cartpole] * num_envs
    if system == "engine":  # the engine under the facades, through its buffer API: what the facades add is the rest
        from tdcollect.envs import ParallelEnv

        engine = ParallelEnv(num_envs // envs_per_worker, cartpole, envs_per_worker=envs_per_worker)
        engine.reset()
        buffer = engine.action_buffers[0][1].numpy()

        def step(actions):
            buffer[:] = actions
            engine.step_buffers()
        return step, engine.close
    if system in ("serial", "gym_facade", "gym_async"):
        if system == "serial":
            env = gym.vector.SyncVectorEnv(fns)
        elif system == "gym_async":
            env = gym.vector.AsyncVectorEnv(fns, context="fork")
        else:
            from tdcollect.envs.vector import ParallelVectorEnv

            env = ParallelVectorEnv(fns, envs_per_worker=envs_per_worker)
        env.reset(seed=0)
        return env.step, env.close
    if system == "sb3_facade":
        from tdcollect.envs.vector import ParallelVecEnv

        env = ParallelVecEnv(fns, envs_per_worker=envs_per_worker)
    elif system == "sb3_subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        env = SubprocVecEnv(fns, start_method="fork")
    else:
        from stable_baselines3.common.vec_env import DummyVecEnv

        env = DummyVecEnv(fns)
    env.seed(0)
    env.reset()
    return env.step, env.close


def measure(system: str, num_envs: int, envs_per_worker: int, seconds: float) -> float:
    """Env steps per second of ``system`` over at least ``seconds`` of stepping."""
    step, close = build(system, num_envs, envs_per_worker)
    try:
        actions = np.random.default_rng(0).integers(0, 2, size=(256, num_envs))
        for batch in actions[:10]:
            step(batch)
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            for batch in actions[: 16]:
                step(batch)
            done += 16
    finally:
        close()
    return done * num_envs / elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per system and round")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    num_envs = args.workers * args.envs_per_worker
    systems = ["serial", *[s for s in args.systems if s != "serial"]]
    rounds: list[dict] = []
    for r in range(args.rounds):
        rounds.append({s: measure(s, num_envs, args.envs_per_worker, args.seconds) for s in systems})
        print(f"round {r + 1}: " + ", ".join(f"{s} {v:,.0f}" for s, v in rounds[-1].items()), flush=True)
    rows = {}
    for s in systems:
        ratios = [rnd[s] / rnd["serial"] for rnd in rounds]
        rows[s] = {"steps_per_s": statistics.median(rnd[s] for rnd in rounds), "ratio": statistics.median(ratios),
                   "ratios": ratios}
    print(f"\nCartPole-v1, {num_envs} envs ({args.workers} workers x {args.envs_per_worker} for the facades), "
          f"{args.rounds} rounds, median")
    print("| system | steps/s | x serial |\n|---|---:|---:|")
    for s, row in rows.items():
        print(f"| {s} | {row['steps_per_s']:,.0f} | {row['ratio']:.2f} |")
    pairs = (("gym_facade", "gym_async"), ("sb3_facade", "sb3_subproc"), ("sb3_facade", "sb3_dummy"))
    for ours, anchor in pairs:
        if ours in rows and anchor in rows:
            per_round = [rnd[ours] / rnd[anchor] for rnd in rounds]
            print(f"{ours} / {anchor}: {statistics.median(per_round):.1f}x (rounds {min(per_round):.1f}-"
                  f"{max(per_round):.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_envs": num_envs, "envs_per_worker": args.envs_per_worker, "rounds": rounds,
                       "summary": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
