"""Start-up: a worker dying in the start-up exchange is a WorkerDiedError with nothing left open; workers of a
MultiSyncCollector must agree on their specs. Collectors check every step's actions, not only the first."""
import functools
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import EnvWorkerError, ParallelEnv, SerialEnv, SpecMismatchError, WorkerDiedError
from tests.helpers import CountingEnv, OtherShapeEnv, cartpole

pytestmark = pytest.mark.timeout(90)


def dies_soon_after_construction(delay: float) -> CountingEnv:
    """Built at once; its process is SIGKILLed ``delay`` s later (in the middle of the start-up exchange)."""
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return CountingEnv()


def slow_to_build(delay: float) -> CountingEnv:
    time.sleep(delay)
    return CountingEnv()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_worker_dying_in_the_start_up_exchange_is_a_worker_died_error_and_pins_nothing(no_leaks):
    factories = [functools.partial(dies_soon_after_construction, 0.3), functools.partial(slow_to_build, 1.0)]
    ParallelEnv(1, CountingEnv).close()  # warm up lazily created helpers
    fds = _open_fds()
    for _ in range(3):
        # worker 0 says hello at once and is dead by the time worker 1 has said hello and its setup is sent
        with pytest.raises(WorkerDiedError, match=r"worker 0 \(pid \d+\) died during start-up"):
            ParallelEnv(2, factories, mp_start_method="fork")
    gc.collect()  # what is left in reference cycles is garbage, not pinned
    assert _open_fds() <= fds + 1, f"open fds grew from {fds} to {_open_fds()}"


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
    with Collector(SerialEnv(2, factory), policy(), frames_per_batch=20, total_frames=40) as collector:
        with pytest.raises(ValueError, match=expected):
            next(iter(collector))


@pytest.mark.parametrize("case", list(CASES))
def test_multisync_checks_every_steps_actions(case, no_leaks):
    factory, policy, expected = CASES[case]
    collector = MultiSyncCollector([factory] * 2, policy(), frames_per_batch=20, total_frames=40)
    with pytest.raises(EnvWorkerError, match=r"raised ValueError during collection: " + expected):
        next(iter(collector))
    collector.shutdown()


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


def test_check_actions_false_checks_the_first_step_only(no_leaks):
    factory, policy, _ = CASES["discrete"]
    with Collector(SerialEnv(2, factory), policy(), frames_per_batch=20, total_frames=20,
                   check_actions=False) as collector:
        batch = next(iter(collector))
    assert (batch["action"][:, 3:] == 7).all(), "unchecked: the envs received the policy's actions as they were"
    with Collector(SerialEnv(2, factory), lambda td: td.set("action", torch.full((2,), 9)), frames_per_batch=20,
                   check_actions=False) as collector, pytest.raises(ValueError, match="outside its spec"):
        next(iter(collector))
