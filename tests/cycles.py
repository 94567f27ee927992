"""Create / use / close cycles of one face with Python's garbage collector disabled, in a process of their own:
``python -m tests.cycles FACE CYCLES`` prints one JSON line with this process's open files, mapped shared memory and
child processes before and after the cycles (after a few warm-up cycles, which load what stays loaded).

What is counted: file descriptors (``/proc/self/fd``), the bytes of shared memory mapped (``memfd`` files and
``/dev/shm`` segments in ``/proc/self/maps``), and child processes (multiprocessing's own helpers aside). The faces
use an 84x84x3 uint8 frame env, so a rollout's storage held per cycle shows as megabytes.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

import numpy as np
import psutil

#: the faces, in the order the test runs them
FACES = ["serial", "parallel-rollout", "parallel-steps", "parallel-restart", "async", "collector", "multisync",
         "multisync-restart", "multiasync", "vector", "sb3", "ray"]
#: children that are not ours to count: multiprocessing's resource tracker and forkserver, ray's processes
_HELPERS = ("resource_tracker", "forkserver", "ray", "raylet", "gcs_server", "dashboard", "log_monitor")


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def shared_bytes() -> int:
    """Bytes of shared memory mapped in this process: memfd files and /dev/shm segments."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) > 5 and (parts[5].startswith("/memfd:") or parts[5].startswith("/dev/shm/")):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                total += end - start
    return total


def _command(proc: psutil.Process) -> str | None:
    """The process's command line, or None when it is gone or a zombie (which holds nothing but its pid)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return None


def our_children() -> list[str]:
    """The command lines of our child processes (workers). Not counted: multiprocessing's and Ray's helpers, and
    whatever those start (Ray's daemons run short-lived commands of their own)."""
    me = os.getpid()
    ours = []
    for proc in psutil.Process().children(recursive=True):
        try:
            lineage = proc.parents()
        except psutil.Error:
            continue
        chain = [proc]  # the process and its parents up to this process, not past it
        for parent in lineage:
            if parent.pid == me:
                break
            chain.append(parent)
        commands = [_command(process) for process in chain]
        if commands[0] is None or any(helper in (command or "") for command in commands for helper in _HELPERS):
            continue
        ours.append(commands[0])
    return ours


def sample() -> dict:
    """Open files, mapped shared memory, and our children: how many, and their command lines (``"left"``)."""
    left = our_children()
    return {"files": open_files(), "shared_bytes": shared_bytes(), "children": len(left), "left": left}


def frames():
    from tests.helpers import FrameCountingEnv

    return FrameCountingEnv()


def one_cycle(face: str) -> None:
    """Create the face over frame envs, use it for a few steps or batches, close it; drop it."""
    from tdcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
    from tdcollect.envs import AsyncParallelEnv, ParallelEnv, SerialEnv
    from tdcollect.envs.vector import ParallelVecEnv, ParallelVectorEnv

    if face == "serial":
        env = SerialEnv(2, frames)
        env.rollout(20, break_when_any_done=False)
        env.close()
    elif face == "parallel-rollout":
        with ParallelEnv(2, frames, envs_per_worker=2) as env:
            env.rollout(20, break_when_any_done=False)
    elif face == "parallel-steps":
        with ParallelEnv(2, frames, envs_per_worker=2) as env:
            td = env.reset()
            for _ in range(10):
                td = env.step_and_maybe_reset(env.rand_action(td))[1]
    elif face == "parallel-restart":  # a worker killed and replaced in every cycle
        with ParallelEnv(2, frames, envs_per_worker=2, max_restarts=5) as env:
            env.rollout(5, break_when_any_done=False)
            os.kill(env.worker_pids[0], 9)
            env.rollout(5, break_when_any_done=False)
            assert sum(env.restarts) == 1
    elif face == "async":
        with AsyncParallelEnv(2, frames, envs_per_worker=2, batch_workers=1) as env:
            env.async_reset()
            for _ in range(6):
                td = env.recv()
                td.update(env.full_action_spec[: td.shape[0]].rand())
                env.send(td)
            env.recv()
    elif face in ("collector", "multisync", "multiasync"):
        if face == "collector":
            collector = Collector(lambda: ParallelEnv(2, frames), None, frames_per_batch=20, total_frames=60)
        else:
            cls = MultiSyncCollector if face == "multisync" else MultiAsyncCollector
            collector = cls([frames] * 2, None, frames_per_batch=20, total_frames=60)
        for _ in collector:
            pass
        collector.shutdown()
    elif face == "multisync-restart":  # a worker killed and replaced in every cycle
        collector = MultiSyncCollector([frames] * 2, None, frames_per_batch=20, total_frames=-1, max_restarts=5)
        batches = iter(collector)
        next(batches)
        os.kill(collector.worker_pids[0], 9)
        next(batches)
        next(batches)
        assert sum(collector.restarts) == 1
        collector.shutdown()
    elif face in ("vector", "sb3"):
        env = ParallelVectorEnv([frames] * 4, envs_per_worker=2) if face == "vector" else ParallelVecEnv([frames] * 4)
        env.reset()
        for _ in range(10):
            env.step(np.ones(4, np.int64))
        env.close()
    elif face == "ray":
        from tdcollect.collectors import RayCollector

        collector = RayCollector([frames] * 2, None, frames_per_batch=20, total_frames=40)
        for _ in collector:
            pass
        collector.shutdown()
    else:
        raise ValueError(f"unknown face {face!r}; one of {FACES}")


def main(face: str, cycles: int, warm_up: int = 3) -> dict:
    gc.disable()
    if face == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for _ in range(warm_up):
        one_cycle(face)
    before = sample()
    for _ in range(cycles):
        one_cycle(face)
    after = sample()
    if face == "ray":  # Ray tears its actors (and their env workers) down after shutdown() returns, not within it
        deadline = time.monotonic() + 30
        while after["children"] > before["children"] and time.monotonic() < deadline:
            time.sleep(0.5)
            after = sample()
    return {"face": face, "cycles": cycles, "before": before, "after": after}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))), flush=True)
