"""TorchRL's collector API on ours: the entry point ``Collector(num_collectors=..., sync=...)``, MultiAsync and
Async collectors, ``cat_results`` layouts, per-batch arguments (postproc, replay buffer, hooks, set_truncated,
track_traj_ids), ``set_seed``'s return, ``state_dict``, ``reset``, refused arguments. Where TorchRL's answer is a
value (a seed, a layout), it is compared with TorchRL's own collector on the same envs."""
import functools
import json
import multiprocessing
import os
import time

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import GymEnv

from tdcollect.collectors import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from tdcollect.envs import SerialEnv
from tests.helpers import CountingEnv
from tests.test_collectors import ConstantAction

pytestmark = pytest.mark.timeout(120)
COUNTING = functools.partial(CountingEnv, episode_len=50)


def gym_cartpole():
    return GymEnv("CartPole-v1")


def test_collector_entry_point_returns_the_process_collectors(no_leaks):
    with Collector(COUNTING, None, num_collectors=2, sync=True, frames_per_batch=20, total_frames=40) as sync:
        assert type(sync) is MultiSyncCollector and sync.num_workers == 2
        assert [b.batch_size for b in sync] == [(2, 10), (2, 10)]
    with Collector([COUNTING] * 3, None, num_collectors=3, frames_per_batch=10, total_frames=30) as asynchronous:
        assert type(asynchronous) is MultiAsyncCollector and asynchronous.num_workers == 3  # TorchRL's default
    with pytest.raises(ValueError, match="num_collectors=2 but 3 env constructors"):
        Collector([COUNTING] * 3, None, num_collectors=2, frames_per_batch=10)
    with pytest.raises(ValueError, match="backend='ray' gives tdcollect's RayCollector.*pass sync=True"):
        Collector(COUNTING, None, backend="ray", num_collectors=2, frames_per_batch=10)
    with pytest.raises(ValueError, match="backend='rpc' is not supported.*backend='ray'"):
        Collector(COUNTING, None, backend="rpc", num_collectors=2, frames_per_batch=10)
    with pytest.raises(ValueError, match="sync choose process collectors"):
        Collector(COUNTING, None, sync=True, frames_per_batch=10)


def test_unbatched_env_gives_torchrls_layout(no_leaks):
    ours = Collector(gym_cartpole, None, frames_per_batch=16, total_frames=16)
    theirs = TorchRLCollector(gym_cartpole, None, frames_per_batch=16, total_frames=16)
    try:
        mine, reference = next(iter(ours)), next(iter(theirs))
        assert mine.batch_size == reference.batch_size == (16,)
        assert set(reference.keys(True, True)) <= set(mine.keys(True, True))
        assert mine["collector", "traj_ids"].shape == reference["collector", "traj_ids"].shape
    finally:
        ours.shutdown()
        theirs.shutdown()


@pytest.mark.parametrize("cat_results, shape", [(None, (2, 3, 4)), ("stack", (2, 3, 4)), (0, (6, 4)), (-1, (3, 8))])
def test_cat_results_layouts_of_batched_workers(cat_results, shape, no_leaks):
    make = functools.partial(SerialEnv, 3, COUNTING)
    with MultiSyncCollector([make] * 2, None, frames_per_batch=24, total_frames=24,
                            cat_results=cat_results) as collector:
        batch = next(iter(collector))
    assert batch.batch_size == shape
    ids = batch["collector", "traj_ids"]
    assert ids.unique().numel() == 6, "every env's trajectory has its own id"
    # time runs along the last dim in every layout: the step counter grows by one per step
    count = batch["next", "observation"][..., 0]
    assert ((count.diff(dim=-1) == 1) | (ids.diff(dim=-1) != 0)).all()


def test_cat_results_of_unbatched_workers(no_leaks):
    with MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, total_frames=20, cat_results=0) as collector:
        assert next(iter(collector)).batch_size == (20,)
    with pytest.raises(ValueError, match="cat_results must be 'stack' or an int"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, cat_results="cat")


