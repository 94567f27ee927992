"""TorchRL's preemption: ``Collector(interruptor=...)`` and ``MultiSyncCollector(preemptive_threshold=...)``."""
import functools

import pytest
import torch

from tdcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from tdcollect.collectors.preemption import StopFlag
from tests.helpers import CountingEnv, SlowEnv

pytestmark = pytest.mark.timeout(120)
COUNTING = functools.partial(CountingEnv, episode_len=50)


def test_collector_stops_at_the_step_the_interruptor_says(no_leaks):
    interruptor = StopFlag()
    interruptor.stop_collection()
    with Collector(COUNTING, None, frames_per_batch=10, total_frames=2, interruptor=interruptor) as collector:
        first, second = (batch.clone() for batch in collector)
        assert collector.frames == 2, "only the steps taken count as frames"
    for batch in (first, second):
        ids = batch["collector", "traj_ids"]
        assert (ids[:1] >= 0).all() and (ids[1:] == -1).all()
        assert (batch["next", "observation"][1:] == 0).all(), "the steps not taken hold zeros, not an older batch"
    # the episode goes on where it stopped: the second batch's step is the episode's second step, same id
    assert first["next", "observation"][0, 0] == 1 and second["next", "observation"][0, 0] == 2
    assert first["collector", "traj_ids"][0] == second["collector", "traj_ids"][0]


def test_multisync_preempts_the_slow_worker(no_leaks):
    slow = functools.partial(SlowEnv, delay=0.05)
    with MultiSyncCollector([COUNTING, slow], None, frames_per_batch=40, total_frames=80,
                            preemptive_threshold=0.5) as collector:
        batches = [batch.clone() for batch in collector]
        assert collector.frames == sum(int(b["collector", "mask"].sum()) for b in batches)
    for batch in batches:
        mask, ids = batch["collector", "mask"], batch["collector", "traj_ids"]
        assert batch.batch_size == (2, 20) and mask.shape == (2, 20)
        assert mask[0].all(), "the fast worker finishes its share"
        taken = int(mask[1].sum())
        assert 1 <= taken < 20, "the slow worker is stopped once the fast one is done"
        assert (mask == (ids != -1)).all()
        assert (batch["next", "observation"][1, taken:] == 0).all()
    # the slow worker's episode continues in the next batch
    steps = [b["next", "observation"][1, : int(b["collector", "mask"][1].sum()), 0] for b in batches]
    assert torch.equal(torch.cat(steps), torch.arange(1, len(torch.cat(steps)) + 1, dtype=torch.float32))


def test_multisync_preemption_with_cat_results_time_drops_the_steps_not_taken(no_leaks):
    slow = functools.partial(SlowEnv, delay=0.05)
    with MultiSyncCollector([COUNTING, slow], None, frames_per_batch=40, total_frames=40, cat_results=-1,
                            preemptive_threshold=0.5) as collector:
        batch = next(iter(collector))
    assert 20 < batch.shape[-1] < 40 and (batch["collector", "traj_ids"] != -1).all()


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_preemption_arguments_are_checked(threshold, no_leaks):
    with pytest.raises(ValueError, match="preemptive_threshold must be between 0.0 and 1.0"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=10, preemptive_threshold=threshold)
    with pytest.raises(ValueError, match="applies to MultiSyncCollector"):
        MultiAsyncCollector([COUNTING] * 2, None, frames_per_batch=10, preemptive_threshold=0.5)
    with pytest.raises(TypeError, match="collection_stopped"):
        Collector(COUNTING, None, frames_per_batch=10, interruptor=object())
    with MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=10, total_frames=10,
                            preemptive_threshold=1.0) as collector:  # TorchRL's: 1.0 can never preempt
        assert collector.interruptor is None
        assert "mask" not in next(iter(collector))["collector"].keys()
