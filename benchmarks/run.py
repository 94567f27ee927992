"""Command-line driver for the env-stepping throughput benchmarks.

Examples::

    python -m benchmarks.run --quick
    python -m benchmarks.run --workloads cheap pixels --workers 1 2 4 \\
        --envs-per-worker 1 4 32 --steps 1000 --systems serial torchrl_parallel
    python -m benchmarks.run --quick --startup     # also start-up / memory
    python -m benchmarks.run --quick --rounds 3    # every point 3 times, systems interleaved

Every system in :data:`SYSTEMS` is called as
``run(workload, num_envs, num_workers, steps) -> dict`` for each
(workload, envs per worker, workers) point, with
``num_envs = workers * envs_per_worker``.  With ``--rounds N`` every point is
measured N times, all systems once per round (so a slow spell of a shared
machine hits every system alike); the table gives the median steps/s and
the median of the per-round ratios to ``serial``.  Results go to ``--out`` as
``results.json``, ``results.md`` (markdown table) and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import json
import os
import platform
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import anchors, ours, report
from .ours import SystemUnavailable
from .workloads import BASIC_WORKLOADS, WORKLOADS

RunFn = Callable[[str, int, int, int], dict]

#: Every benchmarked system: ``name -> run(workload, num_envs, num_workers,
#: steps)``.  The project's own systems sit at the end; they are skipped
#: with a note while ``envs`` / ``collectors`` are unavailable.
SYSTEMS: dict[str, RunFn] = {**anchors.ANCHORS, **ours.OURS}
#: ``name -> (build(workload, num_envs, num_workers), first_use, close)``.
BUILDERS = {**anchors.BUILDERS, **ours.BUILDERS}
#: Systems that start one process per env whatever ``num_workers`` says.
ONE_PROCESS_PER_ENV = {"gym_async", "sb3_subproc"}
#: Seconds the interpreter may take to exit after the results are written (see the end of this file).
EXIT_WATCHDOG_S = 60

#: ``--quick``: one point per workload (TorchRL's spawn start-up of several
#: seconds per run dominates the wall time on 2 cores).
QUICK = {"workloads": BASIC_WORKLOADS, "workers": [2],
         "envs_per_worker": [4], "steps": 300}
FULL = {"workloads": BASIC_WORKLOADS, "workers": [1, 2, 4],
        "envs_per_worker": [1, 4, 32], "steps": 1000}


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the CLI; unset options fall back to ``--quick`` or full presets."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"small preset: {QUICK}")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS))
    p.add_argument("--workers", nargs="+", type=int)
    p.add_argument("--envs-per-worker", nargs="+", type=int)
    p.add_argument("--steps", type=int, help="batched steps per run")
    p.add_argument("--timeout", type=int, default=600,
                   help="seconds one run may take before it is recorded as "
                        "an error (a hung anchor does not stop the benchmark)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every point this many times, the systems "
                        "interleaved; report medians")
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS),
                   default=list(SYSTEMS))
    p.add_argument("--skip", nargs="+", choices=list(SYSTEMS), default=[])
    p.add_argument("--max-procs", type=int, default=64,
                   help="skip one-process-per-env systems above this many envs")
    p.add_argument("--startup", action="store_true",
                   help="also measure start-up time and worker memory")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.systems = [s for s in args.systems if s not in args.skip]
    return args


def _configs(args):
    for workload in args.workloads:
        for epw in args.envs_per_worker:
            for workers in args.workers:
                yield workload, epw, workers


def _skip_reason(system, num_envs, args, unavailable) -> str | None:
    if system in unavailable:
        return unavailable[system]
    if system in ONE_PROCESS_PER_ENV and num_envs > args.max_procs:
        return f"{num_envs} processes > --max-procs {args.max_procs}"
    return None


def run_benchmarks(args) -> list[dict]:
    """Run every (config, round, system); returns one record per run (with
    its ``round``); :func:`report.aggregate` merges the rounds."""
    results, unavailable, serial_cache = [], {}, {}
    for workload, epw, workers in _configs(args):
        num_envs = workers * epw
        for round_ in range(args.rounds):
            for system in args.systems:
                reason = _skip_reason(system, num_envs, args, unavailable)
                if reason:
                    if system not in unavailable and round_ == 0:
                        print(f"NOTE: skipping {system} at {num_envs} envs: "
                              f"{reason}", flush=True)
                    continue
                with _time_limit(args.timeout, system):
                    record = _run_one(system, workload, num_envs, workers, epw,
                                      args.steps, serial_cache, round_,
                                      unavailable)
                if record is None:
                    continue
                results.append(record)
                rate = record.get("steps_per_s")
                shown = f"{rate:12,.0f} steps/s" if rate else record.get("error")
                print(f"{workload:7s} W={workers:<2d} epw={epw:<3d} "
                      f"round {round_} {system:20s} {shown}  "
                      f"({record['wall_s']:.1f}s)", flush=True)
    for system, reason in unavailable.items():
        print(f"NOTE: {system} was skipped: {reason}")
    return results


@contextlib.contextmanager
def _time_limit(seconds: int, system: str):
    """Raise ``TimeoutError`` in the block after ``seconds`` (SIGALRM)."""
    def expire(signum, frame):
        raise TimeoutError(f"{system} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run_one(system, workload, num_envs, workers, epw, steps, serial_cache,
             round_, unavailable) -> dict | None:
    """One timed run as a record (an ``error`` record when it failed; None
    when the system is unavailable). ``serial`` is measured once per
    (workload, num_envs, round)."""
    config = {"config_workers": workers, "config_envs_per_worker": epw,
              "round": round_, "loadavg_1m_before": os.getloadavg()[0]}
    key = (workload, num_envs, round_)
    start = time.perf_counter()
    try:
        if system == "serial" and key in serial_cache:
            record = dict(serial_cache[key])
        else:
            record = SYSTEMS[system](workload, num_envs, workers, steps)
            if system == "serial":
                serial_cache[key] = record
    except SystemUnavailable as exc:
        unavailable[system] = str(exc)
        print(f"NOTE: skipping {system}: {exc}", flush=True)
        return None
    except Exception as exc:  # keep going; record the failure
        traceback.print_exc()
        record = {"system": system, "workload": workload,
                  "num_envs": num_envs, "num_workers": workers,
                  "envs_per_worker": epw, "error": repr(exc)}
    record.update(config, wall_s=time.perf_counter() - start)
    return record


def run_startup(args) -> list[dict]:
    """Start-up time and worker RSS of each system at each config."""
    records = []
    for workload, epw, workers in _configs(args):
        num_envs = workers * epw
        for system in args.systems:
            # probed: the systems with a builder, but serial (it starts no process)
            if system == "serial" or system not in BUILDERS or _skip_reason(system, num_envs, args, {}):
                continue
            build, first_use, close = BUILDERS[system]
            try:
                probe = report.measure_startup(
                    functools.partial(build, workload, num_envs, workers),
                    first_use, close)
            except SystemUnavailable as exc:
                print(f"NOTE: no start-up probe for {system}: {exc}")
                continue
            probe.update(system=system, workload=workload, num_envs=num_envs,
                         config_workers=workers, config_envs_per_worker=epw)
            records.append(probe)
            print(f"startup {workload:7s} {system:20s} n={num_envs:<4d}"
                  f"{probe['startup_s']:6.2f}s  "
                  f"{sum(probe['worker_rss_mb']):7.0f} MB", flush=True)
    return records


def _environment() -> dict:
    import gymnasium
    import torch
    import torchrl

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torchrl": torchrl.__version__,
            "gymnasium": gymnasium.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def main(argv=None) -> int:
    """CLI entry point: run, then write JSON, markdown and PNG to ``--out``."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = run_benchmarks(args)
    results = report.aggregate(runs)
    startup = run_startup(args) if args.startup else []
    meta = {"args": vars(args), "environment": _environment(),
            "total_wall_s": time.perf_counter() - started}
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "results": results, "runs": runs, "startup": startup},
        indent=1))
    table = report.markdown_table(results)
    text = (f"# Env stepping throughput\n\n`{meta['environment']}`\n\n"
            f"{report.wide_table(results)}\n\n## Every point\n\n{table}\n")
    if startup:
        text += f"\n## Start-up and worker memory\n\n{report.startup_table(startup)}\n"
    (out / "results.md").write_text(text)
    report.plot_throughput(results, out / "throughput.png")
    print()
    print(text)
    print(f"wrote {out}/results.json, results.md, throughput.png "
          f"in {meta['total_wall_s']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    # Some anchors' objects hang the interpreter's exit (TorchRL's MultiSyncCollector: a weight-sync queue's
    # __del__ starts a feeder thread during shutdown). The results are written: faulthandler's watchdog (a C
    # thread, it needs no GIL) ends the process if exiting takes longer than this.
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)
    raise SystemExit(status)
