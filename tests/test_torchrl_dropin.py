"""TorchRL behaviours our ParallelEnv keeps, as TorchRL's own batched envs have them: constructor arguments,
forwarding, seeding, partial steps and resets, batched and multi-agent sub-envs, action casts, rollouts."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import GymEnv
from torchrl.envs import SerialEnv as TorchRLSerialEnv

from tdcollect.envs import ArgumentError, ParallelEnv, SerialEnv, SpecMismatchError
from tdcollect.envs.batched import BatchedEnv
from tests.conftest import live_children
from tests.torchrl_envs import TextEnv, TorchCountingEnv

pytestmark = pytest.mark.timeout(120)


def action_of(env, value: int) -> TensorDict:
    td = env.full_action_spec.zero()
    td["action"] = torch.full_like(td["action"], value)
    return td


# ----------------------------------------------------------------- construction
@pytest.mark.parametrize("arg", ["create_env_fn", "create_env_kwargs"])
def test_length_mismatch_is_torchrl_runtime_error(arg):
    make = TorchCountingEnv
    kwargs = dict(create_env_fn=[make, make]) if arg == "create_env_fn" else dict(
        create_env_fn=make, create_env_kwargs=[{}, {}])
    with pytest.raises(RuntimeError, match=rf"len\({arg}\) and num_workers mismatch"):
        ParallelEnv(4, **kwargs)


def test_construction_errors_are_runtime_errors_too():
    assert issubclass(SpecMismatchError, RuntimeError) and issubclass(SpecMismatchError, ValueError)
    with pytest.raises(RuntimeError, match="envs_per_worker"):
        ParallelEnv(1, TorchCountingEnv, envs_per_worker=0)
    with pytest.raises(ArgumentError, match="unexpected keyword arguments"):
        ParallelEnv(1, TorchCountingEnv, no_such_option=1)
    with pytest.raises(ArgumentError, match="device='no_such_device' cannot be used in this process"):
        ParallelEnv(1, TorchCountingEnv, device="no_such_device")
    if not torch.cuda.is_available():
        with pytest.raises(ArgumentError, match="device=device\\(type='cuda'\\) cannot be used in this process"):
            ParallelEnv(1, TorchCountingEnv, device="cuda")


def test_torchrl_arguments_keep_their_meaning(no_leaks):
    with ParallelEnv(2, TorchCountingEnv, use_buffers=True, shared_memory=True, pin_memory=False,
                     non_blocking=False, consolidate=True, daemon=True, num_sub_threads=2, num_threads=1,
                     shutdown_timeout=1.0, device="cpu") as env:
        assert all(proc.daemon for proc in env._pool.procs)
        assert list(env.threads_at_construction) == [2, 2]  # built after the worker took num_sub_threads
        assert torch.get_num_threads() == 1
        assert env.rollout(3).shape == (2, 3)


def test_main_threads_are_given_back_at_close(no_leaks):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        env = ParallelEnv(3, TorchCountingEnv)
        assert torch.get_num_threads() == 1  # max(1, 4 - 3), as TorchRL's default
        env.close()
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("base, during, a_closed", [(8, 3, 5), (2, 1, 1)])
def test_main_threads_count_every_env_running_whatever_order_they_close(base, during, a_closed, no_leaks):
    """Two envs (2 and 3 workers): this process runs ``max(1, base - workers running)`` threads, also when the
    first one closes first (a count clamped at 1 must not hand back threads it never took), and ``base`` after."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(base)
        a = ParallelEnv(2, TorchCountingEnv)
        b = ParallelEnv(3, TorchCountingEnv)
        assert torch.get_num_threads() == during
        a.close()
        assert torch.get_num_threads() == a_closed
        b.close()
        assert torch.get_num_threads() == base
    finally:
        torch.set_num_threads(before)


def test_serial_for_single_builds_no_process(no_leaks):
    env = ParallelEnv(1, TorchCountingEnv, serial_for_single=True)
    try:
        assert isinstance(env, SerialEnv) and not live_children()
        assert env.rollout(2).shape == (1, 2)
    finally:
        env.close()
    with ParallelEnv(2, TorchCountingEnv, serial_for_single=True) as env:
        assert isinstance(env, ParallelEnv)


def test_update_kwargs(no_leaks):
    with ParallelEnv(2, TorchCountingEnv) as env:
        env.update_kwargs([{"seed_offset": 10.0}, {"seed_offset": 20.0}])  # not used yet: applies at once
        assert env.reset()["observation"].squeeze(-1).tolist() == [10.0, 20.0]
        env.update_kwargs({"seed_offset": 1.0})  # used: applies at the next start
        assert env.reset()["observation"].squeeze(-1).tolist() == [10.0, 20.0]
        env.close()
        assert env.reset()["observation"].squeeze(-1).tolist() == [1.0, 1.0]
        with pytest.raises(RuntimeError, match=r"len\(kwargs\) and num_workers mismatch"):
            env.update_kwargs([{"seed_offset": 1.0}])


