"""What a native road could save on gymnasium's MuJoCo envs: one ``HalfCheetah-v5`` step in this process, through
``gym.make``'s wrappers and without them, beside the simulation and the observation alone, interleaved rounds:

    python -m benchmarks.mujoco_profile [--rounds 5] [--steps 5000]

* ``gym.make`` env: ``env.step`` (``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker`` around the env);
* unwrapped: ``env.unwrapped.step`` (the env's own step: the simulation, its reward terms, its observation, its
  info dict);
* ``mj_step``: ``mujoco.mj_step(model, data, nstep=frame_skip)`` after writing the action, nothing else;
* observation: the env's ``_get_obs()`` alone.

The gap between the first two is what skipping the wrappers saves; between the second and the last two, what a
native copy of the env's own step (its reward terms and info) could save at most.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def one_round(steps: int) -> dict[str, float]:
    """µs per step of each way (see the module docstring)."""
    import gymnasium as gym
    import mujoco

    env = gym.make("HalfCheetah-v5")
    env.reset(seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 6)).astype(np.float32)
    env.step(actions[0])
    env.step(actions[1])  # past the checker's steps
    inner = env.unwrapped
    clock = time.perf_counter
    out = {}
    began = clock()
    for action in actions:
        env.step(action)
    out["gym.make env: env.step"] = clock() - began
    began = clock()
    for action in actions:
        inner.step(action)
    out["unwrapped: env.unwrapped.step"] = clock() - began
    began = clock()
    for action in actions:
        inner.data.ctrl[:] = action
        mujoco.mj_step(inner.model, inner.data, nstep=inner.frame_skip)
    out["mj_step alone"] = clock() - began
    began = clock()
    for _ in actions:
        inner._get_obs()
    out["observation alone"] = clock() - began
    env.close()
    return {key: seconds / steps * 1e6 for key, seconds in out.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args(argv)
    rounds = [one_round(args.steps) for _ in range(args.rounds)]
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(f"{key:32s} {statistics.median(values):6.1f} µs  (rounds {min(values):.1f}-{max(values):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
