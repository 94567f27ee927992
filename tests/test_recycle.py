"""Output memory is reused, never overwritten behind the caller's back: rollouts and collector batches the caller
holds keep their values while later ones are made; memory that nothing holds any more is reused (that is what
makes image observations cheap); ``rollout(out=...)`` and ``return_same_td=True`` are the opt-ins that write into
the caller's storage."""
import functools
import gc

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdcollect.collectors import Collector, MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.protocol import OUTPUT_SLOTS
from tdcollect.envs.engine.recycle import OutputSlots, Recycler
from tdcollect.envs.inputs import copier, leaf_copier

from .helpers import FrameCountingEnv, FrameCrashOnceEnv, compare_when_told

pytestmark = pytest.mark.timeout(120)

FRAME_KEYS = ["observation", ("next", "observation")]


def _pointers(td) -> set[int]:
    return {td.get(key).untyped_storage().data_ptr() for key in FRAME_KEYS}


def _leaf_storages(td) -> set[int]:
    return {leaf.untyped_storage().data_ptr() for leaf in td.values(True, True)}


# ----------------------------------------------------------------- the recycler itself
def test_held_memory_is_never_handed_out_and_free_memory_is_reused():
    recycler = Recycler(min_bytes=1024)
    first = recycler.empty((64, 64), torch.float32)
    view = first[3:5]  # a view keeps the memory busy as well
    del first
    second = recycler.empty((64, 64), torch.float32)
    assert second.data_ptr() != view.untyped_storage().data_ptr()
    as_numpy = second.numpy()  # so does a numpy array over it
    del second
    third = recycler.empty((64, 64), torch.float32)
    assert third.data_ptr() not in (view.untyped_storage().data_ptr(), as_numpy.ctypes.data)
    pointer = view.untyped_storage().data_ptr()
    del view
    assert recycler.empty((64, 64), torch.float32).data_ptr() == pointer


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float64, torch.bfloat16, torch.int16])
def test_every_dtype_and_shape_is_served(dtype):
    recycler = Recycler(min_bytes=16)
    tensor = recycler.empty((3, 5, 7), dtype)
    assert tensor.shape == (3, 5, 7) and tensor.dtype == dtype and tensor.is_contiguous()
    tensor.fill_(1)
    assert bool((tensor == 1).all())


def test_small_tensors_are_not_kept_and_the_kept_bytes_are_bounded():
    recycler = Recycler(keep=2, min_bytes=1024, max_bytes=3 * 4096)
    recycler.empty((8,), torch.float32)
    assert recycler.kept_bytes == 0
    held = [recycler.empty((1024,), torch.float32) for _ in range(5)]  # 4 KiB each, all held
    assert recycler.kept_bytes <= 2 * 4096
    others = [recycler.empty((2048,), torch.float32) for _ in range(2)]  # 8 KiB each: older sizes are let go
    assert recycler.kept_bytes <= 3 * 4096
    assert len({t.data_ptr() for t in held + others}) == 7
    recycler.clear()
    assert recycler.kept_bytes == 0


def test_clone_stack_and_cat_copy_values():
    recycler = Recycler(min_bytes=16)
    from tensordict import TensorDict

    parts = [TensorDict({"a": torch.full((2, 40), float(i)), "n": {"b": torch.full((2, 40, 3), i)}}, [2, 40])
             for i in range(3)]
    for i, part in enumerate(parts):  # a group with batch dims of its own (one row per agent)
        part.set("agents", TensorDict({"obs": torch.full((2, 40, 5, 7), i)}, [2, 40, 5]))
    clone = recycler.clone(parts[1])
    assert (clone == parts[1]).all() and clone.get("a").data_ptr() != parts[1].get("a").data_ptr()
    pairs = [(recycler.stack(parts, 1), torch.stack(parts, 1)), (recycler.cat(parts, 0), torch.cat(parts, 0)),
             (recycler.cat(parts, 1), torch.cat(parts, 1))]
    for ours, theirs in pairs:
        assert ours.batch_size == theirs.batch_size
        assert ours.get("agents").batch_size == theirs.get("agents").batch_size
        assert (ours == theirs).all()


