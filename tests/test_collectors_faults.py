"""Collector faults: a clear error naming the worker and the cause, within seconds, nothing left behind."""
import functools
import os
import signal
import time

import gymnasium as gym
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import EnvWorkerError, WorkerDiedError
from tests.helpers import CountingEnv, FaultyEnv, SuicidalEnv

pytestmark = pytest.mark.timeout(60)


def test_env_raising_in_a_worker(no_leaks):
    start = time.monotonic()
    factories = [CountingEnv, functools.partial(FaultyEnv, "step", at_step=5)]
    with pytest.raises(EnvWorkerError, match=r"worker 1 raised ValueError during collection: boom in step 5"):
        with MultiSyncCollector(factories, None, frames_per_batch=20, total_frames=100) as collector:
            list(collector)
    assert time.monotonic() - start < 15


def test_env_raising_in_its_constructor(no_leaks):
    with pytest.raises(EnvWorkerError, match=r"worker 0 raised ValueError during construction: boom in __init__"):
        MultiSyncCollector([functools.partial(FaultyEnv, "init"), CountingEnv], None, frames_per_batch=20)


def test_policy_raising_in_a_worker(no_leaks):
    calls = {"n": 0}

    def policy(td):
        calls["n"] += 1
        if calls["n"] > 3:
            raise ZeroDivisionError("policy blew up")
        return td.set("action", torch.zeros(td.shape, dtype=torch.int64))  # [] per env: TorchRL's layout

    with pytest.raises(EnvWorkerError, match=r"worker \d raised ZeroDivisionError.*policy blew up"):
        with MultiSyncCollector([CountingEnv] * 2, policy, frames_per_batch=20, total_frames=40) as collector:
            list(collector)


def test_killed_worker(no_leaks):
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"worker 1 .*SIGKILL"):
        with MultiSyncCollector([CountingEnv, SuicidalEnv], None, frames_per_batch=20, total_frames=100) as c:
            list(c)
    assert time.monotonic() - start < 15


def test_worker_killed_between_batches(no_leaks):
    with MultiSyncCollector([CountingEnv] * 2, None, frames_per_batch=20, total_frames=-1) as collector:
        it = iter(collector)
        next(it)
        os.kill(collector.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="worker 0"):
            next(it)
        assert collector.worker_pids == []


def test_instances_and_bad_arguments(no_leaks):
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="not an env instance"):
        MultiSyncCollector([env, env], None, frames_per_batch=20)
    with pytest.raises(ValueError, match="num_workers >= 1"):
        MultiSyncCollector(CountingEnv, None, num_workers=0, frames_per_batch=20)
    with pytest.raises(ValueError, match="total_frames"):
        MultiSyncCollector([CountingEnv], None, frames_per_batch=20, total_frames=0)
    with pytest.raises(ValueError, match="frames_per_batch must be a positive int"):
        MultiSyncCollector([CountingEnv] * 2, None, frames_per_batch=2.5)
    env.close()


def test_shutdown_is_idempotent_and_leaves_nothing(no_leaks):
    collector = MultiSyncCollector([CountingEnv] * 2, None, frames_per_batch=20, total_frames=40)
    list(collector)
    collector.shutdown()
    collector.shutdown()
    assert collector.worker_pids == []