def test_frames_per_batch_and_devices_per_worker(no_leaks):
    make = functools.partial(SerialEnv, 2, COUNTING)
    # MultiSync: each worker's share of the batch; one device given per worker
    with MultiSyncCollector([COUNTING, make], None, frames_per_batch=[4, 8], total_frames=24, cat_results=0,
                            device=["cpu", "cpu"], storing_device=[torch.device("cpu")] * 2) as collector:
        assert [collector.frames_per_batch_worker(worker_idx=w) for w in (0, 1)] == [4, 8]
        assert [b.batch_size for b in collector] == [(3, 4), (3, 4)]
    # MultiAsync: as TorchRL's, every batch holds the sum
    with MultiAsyncCollector([COUNTING] * 2, None, frames_per_batch=[6, 2], total_frames=16) as collector:
        assert [b.batch_size for b in collector] == [(8,), (8,)]
    with pytest.raises(ValueError, match="exactly one value per worker"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=[10])
    with pytest.raises(ValueError, match="different numbers of steps per batch"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=[10, 4])
    with pytest.raises(ValueError, match="must share one device"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=10, device=["cpu", "meta"])


def test_multi_async_yields_each_workers_batches_as_they_come(no_leaks):
    policy = ConstantAction(3, favourite=1)
    with MultiAsyncCollector([COUNTING] * 2, policy, frames_per_batch=10, total_frames=60) as collector:
        batches = [batch.clone() for batch in collector]
        assert collector.frames == 60
        assert len(collector.weight_versions) == 2
    assert len(batches) == 6 and all(b.batch_size == (10,) for b in batches)
    assert all((b["action"] == 1).all() for b in batches)
    ids = torch.cat([b["collector", "traj_ids"] for b in batches])
    # two workers' envs, 60 steps of 50-step episodes: at most 4 trajectories, never one id for two envs
    firsts = {int(b["collector", "traj_ids"][0]) for b in batches}
    assert len(ids.unique()) <= 4 and len(firsts) >= 2
    for batch in batches:
        count = batch["next", "observation"][:, 0]
        same = batch["collector", "traj_ids"].diff() == 0
        assert (count.diff()[same] == 1).all(), "one trajectory id, one env's consecutive steps"


def test_async_collector_one_worker_and_weights(no_leaks):
    policy = ConstantAction(3, favourite=0)
    with AsyncCollector(COUNTING, policy, frames_per_batch=10, total_frames=-1, update_at_each_batch=True) as c:
        it = iter(c)
        assert (next(it)["action"] == 0).all()
        with torch.no_grad():
            policy.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        actions = [next(it)["action"] for _ in range(3)]  # one batch may be the one collected meanwhile
        assert (actions[-1] == 2).all(), "update_at_each_batch publishes the policy's weights before each batch"
    with pytest.raises(ValueError, match="one worker"):
        AsyncCollector([COUNTING] * 2, None, frames_per_batch=10)


def test_postproc_replay_buffer_and_hooks(no_leaks):
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    manager = multiprocessing.Manager()  # the hooks run in the workers, as TorchRL's
    calls = manager.list()
    try:
        with MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, total_frames=60, replay_buffer=buffer,
                                postproc=lambda td: td.set("doubled", td["next", "reward"] * 2),
                                pre_collect_hook=lambda: calls.append(("pre", os.getpid())),
                                post_collect_hook=lambda td: calls.append(("post", os.getpid(), td.numel()))
                                ) as collector:
            yielded = list(collector)
            late = collector.pre_collect_hook = lambda: calls.append(("late", os.getpid()))  # noqa: F841
            collector.total_frames = 80
            yielded += list(collector)
        calls = list(calls)
    finally:
        manager.shutdown()
    assert yielded == [None] * 4, "with a replay buffer the batches go there and the iteration yields None"
    assert len(buffer) == 80
    workers = {call[1] for call in calls}
    assert len(workers) == 2 and os.getpid() not in workers, "each worker runs the hooks"
    assert sorted(call[0] for call in calls) == ["late"] * 2 + ["post"] * 8 + ["pre"] * 6
    assert all(call[2] == 10 for call in calls if call[0] == "post"), "around the worker's share of the batch"
    sample = buffer.sample(8)
    assert torch.equal(sample["doubled"], sample["next", "reward"] * 2)
    with pytest.raises(TypeError, match="return_same_td must be False"):
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, replay_buffer=buffer, return_same_td=True)


def test_set_truncated_and_track_traj_ids(no_leaks):
    with Collector(SerialEnv(2, COUNTING), None, frames_per_batch=20, total_frames=20, set_truncated=True,
                   track_traj_ids=False) as collector:
        batch = next(iter(collector))
    assert batch["next", "truncated"][:, -1].all() and batch["next", "done"][:, -1].all()
    assert not batch["next", "truncated"][:, :-1].any()
    assert ("collector", "traj_ids") not in batch.keys(True, True)