# ----------------------------------------------------------------- rollouts
@pytest.mark.parametrize("policy", [None, "module"])
def test_a_held_rollout_is_never_overwritten_and_a_dropped_one_is_reused(policy):
    env = SerialEnv(4, FrameCountingEnv)  # frames of 21 KB: a rollout's frame leaves are recycled
    if policy == "module":
        def policy(td):
            return td.set("action", env.full_action_spec.rand()["action"])
    try:
        env.set_seed(0)
        first = env.rollout(20, policy, break_when_any_done=False)
        kept = first.clone()
        second = env.rollout(20, policy, break_when_any_done=False)
        assert (first == kept).all()
        assert not _pointers(first) & _pointers(second)
        freed = _pointers(first)
        del first
        gc.collect()
        third = env.rollout(20, policy, break_when_any_done=False)
        assert _pointers(third) & freed, "the memory of a rollout nobody holds is reused"
        assert not _pointers(third) & _pointers(second)
        fourth = env.rollout(20, policy, break_when_any_done=False)  # second and third are held
        assert not _pointers(fourth) & (_pointers(second) | _pointers(third))
        frames = fourth.get(("next", "observation"))[..., 0, 0, 0].to(torch.int64)
        counts = frames // 10  # each frame is filled with steps so far * 10 + action
        assert bool((counts >= 1).all()) and bool((frames % 10 == fourth.get("action")).all())
    finally:
        env.close()


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_a_rollout_of_a_policy_that_requires_grad_carries_the_graph(kind, no_leaks):
    """As TorchRL's rollout: without torch.no_grad(), the actions keep their graph (recycled out= storage
    cannot hold one, so such rollouts are stacked into new memory)."""
    from tensordict.nn import TensorDictModule

    env = (SerialEnv if kind == "serial" else ParallelEnv)(2, FrameCountingEnv)
    net = torch.nn.Linear(1, 1)
    policy = TensorDictModule(lambda obs: net(obs[..., :1, 0, 0].float()), ["observation"], ["score"])

    def act(td):
        policy(td)
        return td.set("action", torch.zeros(td.shape, dtype=torch.int64))

    try:
        rollout = env.rollout(5, act, break_when_any_done=False)
        assert rollout["score"].requires_grad and rollout["score"].shape == (2, 5, 1)
        rollout["score"].sum().backward()
        assert net.weight.grad is not None and net.weight.grad.abs().sum() > 0
        with torch.no_grad():  # without grad the recycled path is taken again
            assert not env.rollout(5, act, break_when_any_done=False)["score"].requires_grad
    finally:
        env.close()


@pytest.fixture
def two_frame_envs():
    env = SerialEnv(2, FrameCountingEnv)
    env.set_seed(0)
    yield env
    env.close()


def test_rollout_out_writes_into_the_callers_storage(two_frame_envs):
    env = two_frame_envs
    storage = env.rollout(10, break_when_any_done=False)
    pointers = _leaf_storages(storage)
    again = env.rollout(10, break_when_any_done=False, out=storage)
    assert again is storage and _leaf_storages(again) == pointers
    assert bool((again.get(("next", "observation"))[:, 1:] != 0).all())

    def policy(td):
        return td.set("action", torch.ones(2, dtype=torch.int64))
    cut = env.rollout(10, policy, out=storage)  # stops at the first done (episodes last 7 steps)
    assert cut.batch_size[1] <= 10 and _leaf_storages(cut) <= pointers
    assert bool((cut.get("action") == 1).all())


