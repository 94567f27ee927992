"""Restarts (``max_restarts``): a failed worker of a ParallelEnv or a MultiSyncCollector is replaced, its envs'
step is marked truncated and they go on from a fresh episode; a replacement re-runs the start-up exchange, and
every failure on the way (a replacement that dies while it starts) goes through the same budget; past the
budget, the failure is raised and everything is closed."""
import functools
import os
import signal
import warnings

import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import EnvWorkerError, ParallelEnv, WorkerDiedError
from tests.helpers import CountingEnv, CrashOnceEnv

pytestmark = pytest.mark.timeout(90)

long_counting = functools.partial(CountingEnv, episode_len=100)


@pytest.mark.parametrize("how, error", [("kill", "died"), ("raise", "ValueError")])
def test_parallel_env_restarts_a_failed_worker(how, error, tmp_path, no_leaks):
    crash_once = functools.partial(CrashOnceEnv, str(tmp_path / "crashed"), how, 3)
    with pytest.warns(RuntimeWarning, match=rf"restarting worker 1 after: .*{error}"):
        with ParallelEnv(2, [long_counting, crash_once], envs_per_worker=2, max_restarts=1) as env:
            env.set_seed(0)
            td = env.rollout(6, break_when_any_done=False)
            assert env.restarts == [0, 1]
    counts = td["next", "observation"][..., 0]
    truncated = td["next", "truncated"][..., 0]
    # worker 0's envs never noticed
    assert counts[:2].tolist() == [[1, 2, 3, 4, 5, 6]] * 2
    assert not truncated[:2].any() and not td["next", "done"][:2].any()
    # worker 1's envs: the failed step (3rd) is truncated, with the reset observation and reward 0 ...
    assert counts[2:, :2].tolist() == [[1, 2]] * 2
    assert truncated[2:, 2].all() and not td["next", "terminated"][2:, 2].any()
    assert counts[2:, 2].tolist() == [0, 0] and (td["next", "reward"][2:, 2] == 0).all()
    # ... and the restarted envs go on from a fresh episode
    assert counts[2:, 3:].tolist() == [[1, 2, 3]] * 2
    assert not truncated[2:, 3:].any()


def test_parallel_env_past_max_restarts_raises_and_closes(no_leaks):
    always = functools.partial(CrashOnceEnv, None, "kill", 2)
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with pytest.raises(WorkerDiedError, match="worker 1"):
            with ParallelEnv(2, [long_counting, always], max_restarts=1) as env:
                env.rollout(10, break_when_any_done=False)
    assert env.is_closed and env.worker_pids == []


def test_without_max_restarts_an_env_error_is_raised(no_leaks):
    with ParallelEnv(2, [long_counting, functools.partial(CrashOnceEnv, None, "raise", 2)]) as env:
        with pytest.raises(EnvWorkerError, match="worker 1 raised ValueError"):
            env.rollout(5, break_when_any_done=False)
        assert env.restarts == [0, 0]


def test_collector_restarts_a_dead_worker_and_refills_its_batch(tmp_path, no_leaks):
    crash_in_second_batch = functools.partial(CrashOnceEnv, str(tmp_path / "crashed"), "kill", 13)
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with MultiSyncCollector([long_counting, crash_in_second_batch], None, frames_per_batch=20,
                                total_frames=60, max_restarts=1) as collector:
            batches = [batch.clone() for batch in collector]
            assert collector.restarts == [0, 1]
    assert [b.batch_size for b in batches] == [torch.Size([2, 10])] * 3
    counts = [b["next", "observation"][:, :, 0] for b in batches]
    assert counts[1][0].tolist() == list(range(11, 21))  # worker 0 untouched
    assert counts[1][1].tolist() == list(range(1, 11))   # worker 1 refilled by its replacement, a fresh episode
    ids = [b["collector", "traj_ids"] for b in batches]
    assert ids[1][1, 0] != ids[0][1, -1], "the replacement's episode must get a new trajectory id"
    assert ids[1][0, 0] == ids[0][0, -1]


def test_collector_past_max_restarts_raises_and_shuts_down(no_leaks):
    always = functools.partial(CrashOnceEnv, None, "raise", 2)
    with pytest.warns(RuntimeWarning):
        with pytest.raises(EnvWorkerError, match="worker 1 raised ValueError"):
            with MultiSyncCollector([long_counting, always], None, frames_per_batch=20, total_frames=100,
                                    max_restarts=2) as collector:
                list(collector)
    assert collector.worker_pids == []


# ----------------------------------------------------------------- failures of the replacements
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
