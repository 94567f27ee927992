"""tdcollect's ``SerialEnv`` against TorchRL's, 4 envs in this process: PettingZoo MPE (``simple_spread_v3`` through
TorchRL's ``PettingZooEnv``; MPE is in ``pettingzoo[mpe]==1.24.3``, skipped where it is not installed), CartPole and
Pendulum (TorchRL's ``GymEnv``). Two roads each: a step loop (``rand_action`` then ``step_and_maybe_reset``, as
TorchRL's collector steps a batched env) and each library's ``Collector`` with random actions (its batches of 400
frames).

    python -m benchmarks.serial_vs_torchrl [--rounds 5] [--envs mpe cartpole pendulum] [--md out.md]

Each round builds both libraries' envs side by side and times them in alternating blocks (one block of each, then
the other order: the VM's speed moves within seconds, and both see the same spells), then closes them, and the same
for the collectors. The table gives medians over rounds of frames per second, their ratio ours / TorchRL's, and
the median (and range) of the rounds' own ratios.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

from .report import print_and_save

#: each round, each library's env (and collector) alive side by side, timed in alternating blocks (ABBA...): the
#: VM's speed moves within seconds, and a block of each library sees the same spell
BLOCKS = 8
BLOCK_STEPS = 50
BLOCK_BATCHES = 1
BATCH_FRAMES = 400
IMPLS = ("torchrl", "ours")


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


def alternating(runners: dict, frames_per_block: int, blocks: int = BLOCKS) -> dict:
    """Frames per second of each of ``runners`` (name -> a function running one block), timed in ``blocks`` blocks
    each, in alternating order (one block of each, then the other order, ...)."""
    spent = dict.fromkeys(runners, 0.0)
    for block in range(blocks):
        order = list(runners) if block % 2 == 0 else list(reversed(runners))
        for name in order:
            began = time.perf_counter()
            runners[name]()
            spent[name] += time.perf_counter() - began
    return {name: blocks * frames_per_block / seconds for name, seconds in spent.items()}


class StepLoop:
    """``rand_action`` then ``step_and_maybe_reset`` on ``env`` (as TorchRL's collector steps a batched env), from a
    reset and 10 warm-up steps; each call runs ``BLOCK_STEPS`` steps."""

    def __init__(self, env):
        self.env = env
        self.td = env.reset()
        for _ in range(10):
            self()

    def __call__(self, steps: int = 1) -> None:
        env = self.env
        td = self.td
        for _ in range(steps):
            td = env.rand_action(td)
            _, td = env.step_and_maybe_reset(td)
        self.td = td


def one_round(name: str, make, results: dict) -> None:
    """One round of env ``name``: both libraries' step loops side by side, closed, then both ``Collector``s."""
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import SerialEnv as TorchRLSerialEnv

    from tdcollect.collectors import Collector
    from tdcollect.envs import SerialEnv

    serials = {"torchrl": TorchRLSerialEnv, "ours": SerialEnv}
    envs = {impl: serials[impl](4, make) for impl in IMPLS}
    for env in envs.values():
        env.set_seed(0)
    loops = {impl: StepLoop(env) for impl, env in envs.items()}
    frames = BLOCK_STEPS * 4
    rates = alternating({impl: functools.partial(loop, BLOCK_STEPS) for impl, loop in loops.items()}, frames)
    for impl, rate in rates.items():
        results[(name, "step loop", impl)].append(rate)
    for env in envs.values():
        env.close()
    collectors = {"torchrl": TorchRLCollector, "ours": Collector}
    envs = {impl: serials[impl](4, make) for impl in IMPLS}
    batches = {}
    runners = {}
    for impl, env in envs.items():
        env.set_seed(0)
        collector = collectors[impl](env, None, frames_per_batch=BATCH_FRAMES, total_frames=-1)
        batches[impl] = (collector, iter(collector))
        next(batches[impl][1])  # (the first batch, untimed)
        runners[impl] = functools.partial(_batches, batches[impl][1], BLOCK_BATCHES)
    rates = alternating(runners, BLOCK_BATCHES * BATCH_FRAMES)
    for impl, rate in rates.items():
        results[(name, "Collector", impl)].append(rate)
    for impl, env in envs.items():
        batches[impl][0].shutdown()
        if not env.is_closed:
            env.close()


def _batches(iterator, count: int) -> None:
    for _ in range(count):
        next(iterator)


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
    lines = [f"SerialEnv of 4 envs, medians of {args.rounds} rounds (frames/s; each round both libraries side by "
             f"side, {BLOCKS} alternating blocks each)", "",
             "| env | road | TorchRL's SerialEnv | tdcollect's SerialEnv | ours / TorchRL's | paired ratio, median "
             "(range) |",
             "|---|---|---:|---:|---:|---:|"]
    for name in names:
        for road in ("step loop", "Collector"):
            theirs = results[(name, road, "torchrl")]
            ours = results[(name, road, "ours")]
            paired = sorted(a / b for a, b in zip(ours, theirs))
            lines.append(f"| {name} | {road} | {statistics.median(theirs):,.0f} | {statistics.median(ours):,.0f} | "
                         f"{statistics.median(ours) / statistics.median(theirs):.2f} | "
                         f"{statistics.median(paired):.2f} ({paired[0]:.2f}–{paired[-1]:.2f}) |")
    print_and_save(lines, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
