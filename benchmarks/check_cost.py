"""What the value checks cost: the always-on checks of every stored value (shapes, ``None``, values that do not fit
the buffer's dtype) against a git revision without them, and the opt-in ``check_values=True``, on the cheap
(CartPole) and pixel (84x84x3 uint8) workloads.

Each variant runs in a fresh process, the variants interleaved round by round; medians are reported::

    python -m benchmarks.check_cost --base 8def4bd --rounds 5 --out benchmarks/results/check_cost.md

Rows: ``serial step`` is ``SerialEnv(32).step_buffers()`` in this process (every check's cost is in it, no worker
hides it); ``parallel rollout`` is ``ParallelEnv(2, envs_per_worker=16).rollout(200)`` (what a user times).
The base revision is checked out into a temporary worktree and imported in place of this tree.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MEASURE = r"""
import json, sys, time
sys.path.insert(0, {root!r})
import torch
from benchmarks.workloads import WORKLOADS
from tdcollect.envs import ParallelEnv, SerialEnv
factory = WORKLOADS[{workload!r}]
opts = {{"check_values": True}} if {check_values} else {{}}
env = SerialEnv(32, factory, **opts)
env.reset()
actions = env.action_buffers[0][1]
for _ in range(200):
    actions.copy_(env.full_action_spec.rand()["action"]); env.step_buffers()
start = time.perf_counter()
for _ in range({steps}):
    env.step_buffers()
serial_us = (time.perf_counter() - start) / {steps} * 1e6
env.close()
env = ParallelEnv(2, factory, envs_per_worker=16, **opts)
env.rollout(50, break_when_any_done=False)
start = time.perf_counter()
for _ in range(3):
    env.rollout(200, break_when_any_done=False)
parallel = 3 * 200 * 32 / (time.perf_counter() - start)
env.close()
print(json.dumps({{"serial_us": serial_us, "parallel_steps_s": parallel}}))
"""


def base_tree(revision: str, where: str) -> str:
    """A checkout of ``revision`` importable as ``tdcollect`` (``where/pkg`` on ``PYTHONPATH``)."""
    tree = os.path.join(where, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, revision], check=True,
                   capture_output=True)
    package = os.path.join(where, "pkg", "tdcollect")
    os.makedirs(package)
    open(os.path.join(package, "__init__.py"), "w").close()
    for name in ("envs", "collectors"):
        os.symlink(os.path.join(tree, name), os.path.join(package, name))
    return os.path.join(where, "pkg")


def run_variant(workload: str, steps: int, check_values: bool, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = MEASURE.format(root=ROOT, workload=workload, steps=steps, check_values=check_values)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision without the always-on value checks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000, help="serial steps timed per run")
    parser.add_argument("--workloads", nargs="+", default=["cheap", "pixels"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as where:
        base = base_tree(args.base, where)
        variants = {f"base {args.base}": (False, base), "this tree": (False, None),
                    "this tree, check_values=True": (True, None)}
        results = {(w, v): [] for w in args.workloads for v in variants}
        try:
            for r in range(args.rounds):
                for workload in args.workloads:
                    for name, (check, path) in variants.items():
                        results[workload, name].append(run_variant(workload, args.steps, check, path))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", os.path.join(where, "tree")],
                           capture_output=True)
    lines = [f"# Value checks: cost per step ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, medians of "
             f"{args.rounds} interleaved rounds)", "",
             "| workload | variant | SerialEnv(32) step, µs | vs base | ParallelEnv 2x16 rollout, steps/s | vs base |",
             "|---|---|---:|---:|---:|---:|"]
    for workload in args.workloads:
        base_us = base_sps = None
        for name in variants:
            runs = results[workload, name]
            us = statistics.median(r["serial_us"] for r in runs)
            sps = statistics.median(r["parallel_steps_s"] for r in runs)
            base_us, base_sps = base_us or us, base_sps or sps
            lines.append(f"| {workload} | {name} | {us:.1f} | {us / base_us:.3f} | {sps:,.0f} | {sps / base_sps:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
