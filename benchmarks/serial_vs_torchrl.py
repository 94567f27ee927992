"""tdcollect's ``SerialEnv`` against TorchRL's, 4 envs in this process: PettingZoo MPE (``simple_spread_v3`` through
TorchRL's ``PettingZooEnv``; MPE is in ``pettingzoo[mpe]==1.24.3``, skipped where it is not installed), CartPole and
Pendulum (TorchRL's ``GymEnv``). Two roads each: a step loop (``rand_action`` then ``step_and_maybe_reset``, as
TorchRL's collector steps a batched env) and each library's ``Collector`` with random actions (its batches of 400
frames).

    python -m benchmarks.serial_vs_torchrl [--rounds 5] [--envs mpe cartpole pendulum] [--md out.md]

Each round builds, times and closes TorchRL's env and then ours, in turn (interleaved rounds: the VM's speed moves);
the table gives medians of frames per second and the ratio ours / TorchRL's.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

from .report import print_and_save

LOOP_STEPS = 200
BATCH_FRAMES = 400
BATCHES = 3


def mpe():
    from torchrl.envs import PettingZooEnv

    return PettingZooEnv(task="simple_spread_v3", parallel=True, seed=0, continuous_actions=False)


def makers() -> dict:
    from torchrl.envs import GymEnv

    out = {"mpe": mpe, "cartpole": functools.partial(GymEnv, "CartPole-v1"),
           "pendulum": functools.partial(GymEnv, "Pendulum-v1")}
    try:
        import pettingzoo.mpe  # noqa: F401
    except ImportError:
        print("PettingZoo MPE is not installed (pip install 'pettingzoo[mpe]==1.24.3'): its rows are skipped",
              file=sys.stderr)
        del out["mpe"]
    return out


def step_loop(env, steps: int = LOOP_STEPS) -> float:
    """Frames per second of ``steps`` steps of random actions through ``step_and_maybe_reset``."""
    td = env.reset()
    for _ in range(10):  # (warm-up)
        td = env.rand_action(td)
        _, td = env.step_and_maybe_reset(td)
    began = time.perf_counter()
    for _ in range(steps):
        td = env.rand_action(td)
        _, td = env.step_and_maybe_reset(td)
    return steps * env.batch_size.numel() / (time.perf_counter() - began)


def collector_batches(collector_class, env) -> float:
    """Frames per second of ``BATCHES`` batches of a random-action collector over ``env`` (after a first one)."""
    collector = collector_class(env, None, frames_per_batch=BATCH_FRAMES, total_frames=-1)
    batches = iter(collector)
    next(batches)
    began = time.perf_counter()
    for _ in range(BATCHES):
        next(batches)
    rate = BATCHES * BATCH_FRAMES / (time.perf_counter() - began)
    collector.shutdown()
    return rate


def one_round(name: str, make, results: dict) -> None:
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    from tdcollect.collectors import Collector
    from tdcollect.envs import SerialEnv

    for impl, serial, collector in (("torchrl", TorchRLSerialEnv, TorchRLCollector), ("ours", SerialEnv, Collector)):
        env = serial(4, make)
        env.set_seed(0)
        results[(name, "step loop", impl)].append(step_loop(env))
        env.close()
        env = serial(4, make)
        env.set_seed(0)
        results[(name, "Collector", impl)].append(collector_batches(collector, env))
        if not env.is_closed:
            env.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--envs", nargs="+", default=["mpe", "cartpole", "pendulum"])
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args(argv)
    available = makers()
    names = [name for name in args.envs if name in available]
    results: dict = {(name, road, impl): [] for name in names for road in ("step loop", "Collector")
                     for impl in ("torchrl", "ours")}
    for r in range(args.rounds):
        for name in names:
            one_round(name, available[name], results)
        print(f"round {r + 1} done", flush=True)
    lines = [f"SerialEnv of 4 envs, medians of {args.rounds} interleaved rounds (frames/s)", "",
             "| env | road | TorchRL's SerialEnv | tdcollect's SerialEnv | ours / TorchRL's |",
             "|---|---|---:|---:|---:|"]
    for name in names:
        for road in ("step loop", "Collector"):
            theirs = statistics.median(results[(name, road, "torchrl")])
            ours = statistics.median(results[(name, road, "ours")])
            lines.append(f"| {name} | {road} | {theirs:,.0f} | {ours:,.0f} | {ours / theirs:.2f} |")
    print_and_save(lines, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
