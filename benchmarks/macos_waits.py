"""The hand-offs under macOS' semaphore semantics: three loops over 2 workers x 1 costly env (CartPole + 200 µs of CPU
per step), spawn, ours against gymnasium's ``AsyncVectorEnv``, with Linux' semantics and with macOS' imitated in every
process (``tests/macos_semantics/sitecustomize.py``: a timed semaphore wait polls with sleeps of 0, 1, 2 ... 20 ms).

Loops (env steps/s):

- ``step_loop``: the public ``step_and_maybe_reset`` loop (``AsyncVectorEnv.step``);
- ``collect_train``: 30 ms of the learner's own work (busy CPU in this process), then 64 steps, over and over; the
  rate of the collection alone (the workers wait through the training, so its first step wakes them);
- ``policy_2ms``: a 2 ms policy forward (busy CPU in this process) before every step.

Each (version, system, semantics) runs in a fresh process, their rounds interleaved; ``--base REV`` adds the package
of git revision ``REV`` (a temporary worktree) as the version "base" beside this tree's ("head"). The table gives
medians; ``macOS / Linux`` is the median of the per-round ratios of the same version and system.

    python -m benchmarks.macos_waits --rounds 3 --base df2cdd8 --json benchmarks/results/macos_waits.json
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.compare_trees import package_path, worktree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMITATION = os.path.join(REPO, "tests", "macos_semantics")
LOOPS = ("step_loop", "collect_train", "policy_2ms")
SYSTEMS = ("tdcollect", "gym_async")
SEMANTICS = ("linux", "macos")
NUM_ENVS = 2
STEPS = {"step_loop": 3000, "collect_train": 60, "policy_2ms": 500}  # (collect_train: iterations of 64 steps)
TRAIN_S = 0.030
POLICY_S = 0.002
WARMUP = 100


def burn(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class Ours:
    def __init__(self):
        import torch

        from benchmarks.workloads import make_costly
        from tdcollect.envs import ParallelEnv

        self.env = ParallelEnv(NUM_ENVS, make_costly, mp_start_method="spawn")
        self.td = self.env.reset()
        self.action = torch.zeros(self.env.action_spec.shape, dtype=self.env.action_spec.dtype)

    def step(self) -> None:
        self.td["action"] = self.action
        _, self.td = self.env.step_and_maybe_reset(self.td)

    def close(self) -> None:
        self.env.close()


class GymAsync:
    def __init__(self):
        import gymnasium as gym
        import numpy as np

        from benchmarks.workloads import make_costly

        self.envs = gym.vector.AsyncVectorEnv([make_costly] * NUM_ENVS, context="spawn")
        self.envs.reset(seed=0)
        self.action = np.zeros(NUM_ENVS, dtype=np.int64)

    def step(self) -> None:
        self.envs.step(self.action)

    def close(self) -> None:
        self.envs.close()


def measure(system: str) -> dict[str, float]:
    """Env steps/s of each loop, for ``system`` in this process."""
    runner = Ours() if system == "tdcollect" else GymAsync()
    rates = {}
    try:
        for loop in LOOPS:
            for _ in range(WARMUP):
                runner.step()
            began = time.perf_counter()
            if loop == "step_loop":
                for _ in range(STEPS[loop]):
                    runner.step()
                steps = STEPS[loop]
            elif loop == "collect_train":  # (the rate of the collection alone: the training is the user's)
                collecting = 0.0
                for _ in range(STEPS[loop]):
                    burn(TRAIN_S)
                    began = time.perf_counter()
                    for _ in range(64):
                        runner.step()
                    collecting += time.perf_counter() - began
                rates[loop] = 64 * STEPS[loop] * NUM_ENVS / collecting
                continue
            else:
                for _ in range(STEPS[loop]):
                    burn(POLICY_S)
                    runner.step()
                steps = STEPS[loop]
            rates[loop] = steps * NUM_ENVS / (time.perf_counter() - began)
    finally:
        runner.close()
    return rates


def run_child(system: str, semantics: str, shim: str | None) -> dict[str, float]:
    path = [IMITATION] if semantics == "macos" else []
    path += [shim] if shim else []
    path += [REPO, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.macos_waits", "--child", system], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{system} / {semantics}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    cells = collections.defaultdict(list)
    for r in results:
        cells[(r["version"], r["system"], r["semantics"], r["loop"])].append(r)
    lines = ["| loop | version | system | Linux semantics | macOS semantics | macOS / Linux |",
             "|---|---|---|---:|---:|---:|"]
    for loop in LOOPS:
        for version in sorted({r["version"] for r in results}, reverse=True):
            for system in SYSTEMS:
                linux = cells[(version, system, "linux", loop)]
                macos = cells[(version, system, "macos", loop)]
                if not linux or not macos:
                    continue
                ratios = [m["rate"] / x["rate"] for x, m in zip(linux, macos)]
                lines.append(f"| {loop} | {version} | {system} | {statistics.median(x['rate'] for x in linux):,.0f} | "
                             f"{statistics.median(m['rate'] for m in macos):,.0f} | {statistics.median(ratios):.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", help="a git revision to measure beside this tree")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--json", help="write every round's rates here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        versions = {"head": package_path(REPO, os.path.join(scratch, "head"))}
        if args.base:
            tree = stack.enter_context(worktree(args.base, os.path.join(scratch, "base-tree")))
            versions["base"] = package_path(tree, os.path.join(scratch, "base"))
        results = []
        for round_ in range(args.rounds):
            for version, shim in versions.items():
                for system in args.systems:
                    if system == "gym_async" and version == "base":
                        continue  # (gymnasium is the same in both)
                    for semantics in SEMANTICS:
                        rates = run_child(system, semantics, shim)
                        for loop, rate in rates.items():
                            results.append({"round": round_, "version": version, "system": system,
                                            "semantics": semantics, "loop": loop, "rate": rate})
                        print(f"round {round_} {version} {system} {semantics}: "
                              + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items()), flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "table": table(results)}, f, indent=1)


if __name__ == "__main__":
    main()
