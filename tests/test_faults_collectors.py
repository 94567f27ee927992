"""Collector faults: an env, a policy or a worker failing (also in the start-up exchange), bad arguments and
bad actions are a clear error naming the worker and the cause, within seconds, with nothing left behind.
Collectors check every step's actions, not only the first. Restarts: ``test_restarts.py``."""
import functools
import os
import signal
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import EnvWorkerError, SerialEnv, SpecMismatchError, WorkerDiedError
from tests.helpers import CountingEnv, FaultyEnv, OtherShapeEnv, SuicidalEnv, cartpole

pytestmark = pytest.mark.timeout(90)


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


# ----------------------------------------------------------------- start-up and actions
def test_multisync_workers_with_other_specs_are_refused_at_construction(no_leaks):
    with pytest.raises(SpecMismatchError, match=r"worker 1 has other specs than worker 0 .*observation.*\(4,\)"):
        MultiSyncCollector([CountingEnv, cartpole], frames_per_batch=20)
    with pytest.raises(SpecMismatchError, match=r"worker 2 has other specs than worker 0 \(.*\): action"):
        MultiSyncCollector([CountingEnv, CountingEnv, functools.partial(CountingEnv, n_actions=5)],
                           frames_per_batch=30)


def test_a_worker_failing_in_its_start_up_reports_the_error(no_leaks):
    # the env declares a (5,) observation and returns (3,): the worker's first reset fails during start-up
    with pytest.raises(EnvWorkerError, match=r"worker 0 raised ValueError during start-up: .*\(5,\)"):
        MultiSyncCollector([OtherShapeEnv], frames_per_batch=20)


class DivergingDiscrete(nn.Module):
    """Action 0 while the observed step count is below 3, then 7 (outside ``Discrete(3)``)."""

    def forward(self, obs):
        return torch.where(obs[..., 0] >= 3, 7, 0)


class ContinuousCountingEnv(CountingEnv):
    """CountingEnv with a ``Box(-1, 1, (1,))`` action."""

    def __init__(self):
        super().__init__(episode_len=100)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        return super().step(float(action[0]))


class DivergingContinuous(nn.Module):
    """Action 0.5 while the observed step count is below 3, then NaN."""

    def forward(self, obs):
        value = torch.where(obs[..., :1] >= 3, torch.nan, 0.5)
        return value.float()


CASES = {
    "discrete": (functools.partial(CountingEnv, episode_len=100), DivergingDiscrete,
                 r"'action' holds values outside its spec \(integers in \[0, 2\]\)"),
    "continuous": (ContinuousCountingEnv, DivergingContinuous, r"'action' holds NaN or infinite values"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_collector_checks_every_steps_actions(case, no_leaks):
    factory, policy, expected = CASES[case]
    with Collector(SerialEnv(2, factory), policy(), frames_per_batch=20, total_frames=40,
                   check_actions="raise") as collector:
        with pytest.raises(ValueError, match=expected + ".*nothing was sent"):
            next(iter(collector))


@pytest.mark.parametrize("case", list(CASES))
def test_actions_outside_the_spec_reach_the_envs_with_a_warning(case, no_leaks):
    # TorchRL's collectors send them as they are; ours too (the default), saying so once
    factory, policy, expected = CASES[case]
    with Collector(SerialEnv(2, factory), policy(), frames_per_batch=20, total_frames=20) as collector:
        with pytest.warns(UserWarning, match=expected + ".*sent to the envs unchanged, as TorchRL"):
            batch = next(iter(collector))
    received = batch["next", "observation"][:, 3:, 1]  # CountingEnv observes the action it was given
    assert (received.isnan() if case == "continuous" else received == 7).all()


@pytest.mark.parametrize("case", list(CASES))
def test_multisync_checks_every_steps_actions(case, no_leaks):
    factory, policy, expected = CASES[case]
    collector = MultiSyncCollector([factory] * 2, policy(), frames_per_batch=20, total_frames=40,
                                   check_actions="raise")
    with pytest.raises(EnvWorkerError, match=r"raised ValueError during collection: " + expected):
        next(iter(collector))
    collector.shutdown()


def test_an_unknown_check_actions_mode_is_refused(no_leaks):
    with pytest.raises(ValueError, match=r"check_actions must be one of False, True, 'raise', 'bounds'; got 'strict'"):
        Collector(SerialEnv(1, CountingEnv), frames_per_batch=4, check_actions="strict")
    with pytest.raises(ValueError, match=r"check_actions must be one of False, True, 'raise'; got 'bounds'"):
        SerialEnv(1, CountingEnv, check_actions="bounds")


class OutOfBounds(nn.Module):
    """Action 1.5: finite, past the spec's [-1, 1] (Gaussian exploration noise does this)."""

    def forward(self, obs):
        return torch.full_like(obs[..., :1], 1.5)


def test_continuous_bounds_are_the_envs_unless_asked(no_leaks):
    with Collector(SerialEnv(2, ContinuousCountingEnv), OutOfBounds(), frames_per_batch=20, total_frames=20) as c:
        assert (next(iter(c))["action"] == 1.5).all(), "as in TorchRL, the env receives the policy's action"
    with Collector(SerialEnv(2, ContinuousCountingEnv), OutOfBounds(), frames_per_batch=20, total_frames=20,
                   check_actions="bounds") as collector:
        with pytest.raises(ValueError, match=r"'action' holds values outside its spec \(values in \[-1, 1\]"):
            next(iter(collector))


def test_check_actions_false_checks_the_first_steps_shape_only(no_leaks):
    factory, policy, _ = CASES["discrete"]
    with Collector(SerialEnv(2, factory), policy(), frames_per_batch=20, total_frames=20,
                   check_actions=False) as collector:
        batch = next(iter(collector))
    assert (batch["action"][:, 3:] == 7).all(), "unchecked: the envs received the policy's actions as they were"
    with Collector(SerialEnv(2, factory), lambda td: td.set("action", torch.full((2,), 9)), frames_per_batch=20,
                   check_actions=False) as collector, warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*outside its spec")  # no warning either: not checked
        assert (next(iter(collector))["action"] == 9).all()
    with Collector(SerialEnv(2, factory), lambda td: td.set("action", torch.full((2, 2), 1)), frames_per_batch=20,
                   check_actions=False) as collector, pytest.raises(ValueError, match=r"has shape \(2, 2\)"):
        next(iter(collector))
