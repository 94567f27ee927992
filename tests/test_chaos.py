"""Chaos: a worker SIGKILLed every 0.5 s for 12 s, with a budget of 50 restarts. Kills land anywhere: mid-step,
between steps, in a replacement's start-up exchange, during its first reset. Every step and every batch must
come out full and valid, and every kill must be paid for from the budget."""
import random
import threading
import time
import warnings

import psutil
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv
from tests.helpers import CountingEnv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DURATION_S, PERIOD_S, BUDGET = 12.0, 0.5, 50  # ~24 kills per test (CI time budget: 15 min)


class Killer(threading.Thread):
    """SIGKILLs one random live worker of ``owner`` every ``PERIOD_S`` for ``DURATION_S`` (or until stopped)."""

    def __init__(self, owner):
        super().__init__(daemon=True)
        self.owner, self.kills, self._stop_event = owner, 0, threading.Event()

    def run(self):
        rng = random.Random(0)
        deadline = time.monotonic() + DURATION_S
        while not self._stop_event.wait(PERIOD_S) and time.monotonic() < deadline:
            pids = self.owner.worker_pids
            if pids:
                try:
                    psutil.Process(rng.choice(pids)).kill()
                    self.kills += 1
                except psutil.NoSuchProcess:
                    pass

    def stop(self):
        self._stop_event.set()
        self.join()


def _check_step(root, step):
    """CountingEnv: obs = [steps so far, action, seed]. A step either counts on from its root, or (its worker
    was replaced) is the reset observation, marked truncated, with reward 0."""
    count, nxt = root["observation"][:, 0], step["next", "observation"]
    truncated = step["next", "truncated"].squeeze(-1)
    counted_on = (nxt[:, 0] == count + 1) & (nxt[:, 1] == step["action"].float()) & ~truncated
    restarted = (nxt[:, 0] == 0) & truncated & (step["next", "reward"].squeeze(-1) == 0)
    assert (counted_on | restarted).all(), (root["observation"], step["next"].to_dict())
    return int(restarted.sum())


# spawn: a replacement takes seconds to start, so many kills land in a start-up exchange; fork: most land mid-step
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_parallel_env_survives_a_kill_every_half_second(method, no_leaks):
    env = ParallelEnv(4, lambda: CountingEnv(episode_len=10_000), envs_per_worker=2, max_restarts=BUDGET,
                      mp_start_method=method)
    killer = Killer(env)
    steps = restarted = 0
    with env, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        td = env.reset()
        killer.start()
        last = False
        while not last:  # one more step after the last kill: every dead worker is noticed and paid for
            last = not killer.is_alive()
            td["action"] = torch.randint(0, 3, (8,))
            root = td.clone()
            step, td = env.step_and_maybe_reset(td)
            restarted += _check_step(root, step)
            steps += 1
        assert killer.kills >= 0.6 * DURATION_S / PERIOD_S
        assert killer.kills - 2 <= sum(env.restarts) <= killer.kills, (env.restarts, killer.kills)
        assert restarted >= 1, "a worker killed mid-step has its envs marked truncated"
    assert steps > 20


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_collector_survives_a_kill_every_half_second(method, no_leaks):
    collector = MultiSyncCollector([lambda: CountingEnv(episode_len=25)] * 4, frames_per_batch=80,
                                   max_restarts=BUDGET, mp_start_method=method)
    killer = Killer(collector)
    batches, last = 0, False
    with collector, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        killer.start()
        for batch in collector:
            assert batch.batch_size == (4, 20)
            obs, nxt = batch["observation"], batch["next", "observation"]
            assert torch.isfinite(obs).all() and torch.isfinite(nxt).all()
            # within a batch every env counts on by one per step, or ended (then the next root is a reset)
            done = batch["next", "done"].squeeze(-1)
            assert ((nxt[..., 0] == obs[..., 0] + 1) | done).all()
            assert (obs[:, 1:, 0][~done[:, :-1]] == nxt[:, :-1, 0][~done[:, :-1]]).all()
            batches += 1
            if last:
                break
            last = not killer.is_alive()  # one more batch after the last kill
        assert killer.kills >= 0.6 * DURATION_S / PERIOD_S
        assert killer.kills - 2 <= sum(collector.restarts) <= killer.kills, (collector.restarts, killer.kills)
    assert batches > 2