def test_rollout_out_of_the_wrong_shape_is_refused_and_left_intact(two_frame_envs):
    env = two_frame_envs
    storage = env.rollout(10, break_when_any_done=False)
    before = storage.clone()
    with pytest.raises(ValueError, match=r"batch size \(2, 10\).*needs \(2, 5\)"):
        env.rollout(5, break_when_any_done=False, out=storage)
    del storage["observation"]
    with pytest.raises(ValueError, match="out\\['observation'\\] must be"):
        env.rollout(10, break_when_any_done=False, out=storage)
    assert (storage == before.exclude("observation")).all()
    with pytest.raises(TypeError, match="takes a TensorDict"):
        env.rollout(10, break_when_any_done=False, out=np.zeros(3))


def test_parallel_rollouts_recycle_too(no_leaks):
    with ParallelEnv(2, FrameCountingEnv, envs_per_worker=2) as env:
        env.set_seed(0)
        first = env.rollout(20, break_when_any_done=False)
        kept = first.clone()
        second = env.rollout(20, break_when_any_done=False)
        assert (first == kept).all() and not _pointers(first) & _pointers(second)
        freed = _pointers(first)
        del first
        assert _pointers(env.rollout(20, break_when_any_done=False)) & freed
        assert env.worker_rollouts.kept  # (the workers recorded them, in the storages they keep)
    assert not env.worker_rollouts.kept  # close() lets the memory go


# ----------------------------------------------------------------- collectors
def _frames():
    return SerialEnv(4, FrameCountingEnv)


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_collector_batches_the_caller_holds_are_never_overwritten(kind, no_leaks):
    if kind == "single":
        collector = Collector(_frames, frames_per_batch=96, total_frames=96 * 5)
    else:
        collector = MultiSyncCollector([FrameCountingEnv] * 2, frames_per_batch=96, total_frames=96 * 5)
    try:
        held, freed = [], set()
        for batch in collector:
            held.append((batch, batch.clone()))
            if len(held) == 3:
                freed |= _pointers(held.pop(0)[0])  # the caller lets go of the oldest batch
        assert all((batch == copy).all() for batch, copy in held)
        assert len({p for batch, _ in held for p in _pointers(batch)}) == 2 * len(held)
        assert freed & {p for batch, _ in held for p in _pointers(batch)}, "a dropped batch's memory is reused"
    finally:
        collector.shutdown()


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_return_same_td_yields_one_tensordict_overwritten_in_place(kind, no_leaks):
    if kind == "single":
        collector = Collector(_frames, frames_per_batch=96, total_frames=96 * 3, return_same_td=True)
    else:
        collector = MultiSyncCollector([FrameCountingEnv] * 2, frames_per_batch=96, total_frames=96 * 3,
                                       return_same_td=True)
    try:
        batches, ids = [], []
        for batch in collector:
            batches.append(batch)
            ids.append(batch.get(("collector", "traj_ids")).clone())
        assert all(batch is batches[0] for batch in batches)
        assert not torch.equal(ids[0], ids[-1]) and torch.equal(batches[0].get(("collector", "traj_ids")), ids[-1])
    finally:
        collector.shutdown()


def test_step_outputs_the_caller_holds_are_never_overwritten():
    env = SerialEnv(16, FrameCountingEnv)  # 16 frames of 21 KB: a step's frame leaves are recycled
    try:
        env.set_seed(0)
        td = env.reset()
        held = []
        for t in range(12):
            td["action"] = env.full_action_spec.rand()["action"]
            stepped, td = env.step_and_maybe_reset(td)
            if t % 3 == 0:
                held.append((stepped, stepped.clone()))
        assert all((kept == copy).all() for kept, copy in held)
        frames = {kept.get(("next", "observation")).data_ptr() for kept, _ in held}
        assert len(frames) == len(held) and env.recycler.kept_bytes > 0
    finally:
        env.close()