def test_set_seed_returns_torchrls_next_seed(no_leaks):
    reference = TorchRLCollector(gym_cartpole, None, frames_per_batch=10, total_frames=10)
    try:
        one = reference.set_seed(7)
    finally:
        reference.shutdown()
    with Collector(gym_cartpole, None, frames_per_batch=10, total_frames=10) as collector:
        assert collector.set_seed(7) == one
        assert collector.set_seed(7, static_seed=True) == 7
    with MultiSyncCollector([gym_cartpole] * 2, None, frames_per_batch=10, total_frames=10) as collector:
        two = collector.set_seed(7)
    with SerialEnv(2, gym_cartpole) as env:
        assert two == env.set_seed(7), "the seed after the last env's, as a batched env of all of them returns"


def test_state_dict_round_trip_reaches_the_workers(no_leaks):
    policy = ConstantAction(3, favourite=0)
    with MultiSyncCollector([COUNTING] * 2, policy, frames_per_batch=20, total_frames=-1) as collector:
        it = iter(collector)
        next(it)
        state = collector.state_dict()
        assert state["frames"] == 20 and state["iter"] == 0 and "policy_state_dict" not in state  # TorchRL: batches - 1
        assert state["traj_pool"]["traj_id"] == 1, "two envs, one trajectory each so far"
        assert torch.equal(state["worker1"]["policy_state_dict"]["bias"], policy.bias), "TorchRL's per-worker form"
        state["worker0"]["policy_state_dict"]["bias"] = torch.tensor([0.0, 0.0, 1.0])
        state["frames"] = 1000
        collector.load_state_dict(state)
        assert collector.frames == 1000
        after = next(it)
        assert (after["action"] == 2).all(), "loaded weights reach every worker"
        assert after["collector", "traj_ids"].min() > 1, "trajectories after a restore are numbered after the saved"
    with Collector(SerialEnv(1, COUNTING), None, frames_per_batch=10) as collector:
        with pytest.raises(ValueError, match="holds policy weights"):
            collector.load_state_dict({"policy_state_dict": {}, "frames": 0, "iter": 0})


def test_reset_starts_new_episodes(no_leaks):
    with MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=10, total_frames=-1) as collector:
        it = iter(collector)
        first = next(it)
        collector.reset()
        after = next(it)
    assert after["observation"][:, 0, 0].eq(0).all(), "the batch after reset() starts with fresh episodes"
    before = first["collector", "traj_ids"].flatten().tolist()
    assert set(after["collector", "traj_ids"][:, 0].tolist()).isdisjoint(before)


def test_policy_factory_compile_policy_and_create_env_kwargs(no_leaks):
    with Collector(CountingEnv, policy_factory=lambda: ConstantAction(3, favourite=2), frames_per_batch=10,
                   total_frames=10, create_env_kwargs={"episode_len": 4}) as collector:
        batch = next(iter(collector))
    assert (batch["action"] == 2).all() and batch["next", "done"].sum() == 2
    module = TensorDictModule(ConstantAction(3, favourite=1), ["observation"], ["action"])
    with MultiSyncCollector([COUNTING] * 2, module, frames_per_batch=10, total_frames=10,
                            compile_policy={"backend": "eager"}) as collector:
        assert (next(iter(collector))["action"] == 1).all()
    with pytest.raises(TypeError, match="policy or policy_factory, not both"):
        Collector(COUNTING, module, policy_factory=lambda: module, frames_per_batch=10)


@pytest.mark.parametrize("argument, value, message", [
    ("weight_updater", object(), "through shared memory"),
    ("weight_sync_schemes", {"policy": object()}, "one shared-memory copy"),
    ("collector_class", object(), "own collector loop"),
    ("reset_when_done", False, "always reset a finished env"),
    ("cudagraph_policy", True, "CUDA graphs are not supported"),
])
def test_refused_torchrl_arguments_say_why(argument, value, message, no_leaks):
    with pytest.raises(ValueError, match=message) as info:
        MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=10, **{argument: value})
    assert argument in str(info.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_an_argument'"):
        Collector(COUNTING, None, frames_per_batch=10, not_an_argument=1)


def test_update_policy_weights_takes_torchrls_keyword(no_leaks):
    policy = ConstantAction(3, favourite=0)
    with MultiSyncCollector([COUNTING] * 2, policy, frames_per_batch=10, total_frames=-1) as collector:
        it = iter(collector)
        next(it)
        collector.update_policy_weights_(policy_or_weights=TensorDict({"bias": torch.tensor([0.0, 1.0, 0.0])}))
        assert (next(it)["action"] == 1).all()


def test_start_collects_into_the_buffer_in_the_background_until_async_shutdown(no_leaks):
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000))
    collector = MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, total_frames=-1, replay_buffer=buffer)
    collector.start()
    with pytest.raises(RuntimeError, match="started already"):
        collector.start()
    deadline = time.monotonic() + 60
    while len(buffer) < 100 and time.monotonic() < deadline:  # polls the buffer the background thread fills
        time.sleep(0.01)
    with collector.pause():
        held = len(buffer)
        assert held % 20 == 0
    collector.async_shutdown()
    assert collector.frames >= held >= 100
    with Collector(COUNTING, None, frames_per_batch=10) as plain, pytest.raises(RuntimeError, match="replay_buffer="):
        plain.start()


