"""The same numbers in every run, on a busy machine: ``tests/seeded_scripts/ddpg_shaped.py`` (a seeded DDPG-shaped
TorchRL script: random frames first, Ornstein-Uhlenbeck noise, replay-buffer sampling, DDPG losses, TorchRL's CSV
logger, no ``collector.set_seed``) run again and again beside CPU hogs, as shipped, under ``tdcollect run`` and
written with tdcollect's classes directly, one env and 4 envs (2 workers x 2 envs under the command on 2 cores); each
run's logs compared byte for byte with the first shipped run's. Then the same script with the replay buffer's
``prefetch=3`` (as TorchRL's ``ddpg.py``), 50 updates per batch and 2,400 frames, shipped and under the command: the
outcomes it logs.

    python -m benchmarks.same_numbers [--rounds 20] [--hogs 2] [--prefetch-rounds 10] [--md out.md]

Runs go in rounds, one of each kind per round in turn, so the load is the same for every kind.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .report import print_and_save

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "seeded_scripts" / "ddpg_shaped.py"
#: (label, tdcollect run?, script arguments)
KINDS = [
    ("shipped, 1 env", False, ["1"]),
    ("tdcollect run, 1 env", True, ["1"]),
    ("tdcollect's classes, 1 env", False, ["1", "--ours"]),
    ("shipped, 4 envs", False, ["4"]),
    ("tdcollect run, 4 envs (2 x 2)", True, ["4"]),
    ("tdcollect's classes, 2 x 2", False, ["4", "--ours"]),
]
PREFETCH_KINDS = [
    ("shipped, prefetch=3", False, ["1", "--prefetch", "3", "--updates", "50", "--total-frames", "2400"]),
    ("tdcollect run, prefetch=3", True, ["1", "--prefetch", "3", "--updates", "50", "--total-frames", "2400"]),
]


def _hog() -> None:
    while True:
        pass


def logs_digest(log_dir: Path) -> str:
    """A digest of every CSV file the logger wrote (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(log_dir.rglob("*.csv")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def run_once(command: bool, arguments: list[str], log_dir: Path) -> str:
    prefix = ["-m", "tdcollect", "run"] if command else []
    done = subprocess.run([sys.executable, *prefix, str(SCRIPT), str(log_dir), *arguments], capture_output=True,
                          text=True, timeout=600, cwd=SCRIPT.parent)
    if done.returncode:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return logs_digest(log_dir)


def rounds_of(kinds: list, rounds: int, tmp: Path) -> dict[str, list[str]]:
    outcomes: dict[str, list[str]] = {label: [] for label, _, _ in kinds}
    for r in range(rounds):
        for k, (label, command, arguments) in enumerate(kinds):
            outcomes[label].append(run_once(command, arguments, tmp / f"{r}-{k}"))
        print(f"round {r + 1}: " + ", ".join(f"{label}: {runs[-1]}" for label, runs in outcomes.items()),
              flush=True)
    return outcomes


def table(outcomes: dict[str, list[str]], reference: dict[str, str]) -> list[str]:
    lines = ["| runs | same as the first shipped run | outcomes (digest: runs) |", "|---|---:|---|"]
    for label, runs in outcomes.items():
        same = sum(run == reference[label] for run in runs)
        counts = ", ".join(f"{digest}: {n}" for digest, n in Counter(runs).most_common())
        lines.append(f"| {label} | {same} of {len(runs)} | {counts} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prefetch-rounds", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=2, help="CPU-bound processes running beside the runs")
    parser.add_argument("--md", type=Path, default=None, help="write the tables there (markdown)")
    args = parser.parse_args(argv)
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outcomes = rounds_of(KINDS, args.rounds, Path(tmp)) if args.rounds else {}
            first = {label: runs[0] for label, runs in outcomes.items() if label.startswith("shipped")}
            reference = {label: first["shipped, 1 env" if "1 env" in label else "shipped, 4 envs"]
                         for label in outcomes}
            prefetched = rounds_of(PREFETCH_KINDS, args.prefetch_rounds, Path(tmp) / "prefetch")
    finally:
        for hog in hogs:
            hog.kill()
    main_table = [*table(outcomes, reference), ""] if outcomes else []
    prefetch_table = []
    if args.prefetch_rounds:
        prefetch_reference = {label: prefetched["shipped, prefetch=3"][0] for label in prefetched}
        prefetch_table = ["With the replay buffer's prefetch=3, 50 updates per batch, 2,400 frames:", "",
                          *table(prefetched, prefetch_reference)]
    lines = [f"{args.hogs} CPU hogs beside every run; {time.monotonic() - began:.0f} s in all.", "", *main_table,
             *prefetch_table]
    print_and_save(lines, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
