"""Where an 84x84x4 Pong step's time goes on the native Atari road (``envs/libs/atari.py``), and the most this
machine allows it:

    python -m benchmarks.atari_profile [--rounds 3] [--steps 150] [--out benchmarks/results/atari_profile.json]

* **per step, one env in this process** (µs, random actions, live games only: an ended ALE game's frames cost
  ~1 µs, so they are left out): the emulator (``ale.act`` for the skipped frames), the two grayscale screens, the
  max-pool, the resize, the stack; gymnasium's own step of the same chain (its wrappers) beside it;
* **the ceiling**: 2 processes (the machine's cores) each stepping 16 envs natively in a loop, with no hand-off to a
  main process at all; beside it, interleaved in rounds, our ``ParallelEnv`` (2 workers x 16 envs) ``rollout`` and
  ``step_and_maybe_reset`` loop and EnvPool's ``Pong-v5`` (32 envs, 2 threads). What the hand-off costs is the gap
  between the ceiling and our rows.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.anchors import run_envpool
from benchmarks.ours import run_tdcollect_parallel, run_tdcollect_step_loop
from benchmarks.workloads import make_atari84

WORKERS = 2
ENVS_PER_WORKER = 16


class _Rows:
    """Stand-in buffer rows for steppers run outside an engine (the ceiling's loops): numpy arrays of the shapes
    ``[num_envs, ...]`` the engine gives them."""

    def __init__(self, num_envs: int, obs_shape: tuple, obs_dtype):
        self.first_index = 0
        obs = {"observation": np.zeros((num_envs, *obs_shape), obs_dtype)}
        self.root_np = obs
        self.next_np = {"observation": np.zeros((num_envs, *obs_shape), obs_dtype),
                        "reward": np.zeros((num_envs, 1), np.float32)}
        for key in ("done", "terminated", "truncated"):
            self.next_np[key] = np.zeros((num_envs, 1), bool)
        self.action_np = {"action": np.zeros((num_envs,), np.int64)}


def _native_loop(num_envs: int, steps: int, out) -> None:
    """One process stepping ``num_envs`` native steppers (no engine, no hand-off); puts its env steps/s."""
    from tdcollect.envs.libs.atari import native_stepper

    envs = [make_atari84() for _ in range(num_envs)]
    rows = _Rows(num_envs, envs[0].observation_space.shape, envs[0].observation_space.dtype)
    steppers = []
    for i, env in enumerate(envs):
        stepper = native_stepper(env)
        stepper.bind(rows, i)
        stepper.reset(seed=i)
        steppers.append(stepper)
    rng = np.random.default_rng(0)
    actions = rows.action_np["action"]
    for _ in range(3):  # past the checked steps of gym.make's PassiveEnvChecker
        for stepper in steppers:
            stepper.step()
    began = time.perf_counter()
    for _ in range(steps):
        actions[:] = rng.integers(0, 6, num_envs)
        for stepper in steppers:
            stepper.step()
    out.put(steps * num_envs / (time.perf_counter() - began))
    for env in envs:
        env.close()


def ceiling(steps: int, envs_per_worker: int = ENVS_PER_WORKER) -> float:
    """Env steps/s of :data:`WORKERS` processes each stepping ``envs_per_worker`` envs natively, no hand-off."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    processes = [context.Process(target=_native_loop, args=(envs_per_worker, steps, out)) for _ in range(WORKERS)]
    for process in processes:
        process.start()
    rates = [out.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return sum(rates)


def per_step_profile(steps: int = 3000) -> dict[str, float]:
    """µs per step of each part of the road, one env here (see the module docstring)."""
    import cv2

    from tdcollect.envs.libs.atari import AtariFrames, chain_of

    env = make_atari84()
    env.reset(seed=0)
    frames = AtariFrames(env, chain_of(env)[0])
    pre = env.env
    ale = pre.ale
    action_set = env.unwrapped._action_set
    buffers = pre.obs_buffer
    stack = np.empty(env.observation_space.shape, env.observation_space.dtype)
    parts = dict.fromkeys(("emulator", "screens", "max-pool", "resize", "stack"), 0.0)
    clock = time.perf_counter
    counted = 0
    actions = np.random.default_rng(0).integers(0, 6, steps)
    for action in actions:
        began = clock()
        for _ in range(4):
            ale.act(action_set[action], 1.0)
        emulated = clock()
        ale.getScreenGrayscale(buffers[1])
        ale.getScreenGrayscale(buffers[0])
        screened = clock()
        np.maximum(buffers[0], buffers[1], out=buffers[0])
        pooled = clock()
        frame = cv2.resize(buffers[0], (84, 84), interpolation=cv2.INTER_AREA)
        resized = clock()
        frames.stacked(frame, stack)
        stacked = clock()
        if ale.game_over():
            env.reset()
            continue
        counted += 1
        for key, (start, end) in zip(parts, ((began, emulated), (emulated, screened), (screened, pooled),
                                             (pooled, resized), (resized, stacked))):
            parts[key] += end - start
    out = {key: value / counted * 1e6 for key, value in parts.items()}
    out["native step (sum)"] = sum(out.values())
    wrapped = make_atari84()
    wrapped.reset(seed=0)
    began = clock()
    for action in actions:
        _, _, terminated, truncated, _ = wrapped.step(action)
        if terminated or truncated:
            wrapped.reset()
    out["gymnasium's step of the chain"] = (clock() - began) / steps * 1e6
    env.close()
    wrapped.close()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150, help="batched steps per timed run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/atari_profile.json"))
    args = parser.parse_args(argv)
    num_envs = WORKERS * ENVS_PER_WORKER
    systems = {
        "ceiling (2 processes x 16 envs, native, no hand-off)": lambda: ceiling(args.steps),
        "tdcollect rollout (2 x 16)": lambda: run_tdcollect_parallel("atari84", num_envs, WORKERS, args.steps),
        "tdcollect step loop (2 x 16)": lambda: run_tdcollect_step_loop("atari84", num_envs, WORKERS, args.steps),
        "envpool (32 envs, 2 threads)": lambda: run_envpool("atari84", num_envs, WORKERS, args.steps),
    }
    rates: dict[str, list[float]] = {name: [] for name in systems}
    profiles = []
    for round_index in range(args.rounds):
        profiles.append(per_step_profile())
        for name, run in systems.items():
            rate = run()
            rates[name].append(rate if isinstance(rate, float) else rate["steps_per_s"])
            print(f"round {round_index} {name}: {rates[name][-1]:,.0f} env steps/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    profile = {key: statistics.median(p[key] for p in profiles) for key in profiles[0]}
    envpool = medians["envpool (32 envs, 2 threads)"]
    print("\nper step, one env (µs, medians of the rounds):")
    for key, value in profile.items():
        print(f"  {key:32s} {value:7.1f}")
    print("\nenv steps/s (medians), and as a ratio to EnvPool:")
    for name, value in medians.items():
        print(f"  {name:55s} {value:8,.0f}  {value / envpool:5.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"per_step_us": profile, "env_steps_per_s": medians, "rounds": rates,
                                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
