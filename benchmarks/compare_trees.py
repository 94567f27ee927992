"""Before/after: the project benchmark on two versions of the package, their rounds interleaved.

Each round runs ``python -m benchmarks.run <args> --rounds 1`` once per version, in a fresh process whose
``import tdcollect`` finds that version: ``--base`` (a git revision, checked out in a temporary worktree) and this
working tree. The benchmark harness itself is this tree's for both, so only the package differs. The table gives,
per point and system, the median steps/s and the median of the per-round ratios to the serial loop, base -> this
tree.

    python -m benchmarks.compare_trees --base cfd2de3 --rounds 3 -- --workloads atari costly --workers 2 \\
        --envs-per-worker 4 --steps 300 --systems serial tdcollect_parallel tdcollect_step_loop
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_path(tree: str, shim: str) -> str:
    """A folder holding only ``tdcollect`` -> ``tree``: first on ``PYTHONPATH``, it is the package imported."""
    os.makedirs(shim, exist_ok=True)
    os.symlink(tree, os.path.join(shim, "tdcollect"))
    return shim


@contextlib.contextmanager
def worktree(revision: str, folder: str):
    """Git revision ``revision`` checked out (detached) in ``folder`` while the block runs; removed after."""
    subprocess.run(["git", "worktree", "add", "--detach", folder, revision], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", folder], cwd=REPO, check=False)


def run_round(shim: str, run_args: list[str], out: str) -> list[dict]:
    """One ``benchmarks.run`` round with the package in ``shim``; its runs (``results.json``'s ``"runs"``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([shim, REPO, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "benchmarks.run", *run_args, "--rounds", "1", "--out", out], cwd=REPO,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "results.json")) as f:
        return [r for r in json.load(f)["runs"] if "steps_per_s" in r]


def table(rounds: dict[str, list[list[dict]]]) -> str:
    """Markdown: per (workload, num_envs, system), base -> head medians of steps/s and of per-round ratios."""
    cells = collections.defaultdict(lambda: collections.defaultdict(lambda: ([], [])))
    for version, per_round in rounds.items():
        for runs in per_round:
            serial = {(r["workload"], r["num_envs"]): r["steps_per_s"] for r in runs if r["system"] == "serial"}
            for r in runs:
                point = (r["workload"], r["num_envs"])
                rates, ratios = cells[(*point, r["system"])][version]
                rates.append(r["steps_per_s"])
                if point in serial:
                    ratios.append(r["steps_per_s"] / serial[point])
    lines = ["| workload | envs | system | base steps/s (x serial) | this tree steps/s (x serial) |",
             "|---|---:|---|---:|---:|"]
    for (workload, num_envs, system), by_version in sorted(cells.items()):
        shown = []
        for version in ("base", "head"):
            rates, ratios = by_version[version]
            ratio = f" ({statistics.median(ratios):.2f}x)" if ratios else ""
            shown.append(f"{statistics.median(rates):,.0f}{ratio}" if rates else "-")
        lines.append(f"| {workload} | {num_envs} | {system} | {shown[0]} | {shown[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, run_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description="the benchmark on a git revision and on this tree, rounds interleaved")
    p.add_argument("--base", required=True, help="git revision to compare this working tree with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="also write every round's runs to this file")
    args = p.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="compare_trees_") as tmp:
        with worktree(args.base, os.path.join(tmp, "base")) as base_tree:
            shims = {"base": package_path(base_tree, os.path.join(tmp, "base_path")),
                     "head": package_path(REPO, os.path.join(tmp, "head_path"))}
            rounds: dict[str, list[list[dict]]] = {"base": [], "head": []}
            for r in range(args.rounds):
                for version, shim in shims.items():
                    rounds[version].append(run_round(shim, run_args, os.path.join(tmp, f"{version}_{r}")))
                    print(f"round {r} {version} done", flush=True)
    print(f"\nbase = {args.base}, this tree = {REPO}; {args.rounds} rounds, interleaved\n")
    print(table(rounds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"base": args.base, "run_args": run_args, "rounds": rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
