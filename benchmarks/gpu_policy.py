"""Collectors with the policy on a GPU (or any ``--device``): ours against TorchRL's, frames per second.

    python -m benchmarks.gpu_policy [--device cuda] [--workload costly] [--workers 4 8] [--envs-per-worker 4]
                                    [--rounds 3] [--batches 20] [--out results.json]

Two ways TorchRL users put a policy on a GPU while the envs step on CPU processes, each timed for both libraries
with the same workload and policy (``tdstyle.make_policy``: the 2x64 MLP, or the CNN on Atari workloads):

- ``<lib>_multisync``: the library's ``MultiSyncCollector`` with ``policy_device=device`` (every worker process
  runs its own copy of the policy on the device, storing on the CPU);
- ``<lib>_env_in_torchrl_collector``: TorchRL's ``Collector`` in the main process, policy on the device,
  stepping the library's ``ParallelEnv`` (``env_device="cpu"``): one policy call per batched step.

Rounds interleave the systems; the table gives each system's median frames/s and its ratio to TorchRL's same
row. Frames per batch: ``tdstyle.FRAMES_PER_BATCH``; one warm-up batch is not timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from . import tdstyle
from .anchors import torchrl_backend
from .ours import tdcollect_backend

SYSTEMS = ("tdcollect_multisync", "torchrl_multisync", "tdcollect_env_in_torchrl_collector",
           "torchrl_env_in_torchrl_collector")


def _backend(system: str) -> tdstyle.Backend:
    return tdcollect_backend(need_collector=True) if system.startswith("tdcollect") else torchrl_backend()


def _collector(system: str, workload: str, workers: int, envs_per_worker: int, device: str):
    """The system's collector and the env to close after it (or None)."""
    from torchrl.collectors import Collector

    backend = _backend(system)
    policy = tdstyle.make_policy(backend, workload).to(device)
    if system.endswith("multisync"):
        factory = backend.worker_env_factory(workload, envs_per_worker)
        return backend.multi_sync_collector([factory] * workers, policy, frames_per_batch=tdstyle.FRAMES_PER_BATCH,
                                            total_frames=-1, policy_device=device, env_device="cpu",
                                            storing_device="cpu"), None
    env = backend.make_parallel(workload, workers, envs_per_worker)
    return Collector(env, policy, frames_per_batch=tdstyle.FRAMES_PER_BATCH, total_frames=-1, policy_device=device,
                     env_device="cpu", storing_device="cpu"), env


def time_system(system: str, workload: str, workers: int, envs_per_worker: int, device: str,
                batches: int) -> float:
    """Frames per second of ``batches`` batches after one warm-up batch."""
    with tdstyle.preserve_torch_threads():
        collector, env = _collector(system, workload, workers, envs_per_worker, device)
        try:
            frames, seconds = tdstyle.time_batches(collector, batches)
        finally:
            collector.shutdown()
            if env is not None:
                env.close(raise_if_closed=False)
    return frames / seconds


def run(device: str, workload: str, workers: list[int], envs_per_worker: int, rounds: int, batches: int,
        systems=SYSTEMS) -> list[dict]:
    """One record per (workers, system): median frames/s over ``rounds`` interleaved rounds, and each round's; a
    system that raised has ``frames_per_s`` None and its ``error`` (the others go on)."""
    records = []
    for count in workers:
        seen: dict[str, list[float]] = {system: [] for system in systems}
        errors: dict[str, str] = {}
        for _ in range(rounds):
            for system in systems:
                if system in errors:
                    continue
                try:
                    seen[system].append(time_system(system, workload, count, envs_per_worker, device, batches))
                except Exception as err:  # noqa: BLE001 - recorded; one failing system does not stop the others
                    errors[system] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        for system in systems:
            records.append({"system": system, "device": device, "workload": workload, "workers": count,
                            "envs_per_worker": envs_per_worker, "rounds": seen[system], "error": errors.get(system),
                            "frames_per_s": None if system in errors else statistics.median(seen[system])})
    return records


def table(records: list[dict]) -> str:
    """Rows of frames/s with the ratio to TorchRL's system of the same kind and worker count."""
    by_key = {(r["system"], r["workers"]): r["frames_per_s"] for r in records}
    lines = [f"{'system':38} {'device':6} {'workers':>7} {'frames/s':>10} {'vs torchrl':>10}"]
    for r in records:
        if r["frames_per_s"] is None:
            lines.append(f"{r['system']:38} {r['device']:6} {r['workers']:>7}  error: {r['error']}")
            continue
        anchor = by_key.get((r["system"].replace("tdcollect_", "torchrl_"), r["workers"]))
        ratio = f"{r['frames_per_s'] / anchor:.2f}x" if anchor else ""
        lines.append(f"{r['system']:38} {r['device']:6} {r['workers']:>7} {r['frames_per_s']:>10.0f} {ratio:>10}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workload", default="costly")
    parser.add_argument("--workers", type=int, nargs="+", default=[4])
    parser.add_argument("--envs-per-worker", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--out", help="write the records as JSON here")
    args = parser.parse_args(argv)
    records = run(args.device, args.workload, args.workers, args.envs_per_worker, args.rounds, args.batches,
                  args.systems)
    print(table(records))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    sys.stdout.flush()
    # TorchRL's MultiSyncCollector leaves a weight-sync scheme whose __del__ starts a queue thread at interpreter
    # exit, which never returns (seen with torchrl 0.14.1): leave without running the finalizers
    os._exit(0)


if __name__ == "__main__":
    main()
