"""Bar chart of ratios to the serial loop from one or more ``results.json`` files of ``benchmarks.run``.

    python -m benchmarks.plot_ratios benchmarks/results/real_workloads_2x4.json \
        benchmarks/results/real_workloads_2x16.json benchmarks/results/meltingpot.json \
        --out benchmarks/results/real_workloads.png
"""
from __future__ import annotations

import argparse
import json

from .report import plot_ratios

#: The systems drawn by default: the anchors, then ours.
DEFAULT_SYSTEMS = ["envpool", "gym_async", "sb3_subproc", "torchrl_parallel", "torchrl_random_collector",
                   "tdcollect_parallel", "tdcollect_step_loop", "tdcollect_random_collector"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files written by benchmarks.run")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS)
    args = parser.parse_args(argv)
    results = [r for path in args.results for r in json.load(open(path))["results"]]
    print(f"wrote {plot_ratios(results, args.out, args.systems)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
