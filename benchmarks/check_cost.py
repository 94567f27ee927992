"""What the value checks cost: the always-on checks of every stored value (shapes, ``None``, values that do not fit
the buffer's dtype) against a git revision without them, and the opt-in ``check_values=True``, on the cheap
(CartPole) and pixel (84x84x3 uint8) workloads::

    python -m benchmarks.check_cost --base 8def4bd --rounds 9 --out benchmarks/results/check_cost.md

The base revision is checked out into a temporary worktree and imported beside this tree, as ``tdbase.envs``, in
the same process: the variants are measured in turn within each round, each round starting with the next one,
and medians are reported. (Run in separate processes, the same code measured up to 15 % apart from one process to
the next on this 2-core VM, more than the checks cost.)

Rows: ``SerialEnv(32) step`` is ``step_buffers()`` in this process (every check's cost is in it, no worker hides
it); ``ParallelEnv 2x16 rollout`` is ``rollout(200)`` on two workers of 16 envs (what a user times).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_base(revision: str, where: str):
    """``tdbase.envs``: the ``envs`` package of ``revision``, checked out under ``where``."""
    tree = os.path.join(where, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, revision], check=True,
                   capture_output=True)
    package = os.path.join(where, "pkg", "tdbase")
    os.makedirs(package)
    open(os.path.join(package, "__init__.py"), "w").close()
    os.symlink(os.path.join(tree, "envs"), os.path.join(package, "envs"))
    sys.path.insert(0, os.path.join(where, "pkg"))
    return importlib.import_module("tdbase.envs")


def serial_step_us(envs, factory, steps: int, **options) -> float:
    env = envs.SerialEnv(32, factory, **options)
    try:
        env.reset()
        for _ in range(100):
            env.step_buffers()
        start = time.perf_counter()
        for _ in range(steps):
            env.step_buffers()
        return (time.perf_counter() - start) / steps * 1e6
    finally:
        env.close()


def parallel_steps_s(envs, factory, **options) -> float:
    env = envs.ParallelEnv(2, factory, envs_per_worker=16, **options)
    try:
        env.rollout(50, break_when_any_done=False)
        start = time.perf_counter()
        for _ in range(3):
            env.rollout(200, break_when_any_done=False)
        return 3 * 200 * 32 / (time.perf_counter() - start)
    finally:
        env.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision without the always-on value checks")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=2000, help="serial steps timed per run")
    parser.add_argument("--workloads", nargs="+", default=["cheap", "pixels"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import tdcollect.envs as ours
    from benchmarks.workloads import WORKLOADS

    with tempfile.TemporaryDirectory() as where:
        try:
            base = import_base(args.base, where)
            variants = {f"base {args.base}": (base, {}), "this tree": (ours, {}),
                        "this tree, check_values=True": (ours, {"check_values": True})}
            results = {(w, v): [] for w in args.workloads for v in variants}
            for r in range(args.rounds):
                names = list(variants)
                names = names[r % len(names):] + names[:r % len(names)]
                for workload in args.workloads:
                    for name in names:
                        envs, options = variants[name]
                        factory = WORKLOADS[workload]
                        results[workload, name].append((serial_step_us(envs, factory, args.steps, **options),
                                                        parallel_steps_s(envs, factory, **options)))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", os.path.join(where, "tree")],
                           capture_output=True)
    lines = [f"# Value checks: cost per step ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one process, "
             f"medians of {args.rounds} interleaved rounds)", "",
             "| workload | variant | SerialEnv(32) step, µs | vs base | ParallelEnv 2x16 rollout, steps/s | vs base |",
             "|---|---|---:|---:|---:|---:|"]
    for workload in args.workloads:
        base_us = base_sps = None
        for name in variants:
            runs = results[workload, name]
            us, sps = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            base_us, base_sps = base_us or us, base_sps or sps
            lines.append(f"| {workload} | {name} | {us:.1f} | {us / base_us:.3f} | {sps:,.0f} | {sps / base_sps:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
