"""Soak runs (marked slow): many workers for many steps without hang or memory growth."""
import gc

import psutil
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import AsyncParallelEnv, ParallelEnv, SerialEnv
from tdcollect.envs.vector import ParallelVecEnv, ParallelVectorEnv
from tests.helpers import CountingEnv, cartpole

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


# ----------------------------------------------------------------- every face: long runs, every frame checked
def _counting():
    return CountingEnv(episode_len=50)


def _check_counts(obs, nxt, action, done) -> None:
    """CountingEnv frames: the next observation counts on by one from the one acted on, with the action taken;
    an ended episode's next frame is its last (count 50)."""
    assert (nxt[:, 0] == obs[:, 0] + 1).all(), (obs[:, 0], nxt[:, 0])
    assert (nxt[:, 1] == action).all()
    assert (nxt[done, 0] == 50).all()


def test_async_env_soak_every_frame_checked(no_leaks):
    with AsyncParallelEnv(8, _counting, envs_per_worker=4, batch_workers=4) as env:
        env.async_reset()
        frames, start = 0, None
        last = {}  # env id -> (count acted on, action)
        for i in range(20_000):
            td = env.recv()
            ids = td["env_ids"]
            known = torch.tensor([int(j) in last for j in ids.tolist()])
            if known.any():
                before = torch.tensor([last[j] for j in ids.tolist() if j in last], dtype=torch.float32)
                _check_counts(before[:, :1].expand(-1, 3), td["next", "observation"][known], before[:, 1],
                              td["next", "done"][known].squeeze(-1))
            td["action"] = torch.randint(0, 3, (td.shape[0],))
            for j, count, action in zip(ids.tolist(), td["observation"][:, 0].tolist(), td["action"].tolist()):
                last[j] = (count, action)
            env.send(td)
            frames += td.shape[0]
            if i == 500:
                gc.collect()
                start = resident_mib(env.worker_pids)
        env.recv()
        gc.collect()
        end = resident_mib(env.worker_pids)
    print(f"\nAsyncParallelEnv soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


@pytest.mark.parametrize("face", ["vector", "sb3"])
def test_vector_facade_soak_every_frame_checked(face, no_leaks):
    import numpy as np

    fns = [_counting] * 16
    env = ParallelVectorEnv(fns, autoreset_mode="SameStep") if face == "vector" else ParallelVecEnv(fns)
    try:
        obs = env.reset()[0] if face == "vector" else env.reset()
        start = None
        for i in range(25_000):
            action = np.random.randint(0, 3, 16)
            out = env.step(action)
            new = out[0]
            done = (out[2] | out[3]) if face == "vector" else out[2]
            assert (new[~done, 0] == obs[~done, 0] + 1).all() and (new[~done, 1] == action[~done]).all()
            assert (new[done, 0] == 0).all()  # same-step autoreset: the reset observation
            finals = [out[4]["final_obs"][j] if face == "vector" else out[3][j]["terminal_observation"]
                      for j in np.flatnonzero(done)]
            assert all(final[0] == 50 for final in finals)
            obs = new
            if i == 500:
                gc.collect()
                start = resident_mib(env.worker_pids)
        gc.collect()
        end = resident_mib(env.worker_pids)
    finally:
        env.close()
    print(f"\n{type(env).__name__} soak: {16 * 25_000} steps, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def _nested():
    return ParallelEnv(2, _counting, envs_per_worker=8)


def test_nested_parallel_env_in_collector_soak_every_frame_checked(no_leaks):
    collector = MultiSyncCollector([_nested] * 2, None, frames_per_batch=3200, total_frames=1_280_000,
                                   cat_results=0)  # [all envs, T]
    with collector:
        frames = 0
        for i, batch in enumerate(collector):
            obs, nxt = batch["observation"], batch["next", "observation"]
            done = batch["next", "done"].squeeze(-1)
            _check_counts(obs.reshape(-1, 3), nxt.reshape(-1, 3), batch["action"].reshape(-1).float(),
                          done.reshape(-1))
            assert (obs[:, 1:, 0][done[:, :-1]] == 0).all() and (obs[:, 1:, 0][~done[:, :-1]] ==
                                                                  nxt[:, :-1, 0][~done[:, :-1]]).all()
            frames += batch.numel()
            if i == 5:
                gc.collect()
                start = resident_mib(_all_pids())
        del batch
        gc.collect()
        end = resident_mib(_all_pids())
    print(f"\nnested MultiSyncCollector soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert frames >= 1_280_000
    assert end - start < 96, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def _all_pids() -> list[int]:
    from tests.conftest import live_children

    return [p.pid for p in live_children()]
