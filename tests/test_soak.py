"""Soak runs (marked slow): many workers for many steps without hang or memory growth."""
import gc

import psutil
import pytest

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tests.helpers import cartpole

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def resident_mib(pids) -> float:
    """Resident memory of this process plus ``pids`` (MiB)."""
    procs = [psutil.Process()] + [psutil.Process(pid) for pid in pids]
    return sum(p.memory_info().rss for p in procs) / 2**20


def test_16_workers_200k_steps_without_growth(no_leaks):
    with ParallelEnv(16, cartpole, envs_per_worker=4) as env:  # 64 envs on 2 cores
        env.rollout(50, break_when_any_done=False)
        gc.collect()
        start = resident_mib(env.worker_pids)
        steps = 0
        while steps < 200_000:
            td = env.rollout(500, break_when_any_done=False)
            steps += td.numel()
        del td
        gc.collect()
        end = resident_mib(env.worker_pids)
    print(f"\nParallelEnv soak: {steps} steps, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def sixteen_cartpoles():
    return SerialEnv(16, cartpole)


def test_collector_1m_frames_without_growth(no_leaks):
    collector = MultiSyncCollector([sixteen_cartpoles] * 2, None, frames_per_batch=4096, total_frames=1_000_000)
    with collector:
        frames = 0
        for i, batch in enumerate(collector):
            frames += batch.numel()
            if i == 5:
                gc.collect()
                start = resident_mib(collector.worker_pids)
        del batch
        gc.collect()
        end = resident_mib(collector.worker_pids)
    print(f"\nMultiSyncCollector soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert frames >= 1_000_000
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"