def test_next_hooks_as_attributes_and_policy_versions(no_leaks):
    policy = ConstantAction(3, favourite=0)
    with MultiSyncCollector([COUNTING] * 2, policy, frames_per_batch=10, total_frames=30,
                            track_policy_version=True) as collector:
        first = collector.next()
        assert first["policy_version"].eq(0).all() and first["next", "policy_version"].shape == (2, 5)
        collector.update_policy_weights_()
        assert collector.get_policy_version() == collector.policy_version == 1
        assert collector.next()["policy_version"].eq(1).all()
        assert collector.next() is not None and collector.next() is None  # total_frames=30: three batches
    seen = []
    with Collector(COUNTING, None, frames_per_batch=10, total_frames=10, track_policy_version=True) as collector:
        collector.post_collect_hook = seen.append  # in this process: the batch yielded, as TorchRL's Collector
        collector.update_policy_weights_()
        assert collector.next()["policy_version"].eq(1).all()
    assert len(seen) == 1 and seen[0].batch_size == (10,)


class PidStamp(torch.nn.Module):
    """Acts with the argmax of its bias and records the process that built it."""

    def __init__(self, favourite=0):
        super().__init__()
        self.built_in = os.getpid()
        self.bias = torch.nn.Parameter(torch.zeros(3))
        with torch.no_grad():
            self.bias[favourite] = 1.0

    def forward(self, obs):
        return (obs[..., :1] * 0 + self.bias).argmax(-1)


BUILT_HERE: list[int] = []  # the factory's calls in this process (a worker appends to its own copy)


def build_pid_stamp():
    BUILT_HERE.append(os.getpid())
    return TensorDictModule(PidStamp(), ["observation"], ["action"])


def test_policy_factory_builds_in_each_worker_and_takes_weights(no_leaks):
    with MultiSyncCollector([COUNTING] * 2, policy_factory=build_pid_stamp, frames_per_batch=10,
                            total_frames=-1) as collector:
        it = iter(collector)
        assert (next(it)["action"] == 0).all()
        collector.update_policy_weights_(TensorDict({"module": {"bias": torch.tensor([0.0, 0.0, 1.0])}}))
        assert (next(it)["action"] == 2).all(), "the weights passed reach the policies the workers built"
        with pytest.raises(ValueError, match="holds none to read weights from"):
            collector.update_policy_weights_()
    assert BUILT_HERE == [], "the factory runs in the workers only, as TorchRL's"
    source = TensorDictModule(PidStamp(), ["observation"], ["action"])  # the weights' source; workers build theirs
    with MultiAsyncCollector([COUNTING] * 2, source, policy_factory=build_pid_stamp, frames_per_batch=10,
                             total_frames=-1) as collector:
        it = iter(collector)
        next(it)
        with torch.no_grad():
            source.module.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
        collector.update_policy_weights_()
        assert any((next(it)["action"] == 1).all() for _ in range(4)), "workers act with the source's weights"