# ----------------------------------------------------------------- a ParallelEnv's step outputs: the output slots
def test_output_slots_are_handed_out_again_only_when_nothing_holds_them():
    slots = OutputSlots()
    frames = TensorDict({"next": {"frame": torch.arange(3 * 2 * 5, dtype=torch.uint8).reshape(3, 2, 5)}}, [3, 2])
    slots.hold(frames, ["frame"], ["reward", "frame"], lambda: {"reward": torch.zeros(2, 1)})
    handed = []
    for _ in range(3):
        p = slots.free()
        leaves = slots.leaves(p)
        assert list(leaves) == ["reward", "frame"] and torch.equal(leaves["frame"], frames.get(("next", "frame"))[p])
        handed.append((p, leaves["frame"]))
    assert slots.free() is None and sorted(p for p, _ in handed) == [0, 1, 2]
    kept = {"view": handed[0][1][1:], "array": handed[1][1].numpy()}  # a view, a numpy array: both hold their slot
    del handed[:2], leaves
    assert slots.free() is None
    kept.pop("view")
    assert slots.free() == 0
    kept.clear()
    handed.clear()
    again = []  # nothing holds any slot now: each is handed out once more, then none is free
    for _ in range(3):
        p = slots.free()
        assert p is not None
        again.append(slots.leaves(p))
    assert slots.free() is None


@pytest.mark.parametrize("call", ["step_and_maybe_reset", "step"])
def test_parallel_step_frames_come_uncopied_from_the_workers_and_are_never_overwritten(call, no_leaks):
    # 16 frames of 21 KB a step: the workers copy them into a free output slot, handed out as the step's own
    with ParallelEnv(2, FrameCountingEnv, envs_per_worker=8) as env:
        env.set_seed(0)
        td = env.reset()
        held, view, from_slot = [], None, []
        for t in range(20):
            td["action"] = env.full_action_spec.rand()["action"]
            if call == "step":
                stepped = env.step(td)
                td = stepped.get("next").select("observation").clone()
            else:
                stepped, td = env.step_and_maybe_reset(td)
            assert (stepped.get("next") == env.next_buffer).all()
            frame = stepped.get(("next", "observation"))
            slots = env._out.buffers  # (made once a caller took a step's outputs)
            from_slot.append(slots is not None and frame.data_ptr() in
                             {slots.get(("next", "observation"))[p].data_ptr() for p in range(OUTPUT_SLOTS)})
            assert not frame.is_shared()  # (sent to another process, it is copied there)
            if t % 6 == 0:
                held.append((stepped, stepped.clone()))
            if t == 3:
                view = (frame[2:5], frame[2:5].clone())  # a view keeps its slot as well
        assert all((kept == copy).all() for kept, copy in held)
        assert torch.equal(*view)
        # from the second step on the frames are the slots'; once the caller holds every slot, they are copied
        assert all(from_slot[1:4]) and not all(from_slot), from_slot



def test_a_frame_held_by_a_forked_process_is_never_refilled(no_leaks):
    ctx = torch.multiprocessing.get_context("fork")
    go, answer = ctx.Event(), ctx.SimpleQueue()
    with ParallelEnv(2, FrameCountingEnv, envs_per_worker=8) as env:
        td = env.reset()
        for _ in range(3):
            td["action"] = env.full_action_spec.rand()["action"]
            stepped, td = env.step_and_maybe_reset(td)
        frame = stepped.get(("next", "observation"))
        slots = env._out.buffers.get(("next", "observation"))
        assert frame.data_ptr() in {slots[p].data_ptr() for p in range(OUTPUT_SLOTS)}
        child = ctx.Process(target=compare_when_told, args=(frame, frame.clone(), go, answer))
        child.start()
        del stepped, frame, slots, td  # only the forked process holds the frame now
        td = env.reset()
        for _ in range(3 * OUTPUT_SLOTS):
            td["action"] = env.full_action_spec.rand()["action"]
            _, td = env.step_and_maybe_reset(td)
        go.set()
        assert answer.get() is True, "the forked process saw its frame change"
        child.join(30)


