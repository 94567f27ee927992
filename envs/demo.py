"""``python -m tdcollect.envs.demo``: a short ParallelEnv run, and its speed against a serial loop of the same envs.

Steps ``num_workers x envs_per_worker`` CartPole-v1 envs with random actions in a ParallelEnv, then the
same number of envs in a gymnasium ``SyncVectorEnv`` loop in this process, and prints both in env steps/s.
"""
from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

from tdcollect.envs.parallel import ParallelEnv


def cartpole():
    return gym.make("CartPole-v1")


def serial_steps_per_s(num_envs: int, steps: int) -> float:
    """Env steps/s of a gymnasium SyncVectorEnv loop with random actions (the reference)."""
    vec = gym.vector.SyncVectorEnv([cartpole] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    vec.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs))
    for t in range(10):
        vec.step(actions[t])
    start = time.perf_counter()
    for t in range(steps):
        vec.step(actions[t])
    elapsed = time.perf_counter() - start
    vec.close()
    return num_envs * steps / elapsed


def parallel_steps_per_s(env: ParallelEnv, steps: int) -> float:
    env.rollout(10, break_when_any_done=False)
    start = time.perf_counter()
    env.rollout(steps, break_when_any_done=False)
    return env.batch_size.numel() * steps / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args(argv)
    num_envs = args.workers * args.envs_per_worker

    start = time.perf_counter()
    with ParallelEnv(args.workers, cartpole, envs_per_worker=args.envs_per_worker) as env:
        print(f"started {args.workers} workers x {args.envs_per_worker} CartPole-v1 envs "
              f"({env.start_method}) in {time.perf_counter() - start:.2f} s")
        env.set_seed(0)
        td = env.rollout(100, break_when_any_done=False)
        episodes = int(td["next", "done"].sum())
        print(f"rollout(100): batch {tuple(td.batch_size)}, keys {sorted(map(str, td.keys(True, True)))}")
        print(f"              {episodes} episodes ended and were auto-reset")
        parallel = parallel_steps_per_s(env, args.steps)
    serial = serial_steps_per_s(num_envs, args.steps)
    print(f"ParallelEnv   {parallel:>10,.0f} env steps/s")
    print(f"serial loop   {serial:>10,.0f} env steps/s  (gymnasium SyncVectorEnv, same {num_envs} envs)")
    print(f"ratio         {parallel / serial:>10.2f}x")


if __name__ == "__main__":
    main()
