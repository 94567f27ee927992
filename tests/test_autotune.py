"""``autotune``: its pick is a configuration ``ParallelEnv`` and the collectors take, its table is printed, the
faster split wins where the gap is wide, and bad input is a clear error."""
import functools

import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ArgumentError, EnvWorkerError, ParallelEnv, autotune
from tdcollect.envs.engine.platform_policy import SPIN_S
from tests.helpers import CountingEnv, SlowEnv

pytestmark = pytest.mark.timeout(120)


def test_the_pick_is_a_configuration_parallel_env_and_collectors_take(capsys, no_leaks):
    threads = torch.get_num_threads()
    tuning = autotune(CountingEnv, 4, budget_s=3, max_workers=2)
    assert torch.get_num_threads() == threads  # the caller's process is left as it was
    printed = capsys.readouterr().out
    assert tuning.num_workers * tuning.envs_per_worker == 4 and tuning.num_workers in (1, 2)
    assert tuning.spin_s in (0.0, SPIN_S) and tuning.steps_per_s > 0 and tuning.serial_steps_per_s > 0
    # every split was timed with both waits (and the serial reference: workers 0), each once in the table
    assert sorted((r.num_workers, r.envs_per_worker, r.spin_s) for r in tuning.table) == [
        (0, 4, 0.0), (1, 4, 0.0), (1, 4, SPIN_S), (2, 2, 0.0), (2, 2, SPIN_S)]
    assert all(r.rate > 0 for r in tuning.table)
    assert printed.strip() == str(tuning)
    picked = [line for line in printed.splitlines() if line.startswith("*")]
    assert len(picked) == 1 and picked[0].split()[1:3] == [str(tuning.num_workers), str(tuning.envs_per_worker)]
    assert "SerialEnv of the same envs in this process" in printed
    with ParallelEnv(create_env_fn=CountingEnv, **tuning.kwargs) as env:
        assert env.rollout(3, break_when_any_done=False).batch_size == (4, 3)
    collector = MultiSyncCollector(tuning.collector_env_fns(CountingEnv), frames_per_batch=8, total_frames=16)
    try:
        batches = [batch.numel() for batch in collector]
    finally:
        collector.shutdown()
    assert batches == [8, 8]


def test_the_faster_split_wins_where_the_gap_is_wide(no_leaks):
    """Envs that sleep 5 ms a step: 4 workers of 1 env step a batch in ~5 ms, 1 worker of 4 in ~20 ms (sleeping
    needs no core, so this holds on any machine)."""
    tuning = autotune(functools.partial(SlowEnv, 0.005), 4, budget_s=4, max_workers=4, serial=False, verbose=False)
    assert (tuning.num_workers, tuning.envs_per_worker) == (4, 1), str(tuning)
    assert tuning.serial_steps_per_s is None
    rates = {r.num_workers: r.rate for r in tuning.table}
    assert rates[4] > 2 * rates[1], str(tuning)


def test_the_rollouts_timed_act_with_the_policy_given(no_leaks):
    """The wait that wins depends on what this process does between steps: the timed rollouts run the policy."""
    seen = []

    def policy(td):
        seen.append(tuple(td.batch_size))
        return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))

    autotune(CountingEnv, 2, policy=policy, budget_s=1, max_workers=2, serial=False, verbose=False)
    assert seen and set(seen) == {(2,)}


@pytest.mark.parametrize("kwargs, message", [
    ({"num_envs": 2, "policy": "not callable"}, "policy must be callable"),
    ({"num_envs": 0}, "num_envs >= 1"),
    ({"num_envs": 2.0}, "num_envs >= 1"),
    ({"num_envs": 2, "budget_s": 0}, "budget_s > 0"),
    ({"num_envs": 2, "max_workers": 0}, "max_workers >= 1"),
    ({"num_envs": 2, "num_workers": 2}, "chooses num_workers itself"),
    ({"num_envs": 2, "spin_s": 0.0}, "chooses spin_s itself"),
])
def test_bad_arguments_are_clear_errors(kwargs, message, no_leaks):
    with pytest.raises(ArgumentError, match=message):
        autotune(CountingEnv, **kwargs)


def _broken_env():
    raise RuntimeError("this env cannot be built")


def test_an_env_that_cannot_be_built_is_its_error(no_leaks):
    with pytest.raises(EnvWorkerError, match="this env cannot be built"):
        autotune(_broken_env, 2, budget_s=2, serial=False)
