"""Frames/s of RayCollector against MultiSyncCollector, same config, on this machine.

Config: ``--workers`` workers (actors / processes), each a ``SerialEnv`` of ``--envs-per-worker`` envs of
the workload (``cheap`` = CartPole-v1), the benchmarks' 2x64 tanh MLP policy (``tdstyle.MLPActor``, a
``TensorDictModule`` sampling a categorical action), ``frames_per_batch=2048``; one warm-up batch, then
``--batches`` timed batches, ``update_policy_weights_()`` after each (an on-policy training loop without the
training). Ray runs a local cluster with one CPU per worker, started before the timing.

    python -m benchmarks.ray_vs_multisync [--workers 2] [--envs-per-worker 1] [--batches 10] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time

from . import ours, tdstyle
from .tdstyle import FRAMES_PER_BATCH


def frames_per_second(collector_cls, factory, policy, workers: int, batches: int, **kwargs) -> float:
    collector = collector_cls([factory] * workers, policy, frames_per_batch=FRAMES_PER_BATCH, total_frames=-1,
                              **kwargs)
    try:
        iterator = iter(collector)
        next(iterator)
        collector.update_policy_weights_()
        frames, start = 0, time.perf_counter()
        for _ in range(batches):
            frames += next(iterator).numel()
            collector.update_policy_weights_()
        return frames / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="cheap", choices=["cheap", "costly"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=1)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    import ray

    from tdcollect.collectors import MultiSyncCollector, RayCollector

    backend = ours.tdcollect_backend(need_collector=True)
    factory = backend.worker_env_factory(args.workload, args.envs_per_worker)
    policy = tdstyle.make_policy(backend, args.workload)
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        print(f"{args.workload}, {args.workers} workers x {args.envs_per_worker} envs, MLP policy, "
              f"frames_per_batch={FRAMES_PER_BATCH}, {args.batches} timed batches")
        for run in range(1, args.repeat + 1):
            multi = frames_per_second(MultiSyncCollector, factory, policy, args.workers, args.batches)
            on_ray = frames_per_second(RayCollector, factory, policy, args.workers, args.batches)
            print(f"run {run}: MultiSyncCollector {multi:9,.0f} frames/s | RayCollector {on_ray:9,.0f} "
                  f"frames/s | Ray / MultiSync {on_ray / multi:.2f}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
