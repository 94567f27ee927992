"""Envs whose batches cannot live in storage allocated once (``collectors/stacked.py``): non-tensor entries and
dynamic shapes (batches stacked step by step, by pipe from the workers), and heterogeneous entries (one shape per
agent: lazily stacked storage), through every collector."""
import pytest
import torch
from tensordict import LazyStackedTensorDict
from torchrl.testing.mocking_classes import EnvWithDynamicSpec, HeterogeneousCountingEnv

from tdcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from tests.torchrl_envs import TextEnv

pytestmark = pytest.mark.timeout(120)


def check_text_steps(batch) -> int:
    """``batch`` [T] of TextEnv (episodes of 3 steps, "text" the step count): each step's next text is its text
    plus one, and an episode's end is followed by a reset ("0"). Returns the episodes that ended."""
    texts, nexts = batch["text"], batch["next", "text"]
    done = batch["next", "done"].squeeze(-1).tolist()
    assert len(texts) == len(nexts) == batch.shape[-1]
    for t in range(batch.shape[-1]):
        assert int(nexts[t]) == int(texts[t]) + 1, (t, texts, nexts)
        assert done[t] == (int(nexts[t]) == 3)
        if t + 1 < batch.shape[-1]:
            assert texts[t + 1] == ("0" if done[t] else nexts[t])
    return sum(done)


def test_non_tensor_entries_in_every_collector(no_leaks):
    with Collector(TextEnv, None, frames_per_batch=7, total_frames=14) as collector:
        batches = list(collector)
    assert [b.batch_size for b in batches] == [(7,), (7,)] and batches[0].names == ["time"]
    assert sum(check_text_steps(b) for b in batches) == 4
    first, second = batches
    assert second["text"][0] == ("0" if first["next", "done"][-1] else first["next", "text"][-1]), "episodes go on"
    with MultiSyncCollector([TextEnv, TextEnv], None, frames_per_batch=10, total_frames=20) as collector:
        for batch in collector:
            assert isinstance(batch, LazyStackedTensorDict) and batch.batch_size == (2, 5)
            for worker in batch.unbind(0):
                check_text_steps(worker)
            assert batch["collector", "traj_ids"].shape == (2, 5)
    with MultiSyncCollector([TextEnv, TextEnv], None, frames_per_batch=10, total_frames=10, cat_results=-1) as c:
        (batch,) = list(c)
        assert batch.batch_size == (10,)
    with MultiAsyncCollector([TextEnv, TextEnv], None, frames_per_batch=6, total_frames=30) as collector:
        batches = list(collector)
        assert collector.frames == 30
    for batch in batches:
        assert batch.batch_size == (6,)
        check_text_steps(batch)
    ids = torch.cat([b["collector", "traj_ids"] for b in batches])
    assert len(set(ids.tolist())) >= 10, "ids are unique over workers and batches"


def test_dynamic_shapes_are_stacked_lazily(no_leaks):
    with Collector(EnvWithDynamicSpec(), None, frames_per_batch=12, total_frames=24) as collector:
        for batch in collector:
            assert isinstance(batch, LazyStackedTensorDict) and batch.batch_size == (12,)
            assert batch.names == ["time"]
            shapes = {tuple(step["next", "observation"].shape) for step in batch.unbind(0)}
            assert len(shapes) > 1, "the observation's shape changes from step to step, as the env's"
    with MultiSyncCollector([EnvWithDynamicSpec] * 2, None, frames_per_batch=12, total_frames=12) as collector:
        (batch,) = list(collector)
        assert isinstance(batch, LazyStackedTensorDict) and batch.batch_size == (2, 6)
        assert collector.frames == 12


def test_heterogeneous_entries_in_every_batch_shape(no_leaks):
    for batch_size in [(), (2,), (2, 1)]:
        env = HeterogeneousCountingEnv(max_steps=3, batch_size=batch_size)
        with Collector(env, None, frames_per_batch=8 * max(1, len(batch_size)), total_frames=1) as collector:
            (batch,) = list(collector)
        steps = batch.shape[-1]
        assert batch.batch_size == (*batch_size, steps)
        lazy = batch["lazy"]  # [*batch, T, 3 agents], one shape per agent
        assert [tuple(lazy[..., i]["vector"].shape[-1:]) for i in range(3)] == [(3,), (2,), (2,)]
        assert lazy[..., 0]["action"].shape[-1] == 3 and lazy[..., 1]["action"].shape[-1] == 2
    env_fn = lambda: HeterogeneousCountingEnv(max_steps=3, batch_size=(4,))  # noqa: E731
    with MultiSyncCollector([env_fn] * 2, None, frames_per_batch=16, total_frames=16) as collector:
        (batch,) = list(collector)
        assert batch.batch_size == (2, 4, 2)
        assert batch["lazy"][..., 2]["tensor_2"].shape == (2, 4, 2, 1, 2, 3)


def test_what_stacked_batches_cannot_do_is_a_clear_error(no_leaks):
    with pytest.raises(ValueError, match="preemptive_threshold"):
        MultiSyncCollector([TextEnv, TextEnv], None, frames_per_batch=10, preemptive_threshold=0.5)
    with pytest.raises(ValueError, match="StepCounter"):
        Collector(TextEnv, None, frames_per_batch=10, max_frames_per_traj=5)