def test_failed_construction_leaves_no_worker(monkeypatch, no_leaks):
    """A ParallelEnv whose construction fails after its workers started stops them (the interpreter could not
    exit otherwise)."""
    def broken(self, *args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(BatchedEnv, "__init__", broken)
    with pytest.raises(RuntimeError, match="broken on purpose"):
        ParallelEnv(2, TorchCountingEnv)
    assert not live_children()


# ----------------------------------------------------------------- forwarding, seeding, closing
def test_attribute_and_method_forwarding(no_leaks):
    with ParallelEnv(2, TorchCountingEnv, envs_per_worker=2) as env:
        assert env.custom_fun() == [0, 0, 0, 0]
        assert list(env.custom_attr) == [1, 1, 1, 1]
        assert list(env.custom_prop) == [2, 2, 2, 2]
        assert list(env.nested.value) == [42] * 4
        assert env.nested.get_value() == [42] * 4
        assert env.max_steps[3] == 5 and len(env.max_steps) == 4
        assert not hasattr(env, "no_such_attribute")
        assert list(env._private_count) == [7] * 4  # private names too, while the env is open
        env.close()
        assert not hasattr(env, "_private_count") and env.is_closed  # and they never restart a closed env


def test_set_seed_equals_torchrl_serial_env(no_leaks):
    """Same seeds, same returned seed and same data as TorchRL's own SerialEnv over the same TorchRL envs."""
    make = functools.partial(GymEnv, "Pendulum-v1")
    ours, theirs = ParallelEnv(3, make), TorchRLSerialEnv(3, make)
    try:
        for static in (False, True):
            outs, seeds = [], []
            for env in (ours, theirs):
                seeds.append(env.set_seed(0, static_seed=static))
                torch.manual_seed(0)
                outs.append(env.rollout(5, auto_reset=True))
            assert seeds[0] == seeds[1]
            assert torch.equal(outs[0]["next", "observation"], outs[1]["next", "observation"])
    finally:
        ours.close()
        theirs.close()


def test_dynamic_specs_are_refused_with_the_fix(no_leaks):
    with pytest.raises(RuntimeError, match=r"dynamic \(a dimension of -1.*use_buffers=False"):
        ParallelEnv(2, functools.partial(TorchCountingEnv, dynamic=True))
    assert not live_children()


def test_close_runs_in_the_worker(tmp_path, no_leaks):
    markers = [str(tmp_path / f"closed-{w}") for w in range(2)]
    env = ParallelEnv(2, TorchCountingEnv, [{"close_marker": m} for m in markers])
    env.close()
    assert all(open(m).read() == "closed" for m in markers)


# ----------------------------------------------------------------- stepping
@pytest.mark.parametrize("make", [TorchCountingEnv, functools.partial(TorchCountingEnv, nested_done=True)],
                         ids=["flat keys", "nested done"])
@pytest.mark.parametrize("ours", [SerialEnv, ParallelEnv])
def test_the_next_root_is_torchrls_actions_included(ours, make):
    """``step_and_maybe_reset``'s next root holds what TorchRL's does: the step's observations and done flags, and
    the input's other entries, its actions too (TorchRL's step_mdp keeps them), never the reward."""
    def next_root(env) -> TensorDict:
        env.set_seed(0)
        td = env.reset()
        td["action"] = torch.ones_like(td.get("action", env.action_spec.zero()))
        td["policy_output"] = torch.arange(float(env.batch_size[0]))
        return env.step_and_maybe_reset(td)[1]

    torchrl_env = TorchRLSerialEnv(2, make)
    try:
        expected = next_root(torchrl_env)
    finally:
        torchrl_env.close()
    with ours(2, make) as env:
        got = next_root(env)
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    assert "action" in got.keys() and "reward" not in got.keys()
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key


def test_step_before_reset(no_leaks):
    with ParallelEnv(2, TorchCountingEnv) as env:
        out = env.step(TensorDict(action_of(env, 1), env.batch_size))
        assert out["next", "observation"].squeeze(-1).tolist() == [1.0, 1.0]


def test_partial_steps(no_leaks):
    """``"_step"`` steps the envs it selects; the others keep their state and get the input's values."""
    with ParallelEnv(4, TorchCountingEnv) as env:
        td = env.reset()
        td.update(action_of(env, 1))
        td["_step"] = torch.tensor([False, True, False, True])
        out = env.step(td.clone())
        assert out["next", "observation"].squeeze(-1).tolist() == [0.0, 1.0, 0.0, 1.0]
        assert out["next", "reward"].squeeze(-1).tolist() == [0.0, 1.0, 0.0, 1.0]
        stepped, root = env.step_and_maybe_reset(td.clone())
        assert stepped["next", "observation"].squeeze(-1).tolist() == [0.0, 2.0, 0.0, 2.0]
        assert "_step" not in root.keys()
        full = env.rand_step(env.reset())
        assert full["next", "observation"].squeeze(-1).tolist() == [1.0] * 4


def test_batched_sub_envs(no_leaks):
    """A factory returning a batched TorchRL env: the batch is [num_envs, *env.batch_size], time last in
    rollouts, and ``_reset`` resets single elements."""
    make = functools.partial(TorchCountingEnv, max_steps=3, batch_size=(3,))
    with ParallelEnv(2, make, envs_per_worker=2) as env:
        assert env.batch_size == (4, 3)
        rollout = env.rollout(5, break_when_any_done=False)
        assert rollout.shape == (4, 3, 5) and rollout.names[-1] == "time"
        assert rollout["next", "observation"][..., 0].tolist() == [[[1.0, 2.0, 3.0, 1.0, 2.0]] * 3] * 4
        td = env.reset()
        td.update(action_of(env, 1))
        td = env.step(td)["next"].exclude("reward")
        td["_reset"] = torch.zeros(4, 3, 1, dtype=torch.bool)
        td["_reset"][1, 2] = True
        after = env.reset(td)
        assert after["observation"][..., 0].tolist() == [[1.0] * 3, [1.0, 1.0, 0.0], [1.0] * 3, [1.0] * 3]
        td = env.step(after.update(action_of(env, 1)))
        assert td["next", "observation"][1, :, 0].tolist() == [2.0, 2.0, 1.0]  # element state kept


def test_nested_only_done_keys(no_leaks):
    make = functools.partial(TorchCountingEnv, max_steps=2, nested_done=True)
    with ParallelEnv(2, make) as env:
        assert "done" not in env.full_done_spec.keys()
        rollout = env.rollout(4, break_when_any_done=False)
        assert rollout["next", "agents", "done"].squeeze(-1).tolist() == [[False, True, False, True]] * 2
        assert env.rollout(4)["next", "observation"].shape[1] == 2  # stops at the first (nested) done


def test_actions_cast_to_the_spec_dtype(no_leaks):
    with ParallelEnv(2, TorchCountingEnv) as env:
        td = env.reset()
        td["action"] = torch.ones(2, 1, dtype=torch.float64)
        assert env.step(td)["next", "last_action"].squeeze(-1).tolist() == [1.0, 1.0]
        td["action"] = torch.full((2, 1), 0.5, dtype=torch.float64)
        with pytest.raises(ValueError, match="non-integral"):
            env.step(td)
        env.check_actions = False
        td["action"] = torch.full((2, 1), 2.7, dtype=torch.float64)
        assert env.step(td)["next", "last_action"].squeeze(-1).tolist() == [2.0, 2.0]  # cast as torch casts


def test_integer_actions_that_would_wrap_are_refused(no_leaks):
    from torchrl.testing.mocking_classes import CountingBatchedEnv  # Binary(1) actions: int8

    with SerialEnv(2, CountingBatchedEnv) as env:
        td = env.reset()
        td["action"] = torch.ones(2, 1, dtype=torch.int64)  # fits int8: cast as TorchRL's envs cast it
        assert env.step(td)["next", "observation"].squeeze(-1).tolist() == [1, 1]
        td["action"] = torch.tensor([[1], [300]])  # 300 would wrap to 44 in int8
        with pytest.raises(ValueError, match=r"'action' has dtype torch.int64 with values that torch.int8 cannot "
                                             r"hold, but the action spec's dtype is torch.int8"):
            env.step(td)
        td["action"] = torch.ones(2, 1, dtype=torch.int64)
        assert env.step(td)["next", "observation"].squeeze(-1).tolist() == [2, 2], "nothing reached the envs"


def test_one_hot_actions_may_be_all_zero(no_leaks):
    with ParallelEnv(2, functools.partial(TorchCountingEnv, one_hot=True), check_actions="raise") as env:
        td = env.reset()
        td["action"] = torch.zeros(2, 4, dtype=env.action_spec.dtype)
        env.step(td)
        td["action"][:, :2] = 1
        with pytest.raises(ValueError, match="one-hot rows of 4"):
            env.step(td)


def test_rollout_from_a_given_state_writes_into_it(no_leaks):
    with ParallelEnv(2, TorchCountingEnv) as env:
        td = env.reset()
        rollout = env.rollout(3, auto_reset=False, tensordict=td)
        assert rollout.names[-1] == "time"
        assert ("next", "observation") in td.keys(True)
        assert torch.equal(td["next", "observation"], rollout[:, 0]["next", "observation"])


def test_outputs_are_the_callers_own_tensors(no_leaks):
    with ParallelEnv(2, TorchCountingEnv) as env:
        first = env.step(env.reset().update(action_of(env, 1)))
        kept = first["next", "observation"].clone()
        env.step(env.reset().update(action_of(env, 1)))
        env.step(first["next"].clone().update(action_of(env, 1)))
        assert torch.equal(first["next", "observation"], kept)


# ----------------------------------------------------------------- non-tensor entries
def test_non_tensor_entries_travel_with_every_step_and_reset(no_leaks):
    makes = [functools.partial(TextEnv, prefix="apple-"), functools.partial(TextEnv, prefix="pear-")]
    with ParallelEnv(2, makes) as env:  # different values per worker: the same specs all the same
        assert env._non_tensor_keys == ["text"]
        assert env.reset()["text"] == ["apple-0", "pear-0"]
        rollout = env.rollout(4, break_when_any_done=False)
        assert [list(row) for row in rollout["next", "text"]] == [["apple-1", "apple-2", "apple-3", "apple-1"],
                                                                  ["pear-1", "pear-2", "pear-3", "pear-1"]]
        td = env.reset()
        for _ in range(2):
            td = env.step_mdp(env.step(td.set("action", torch.zeros(2, 1, dtype=torch.int64))))
        reset = td.select("text").set("_reset", torch.tensor([[True], [False]]))
        assert env.reset(reset)["text"] == ["apple-0", "pear-2"]  # the env not reset keeps its value


def test_large_non_tensor_entries_do_not_deadlock(no_leaks):
    with ParallelEnv(2, functools.partial(TextEnv, blob_bytes=1 << 20)) as env:
        rollout = env.rollout(3)
        assert len(rollout["next", "blob"][0][0]) == 1 << 20


def test_non_tensor_entries_refused_where_they_would_be_lost(no_leaks):
    from tdcollect.envs import AsyncParallelEnv

    with pytest.raises(ArgumentError, match="non-tensor keys"):
        AsyncParallelEnv(2, TextEnv, batch_workers=1)
    assert not live_children()  # (the collectors keep them: tests/test_collectors_stacked.py)


# ----------------------------------------------------------------- indexing
def test_indexing_gives_a_live_view_of_workers(no_leaks):
    with ParallelEnv(4, TorchCountingEnv, envs_per_worker=2) as env:
        env.reset()
        for item, workers in ((2, [2]), (-1, [3]), (slice(1, 3), [1, 2]), (np.array([0, 3]), [0, 3]),
                              (torch.tensor([1, 3]), [1, 3])):
            env.reset()
            view = env[item]
            assert isinstance(view, ParallelEnv) and view.num_workers == len(workers)
            assert view.batch_size == (2 * len(workers),)
            view.step(action_of(view, 1).update(view.reset()))
            expected = [1.0 if i // 2 in workers else 0.0 for i in range(8)]
            assert env.root_buffer["observation"].squeeze(-1).tolist() == expected  # the parent stepped them
            assert view.custom_fun() == [0] * (2 * len(workers))
            view.close()
            assert not env.is_closed
        env.rand_step(env.reset())
        view = env[1:]
        view.close()
        with pytest.raises(RuntimeError, match="closed indexed view"):
            view.reset()
        view = env[:2]
        env.close()
        with pytest.raises(RuntimeError, match="parent environment has been closed"):
            view.reset()
    with ParallelEnv(2, TorchCountingEnv) as env, pytest.raises(NotImplementedError, match="Boolean masks"):
        env[torch.ones(2, dtype=torch.bool)]


def test_a_view_keeps_its_parent_alive(no_leaks):
    env = ParallelEnv(2, TorchCountingEnv)
    env = env[:1]
    assert env.rollout(3).shape == (1, 3)
    env.parent.close()
    with pytest.raises(NotImplementedError, match="snapshot writeback"):
        env.parent[0] = TorchCountingEnv()


def test_rollout_with_a_policy_that_returns_a_new_tensordict(no_leaks):
    def in_place(td):
        return td.set("action", torch.ones(*td.shape, 1, dtype=torch.int64))

    def out_of_place(td):
        return td.empty().set("action", torch.ones(*td.shape, 1, dtype=torch.int64))

    with ParallelEnv(2, TorchCountingEnv) as env:
        runs = []
        for policy in (in_place, out_of_place):
            runs.append(env.rollout(7, policy, break_when_any_done=False))
        assert (runs[0] == runs[1]).all()
