"""Restarts re-run the start-up handshake, and every failure on the way — a replacement that dies while it
starts — goes through the same restart budget."""
import functools
import os
import signal
import warnings

import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, WorkerDiedError
from tests.helpers import CountingEnv, CrashOnceEnv

pytestmark = pytest.mark.timeout(90)


def _construction_number(folder: str) -> int:
    """0, 1, 2, ... in the order constructions happen, across processes (O_EXCL files)."""
    i = 0
    while True:
        try:
            os.close(os.open(os.path.join(folder, f"built-{i}"), os.O_CREAT | os.O_EXCL))
            return i
        except FileExistsError:
            i += 1


def crashing_env(folder: str, die_at: frozenset, at_step: int) -> CrashOnceEnv:
    """A CrashOnceEnv (SIGKILLs itself at step ``at_step``, once) whose construction number ``n`` kills its
    process when ``n in die_at`` (a worker dying during its start-up)."""
    if _construction_number(folder) in die_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return CrashOnceEnv(os.path.join(folder, "stepped-crash"), "kill", at_step=at_step)


def _factories(tmp_path, die_at, at_step=3):
    """Worker 0 crashes (at step ``at_step``; its replacements as ``die_at`` says), worker 1 never does."""
    return [functools.partial(crashing_env, str(tmp_path), frozenset(die_at), at_step),
            functools.partial(CountingEnv, episode_len=100)]


def test_parallel_env_replacement_dying_in_start_up_is_restarted_again(tmp_path, no_leaks):
    # worker 0's constructions: 0 at the first start; 1, its first replacement, dies in its start-up; 2 is fine
    env = ParallelEnv(2, _factories(tmp_path, {1}), max_restarts=3, mp_start_method="fork")
    with env, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        td, steps = env.reset(), []
        for _ in range(4):
            td["action"] = torch.ones(2, dtype=torch.int64)
            step, td = env.step_and_maybe_reset(td)
            steps.append(step)
        assert env.restarts == [2, 0]
        assert sum("restarting worker 0" in str(w.message) for w in caught) == 2
        crashed = steps[2]  # worker 0 died in its 3rd step
        assert crashed["next", "truncated"].squeeze(-1).tolist() == [True, False]
        assert crashed["next", "reward"].squeeze(-1).tolist() == [0.0, 1.0]
        assert crashed["next", "observation"][1, 0] == 3, "worker 1's step is untouched"
        assert steps[3]["next", "observation"][:, 0].tolist() == [1.0, 4.0], "both step on after the restarts"
        assert len(env.worker_pids) == 2


def test_parallel_env_restart_failures_exhaust_the_budget(tmp_path, no_leaks):
    # every replacement of worker 0 dies in its start-up: the budget of 2 is spent, then the death is raised
    env = ParallelEnv(2, _factories(tmp_path, {1, 2, 3, 4}), max_restarts=2, mp_start_method="fork")
    td = env.reset()
    with pytest.warns(RuntimeWarning, match="restarting worker 0"), pytest.raises(WorkerDiedError, match="died"):
        for _ in range(3):
            td["action"] = torch.ones(2, dtype=torch.int64)
            _, td = env.step_and_maybe_reset(td)
    assert env.is_closed
    assert env.restarts == [2, 0]


def test_collector_replacement_dying_in_start_up_is_restarted_again(tmp_path, no_leaks):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # 4 steps per batch: worker 0 dies in the second batch, which its replacement collects again
        with MultiSyncCollector(_factories(tmp_path, {1}, at_step=6), frames_per_batch=8, total_frames=24,
                                max_restarts=3, mp_start_method="fork") as collector:
            batches = list(collector)
            assert collector.restarts == [2, 0]
    assert sum("restarting worker 0" in str(w.message) for w in caught) == 2
    assert [b.batch_size for b in batches] == [torch.Size([2, 4])] * 3
    ids = torch.cat([b["collector", "traj_ids"] for b in batches], 1)
    assert len(ids.unique()) >= 3, "the restarted worker's env starts a new trajectory"