def test_a_worker_replaced_during_a_step_gets_the_output_slots_again(tmp_path, no_leaks):
    factories = [FrameCountingEnv, functools.partial(FrameCrashOnceEnv, str(tmp_path / "crashed"), 4)]
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with ParallelEnv(2, factories, envs_per_worker=8, max_restarts=1) as env:
            td = env.reset()
            for _ in range(10):
                td["action"] = env.full_action_spec.rand()["action"]
                stepped, td = env.step_and_maybe_reset(td)
                assert (stepped.get("next") == env.next_buffer).all()
            assert env.restarts == [0, 1]
            assert env._out.restarts == [0, 1]  # bound again in the new worker


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float32, torch.bfloat16,
                                   torch.complex64])
def test_leaf_copies_are_new_tensors_with_the_values_shapes_dtypes_and_order(dtype):
    """Small leaves (copied through numpy where their dtype has a twin), big ones (recycled) and the others
    (cloned) come back as fresh tensors: writing the source afterwards leaves the copies as they were."""
    source = TensorDict({"small": torch.arange(12).reshape(4, 3).to(dtype), "scalar": torch.ones(4, dtype=dtype),
                         "big": torch.arange(4 * 70_000).reshape(4, -1).to(torch.float32)}, [4])
    recycler = Recycler()
    expected = source.clone()
    copies = leaf_copier(source, recycler)()
    assert list(copies) == list(source.keys())
    source.apply_(lambda leaf: leaf.zero_())
    for key, leaf in copies.items():
        assert leaf.dtype == expected[key].dtype and leaf.shape == expected[key].shape
        assert torch.equal(leaf, expected[key]), key
    assert recycler.kept_bytes > 0  # the big leaf came from recycled memory


def test_nested_copies_are_new_tensordicts_of_new_tensors_built_as_clone_builds_them():
    """Outputs with nested plain TensorDicts (one per agent group) are copied level by level: the same keys in the
    same order, batch sizes and device as ``clone()`` gives, fresh leaves (big ones recycled) that keep their values
    when the source is written afterwards."""
    source = TensorDict({"done": torch.zeros(4, 1, dtype=torch.bool),
                         "agents": TensorDict({"observation": torch.arange(4 * 3 * 5.0).reshape(4, 3, 5),
                                               "frames": torch.ones(4, 3, 30_000),
                                               "inner": TensorDict({"flag": torch.ones(4, 3, dtype=torch.bool)},
                                                                   [4, 3])}, [4, 3]),
                         "reward": torch.ones(4, 1)}, [4])
    recycler = Recycler()
    copy = copier(source, recycler)
    assert copy != source.clone  # (not the generic clone)
    expected = source.clone()
    got = copy()
    source.apply_(lambda leaf: leaf.zero_())
    assert list(got.keys(True)) == list(expected.keys(True))
    for key, value in expected.items(True):
        mine = got.get(key)
        if isinstance(value, torch.Tensor):
            assert torch.equal(mine, value) and mine.dtype == value.dtype, key
        else:
            assert type(mine) is TensorDict and mine.batch_size == value.batch_size and mine.device == value.device
    assert got.batch_size == expected.batch_size and not got.is_locked
    assert recycler.kept_bytes > 0  # the big leaf came from recycled memory


def test_big_fresh_buffers_are_mapped_and_prefaulted_without_changing_a_byte():
    import mmap
    import threading

    from tdcollect.envs.engine.recycle import MAPPED_BYTES, _fresh

    def mapped(array) -> bool:
        return isinstance(array.base, memoryview) and isinstance(array.base.obj, mmap.mmap)

    assert not mapped(_fresh(MAPPED_BYTES - 1))
    big = _fresh(16 << 20)
    assert mapped(big) and big.flags.writeable
    # written while the background thread faults the pages in: every byte written stays
    pattern = np.arange(big.nbytes // 8, dtype=np.int64)
    big.view(np.int64)[:] = pattern
    for thread in threading.enumerate():
        if thread.name == "tdcollect-prefault":
            thread.join(10)
    assert (big.view(np.int64) == pattern).all()
