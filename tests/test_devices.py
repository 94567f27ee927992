"""Devices, on any machine (the CUDA runs are in ``test_cuda.py``): a caller's default-device context (``with
torch.device(...)``, ``torch.set_default_device``) does not reach the memory the envs and collectors make for
themselves; outputs for another device are unlocked copies there; ``env.to("cpu")`` keeps the env as it is. The
``"meta"`` device stands for a GPU here: like CUDA memory, it cannot be shared between processes nor read as
numpy, so any internal tensor made on the default device fails."""
import functools

import pytest
import torch
from tensordict import TensorDict

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.recycle import Recycler
from tdcollect.envs.inputs import copier, leaf_copier
from tests.helpers import CountingEnv

pytestmark = pytest.mark.timeout(120)
COUNTING = functools.partial(CountingEnv, episode_len=5)


@pytest.mark.parametrize("cls", [SerialEnv, ParallelEnv])
def test_every_call_under_a_default_device_context(cls, no_leaks):
    with torch.device("meta"):
        env = cls(4, COUNTING)
        try:
            root = env.reset()
            assert root["observation"].device.type == "cpu"
            root["action"] = torch.ones(4, dtype=torch.int64, device="cpu")
            partial = env.step(root.clone().set("_step", torch.tensor([True, False, True, False], device="cpu")))
            assert partial["next", "observation"][:, 0].tolist() == [1, 0, 1, 0]
            _, next_root = env.step_and_maybe_reset(root)
            assert next_root["observation"].device.type == "cpu"
            rollout = env.rollout(6, break_when_any_done=False)
            assert rollout.batch_size == (4, 6) and rollout["observation"].device.type == "cpu"
            env.close()
            env.start()  # a restart makes its buffers on the CPU too
            assert env.reset()["observation"].device.type == "cpu"
        finally:
            env.close()


def test_collector_built_under_a_default_device_context(no_leaks):
    with torch.device("meta"):
        collector = MultiSyncCollector([COUNTING] * 2, None, frames_per_batch=20, total_frames=40)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [b.batch_size for b in batches] == [(2, 10), (2, 10)]
    assert all(b["observation"].device.type == "cpu" for b in batches)


def test_outputs_for_another_device_are_unlocked_copies_there():
    buffers = TensorDict({"a": torch.zeros(4, 3), "nested": {"b": torch.ones(4, 2)}}, [4]).lock_()
    flat = TensorDict({"a": torch.zeros(4, 3)}, [4]).lock_()
    recycler, meta = Recycler(), torch.device("meta")
    for copy in (copier(buffers, recycler, meta), copier(flat, recycler, meta)):
        out = copy()
        assert not out.is_locked and out.device == meta
        assert all(leaf.device == meta for leaf in out.values(True, True))
        out.set("extra", torch.zeros(4, device=meta))  # the caller's to add to
    leaves = leaf_copier(flat, recycler, meta)()
    assert leaves["a"].device == meta and leaves["a"].data_ptr() != flat["a"].data_ptr()


def test_to_the_cpu_keeps_the_env(no_leaks):
    with ParallelEnv(2, COUNTING, device="cpu") as env:
        assert env.to("cpu") is env and env.device == torch.device("cpu") and env._cast is None
        env.set_seed(0)
        first = env.rollout(4, break_when_any_done=False)
        assert first["observation"].data_ptr() != env.root_buffer["observation"].data_ptr()
        env.to("meta")
        assert env.device.type == "meta" and env.observation_spec.device.type == "meta"
        assert env._copy_root()["observation"].device.type == "meta"
        view = env[1:]  # a view of some workers: the parent's device
        assert view.device.type == "meta" and view._copy_root()["observation"].device.type == "meta"
        env.to("cpu")
        assert env._copy_root()["observation"].device.type == "cpu" and env.observation_spec.device.type == "cpu"
