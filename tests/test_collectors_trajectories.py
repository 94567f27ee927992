"""TorchRL's whole-trajectory arguments (``trajs_per_batch``, ``trajs_per_write``, ``traj_format``), its
replay-buffer write layouts and ``max_frames_per_traj``'s step counts, on our collectors. The env counts its steps
in its observation (``obs[0]``: 0 at reset, 1 after the first step), so a whole trajectory is easy to recognise."""
import functools
import warnings

import pytest
import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from tdcollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from tdcollect.envs import SerialEnv
from tests.helpers import CountingEnv

pytestmark = pytest.mark.timeout(120)


def episodes_of(length):
    return functools.partial(CountingEnv, episode_len=length)


def assert_whole(traj_obs, traj_done, length):
    """One trajectory ``[T, 3]`` observations and ``[T]`` next-done flags: starts at a reset, ends done."""
    assert traj_obs[:, 0].tolist() == list(range(length)), "a trajectory starts at its env's reset, in order"
    assert traj_done.tolist() == [False] * (length - 1) + [True], "and ends with its last (done) step"


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector])
def test_padded_batches_hold_whole_trajectories_of_every_length(cls, no_leaks):
    lengths = [3, 5]  # two envs with different episode lengths
    envs = (SerialEnv(2, [episodes_of(n) for n in lengths]) if cls is Collector
            else [episodes_of(n) for n in lengths])
    with cls(envs, None, frames_per_batch=8, total_frames=80, trajs_per_batch=3, traj_format="padded") as collector:
        batches = list(collector)
    assert batches, "80 frames of 3- and 5-step episodes finish many trajectories"
    for batch in batches:
        mask = batch["collector", "mask"]
        assert batch.batch_size[0] == 3 and mask.shape == batch.batch_size
        for row in range(3):
            n = int(mask[row].sum())
            assert n in lengths and mask[row, :n].all() and not mask[row, n:].any(), "padding only at the end"
            assert_whole(batch["observation"][row, :n], batch["next", "done"][row, :n, 0], n)
            assert batch["collector", "traj_ids"][row, :n].unique().numel() == 1
    if isinstance(envs, SerialEnv):
        envs.close()


def test_cat_layout_and_replay_buffer_writes_are_flat(no_leaks):
    with Collector(episodes_of(4), None, frames_per_batch=6, total_frames=60, trajs_per_batch=2,
                   traj_format="cat") as collector:
        batch = next(iter(collector))
    assert batch.batch_size == (8,) and ("collector", "mask") not in batch.keys(True)
    for half in (batch[:4], batch[4:]):
        assert_whole(half["observation"], half["next", "done"][:, 0], 4)
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    writes = []
    extend = buffer.extend
    buffer.extend = lambda data: (writes.append(data.batch_size), extend(data))[1]
    with MultiSyncCollector([episodes_of(4)] * 2, None, frames_per_batch=10, total_frames=100, trajs_per_batch=2,
                            trajs_per_write=1, replay_buffer=buffer) as collector:
        assert all(b is None for b in collector)
    assert writes and all(size == (4,) for size in writes), "one whole 4-step trajectory per write"
    stored = buffer[:]
    for start in range(0, len(buffer), 4):
        assert_whole(stored["observation"][start:start + 4], stored["next", "done"][start:start + 4, 0], 4)
    assert len(buffer) == 4 * len(writes) < 100, "trajectories still running at the end are held back"


def test_trajectory_arguments_are_checked_as_torchrl_does(no_leaks):
    with pytest.warns(FutureWarning, match="will change to 'cat'"):
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=2).shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when the layout is chosen or a buffer takes the trajectories
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=2, traj_format="cat").shutdown()
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=2,
                  replay_buffer=ReplayBuffer(storage=LazyTensorStorage(10))).shutdown()
    with pytest.raises(ValueError, match="must be 'padded' or 'cat'"):
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=2, traj_format="flat")
    with pytest.raises(ValueError, match="needs trajs_per_batch"):
        Collector(episodes_of(3), None, frames_per_batch=6, traj_format="cat")
    with pytest.raises(ValueError, match="positive int"):
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=0)
    with pytest.raises(ValueError, match="split_trajs=False"):
        Collector(episodes_of(3), None, frames_per_batch=6, trajs_per_batch=2, traj_format="cat", split_trajs=True)


def test_reset_drops_unfinished_trajectories(no_leaks):
    with Collector(episodes_of(4), None, frames_per_batch=6, total_frames=-1, trajs_per_batch=1,
                   traj_format="cat") as collector:
        it = iter(collector)
        next(it)  # 6 frames: one trajectory out, the second one 2 steps in
        collector.reset()
        after = next(it)
    assert_whole(after["observation"], after["next", "done"][:, 0], 4)


def test_replay_buffer_items_follow_torchrl(no_leaks):
    """TorchRL writes an unbatched env's steps as items, a batched env's rows of T steps as items, and with
    extend_buffer=False every step of the env batch as one item."""
    flat = ReplayBuffer(storage=LazyTensorStorage(100))
    with MultiSyncCollector([episodes_of(50)] * 2, None, frames_per_batch=10, total_frames=20,
                            replay_buffer=flat) as collector:
        list(collector)
    assert len(flat) == 20 and flat[:].batch_size == (20,)
    rows = ReplayBuffer(storage=LazyTensorStorage(100))
    env = SerialEnv(2, episodes_of(50))
    with Collector(env, None, frames_per_batch=10, total_frames=20, replay_buffer=rows) as collector:
        list(collector)
    assert len(rows) == 4 and rows[:].batch_size == (4, 5), "2 env rows of 5 steps per batch"
    steps = ReplayBuffer(storage=LazyTensorStorage(100))
    with Collector(env, None, frames_per_batch=10, total_frames=20, replay_buffer=steps,
                   extend_buffer=False) as collector:
        list(collector)
    assert len(steps) == 10 and steps[:].batch_size == (10, 2), "one item per step of the 2-env batch"
    env.close()


def test_max_frames_per_traj_counts_steps_as_torchrl_step_counter(no_leaks):
    with Collector(episodes_of(50), None, frames_per_batch=10, total_frames=20, max_frames_per_traj=4) as collector:
        first, second = list(collector)
    counts = torch.cat([first["step_count"], second["step_count"]]).squeeze(-1)
    assert counts.tolist() == [0, 1, 2, 3] * 5
    assert torch.equal(torch.cat([first["next", "step_count"], second["next", "step_count"]]).squeeze(-1),
                       counts + 1)
    truncated = torch.cat([first["next", "truncated"], second["next", "truncated"]]).squeeze(-1)
    assert truncated.tolist() == [False, False, False, True] * 5
    assert torch.cat([first["observation"], second["observation"]])[:, 0].tolist() == [0, 1, 2, 3] * 5