def test_stats_private_keys_and_lazy_random_policy(no_leaks):
    from torchrl.modules import RandomPolicy as TorchRLRandomPolicy

    lazy = TorchRLRandomPolicy()
    with Collector(COUNTING, lazy, frames_per_batch=10, total_frames=20) as collector:
        assert lazy.action_spec is not None, "the collector gives a spec-less RandomPolicy the env's"
        assert collector.stats() == {"frames": 0, "batches": 0, "requested_frames_per_batch": 10,
                                     "policy_version": 0, "total_frames": 20, "completed": False}
        list(collector)
        assert json.loads(json.dumps(collector.stats()))["completed"] is True
    private = TensorDictModule(lambda obs: (obs[..., 0].long() % 3, obs), ["observation"], ["action", "_copy"])
    with MultiSyncCollector([COUNTING] * 2, private, frames_per_batch=10, total_frames=10,
                            track_traj_ids=False) as collector:
        batch = next(iter(collector))
        assert "_copy" not in batch.keys() and "collector" not in batch.keys(), "TorchRL leaves both out"
        per_worker = collector.stats(workers="both")
        assert per_worker["workers"] == per_worker["workers_alive"] == 2 and per_worker["worker_1/frames"] == 5
        with pytest.raises(ValueError, match="workers must be one of"):
            collector.stats(workers="bogus")


class TwoInputs(torch.nn.Module):
    def forward(self, observation, not_an_observation):
        return observation


def test_unwrappable_module_is_a_type_error_in_this_process(no_leaks):
    with pytest.raises(TypeError, match="Arguments to policy.forward are incompatible with entries in"):
        MultiSyncCollector([COUNTING] * 2, TwoInputs(), frames_per_batch=10)
    with pytest.raises(TypeError, match="not_an_observation"):
        Collector(COUNTING, TwoInputs(), frames_per_batch=10)


def mark_process():
    os.environ["TDCOLLECT_TEST_INIT_FN"] = "ran"


def test_remote_helpers_init_fn_and_profiling(tmp_path, no_leaks):
    with MultiAsyncCollector([COUNTING] * 2, None, frames_per_batch=10, total_frames=40, init_fn=mark_process) as c:
        assert c.get_distant_attr("worker_idx") == [0, 1]
        assert c.map_fn("get_distant_attr", [("frames_per_batch",)] * 2) == [10, 10]  # a worker's own batch
        with pytest.raises(ValueError, match="Expected 2 argument entries"):
            c.map_fn("get_distant_attr", [("worker_idx",)])
        # TorchRL's attribute paths, resolved in each worker: dots, subscripts, values as well as callables
        assert c.get_distant_attr("env.batch_size") == [torch.Size([1])] * 2
        assert c.map_fn("env.batch_size.numel") == [1, 1]
        assert c.map_fn("storage.batch_size[1]") == [10, 10]
        with pytest.raises(ValueError, match="not a Python literal"):
            c.get_distant_attr("storage.batch_size[x]")
        # asynchronous: worker 1 may give as few as one of the batches; a profile of fewer rollouts than asked is
        # written when the collector shuts down
        c.enable_profile(workers=[1], num_rollouts=10, warmup_rollouts=0,
                         save_path=str(tmp_path / "w{worker_idx}.json"))
        list(c)
        with pytest.raises(RuntimeError, match="after iteration has started"):
            c.enable_profile()
    assert (tmp_path / "w1.json").exists() and not (tmp_path / "w0.json").exists(), "worker 1 only, in the worker"
    assert "TDCOLLECT_TEST_INIT_FN" not in os.environ, "init_fn ran in the workers, not here"
    with Collector(COUNTING, None, frames_per_batch=10, total_frames=30) as c:
        assert c.map_fn("get_distant_attr", [("frames_per_batch",), ("total_frames",)]) == [10, 30]
        assert c.get_distant_attr("env.batch_size[0]") == 1
        with pytest.raises(ValueError, match="not callable"):
            c.map_fn("total_frames", [(1,)])
        c.enable_profile(num_rollouts=2, warmup_rollouts=0, save_path=str(tmp_path / "main{worker_idx}.json"))
        list(c)
    assert (tmp_path / "main0.json").exists()


def test_pause_parks_a_started_collection_so_the_workers_take_calls(no_leaks):
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = MultiAsyncCollector([COUNTING] * 2, None, frames_per_batch=10, total_frames=-1, replay_buffer=buffer)
    collector.start()
    try:
        for _ in range(3):
            with collector.pause():
                held = len(buffer)
                assert collector.get_distant_attr("worker_idx") == [0, 1], "no batch in flight: the workers answer"
                # the workers' replay buffer is the collector's (written by this process): answered here, per worker
                assert collector.map_fn("replay_buffer.__len__") == [len(buffer)] * 2
                assert collector.get_distant_attr("replay_buffer.write_count") == [buffer.write_count] * 2
                time.sleep(0.2)
                assert len(buffer) == held, "nothing is written while paused"
    finally:
        collector.async_shutdown()
