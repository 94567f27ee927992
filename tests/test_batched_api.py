"""The EnvBase behaviour shared by SerialEnv and ParallelEnv."""
import functools
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import GymEnv
from torchrl.envs.utils import check_env_specs

from tdcollect.envs import ParallelEnv, SerialEnv, env_index
from tdcollect.envs.engine.group import EnvGroup, seed_chain
from tdcollect.envs.engine.protocol import STEP
from tdcollect.envs.engine.shared import allocate_buffers
from tdcollect.envs.libs import registered
from tests.faces import batched
from tests.helpers import CountingEnv, FrameCountingEnv, RichSpacesEnv, cartpole

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["serial", "parallel"])
def kind(request):
    return request.param


def test_batch_size_specs_and_check_env_specs(kind, no_leaks):
    with batched(kind, 2, cartpole, envs_per_worker=3) as env:
        assert env.batch_size == (6,)
        assert env.observation_spec["observation"].shape == (6, 4)
        assert env.action_spec.shape == (6,)
        assert env.reward_spec.shape == (6, 1) and env.reward_spec.dtype == torch.float32
        for key in ("done", "terminated", "truncated"):
            assert env.full_done_spec[key].shape == (6, 1) and env.full_done_spec[key].dtype == torch.bool
        check_env_specs(env, break_when_any_done="both")


def test_rollout_shape_and_keys(kind, no_leaks):
    with batched(kind, 2, cartpole, envs_per_worker=2) as env:
        env.set_seed(0)
        td = env.rollout(30, break_when_any_done=False)
        assert td.batch_size == (4, 30)
        keys = set(td.keys(True, True))
        for key in ["observation", "action", "done", "terminated", "truncated", ("next", "observation"),
                    ("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated")]:
            assert key in keys
        assert td["next", "reward"].shape == (4, 30, 1)
        assert env.observation_spec["observation"].is_in(td["next", "observation"][:, -1])


def test_rollout_stops_at_first_done(kind, no_leaks):
    with batched(kind, 2, functools.partial(CountingEnv, episode_len=4)) as env:
        td = env.rollout(50)
        assert td.batch_size == (2, 4)
        assert td["next", "done"][:, -1].all() and not td["next", "done"][:, :-1].any()


def test_auto_reset_semantics_of_step_and_maybe_reset(kind, no_leaks):
    with batched(kind, 1, functools.partial(CountingEnv, episode_len=2), envs_per_worker=2) as env:
        td = env.reset()
        td["action"] = torch.tensor([1, 2])
        td, root = env.step_and_maybe_reset(td)
        assert td["next", "observation"][:, 0].tolist() == [1, 1] and not td["next", "done"].any()
        assert root["observation"][:, 0].tolist() == [1, 1]
        root["action"] = torch.tensor([2, 0])
        td, root = env.step_and_maybe_reset(root)
        # "next" holds the terminal observation, the returned root the reset one
        assert td["next", "observation"][:, 0].tolist() == [2, 2]
        assert td["next", "observation"][:, 1].tolist() == [2, 0]
        assert td["next", "terminated"].all() and td["next", "done"].all()
        assert root["observation"][:, 0].tolist() == [0, 0] and not root["done"].any()
        assert td["next", "reward"].squeeze(-1).tolist() == [2.0, 0.0]


def test_step_then_partial_reset_does_not_reset_twice(kind, no_leaks):
    with batched(kind, 2, functools.partial(CountingEnv, episode_len=1), envs_per_worker=1) as env:
        env.set_seed(5)
        td = env.reset()
        assert td["observation"][:, 2].tolist() == as_float32(seed_chain(5, 2))
        td["action"] = torch.tensor([1, 1])
        out = env.step(td)
        assert out["next", "done"].all()
        reset_td = env.reset(TensorDict({"_reset": out["next", "done"].clone()}, [2]))
        assert reset_td["observation"][:, 0].tolist() == [0, 0]
        # the reset came from the auto-reset: no seed pending any more, and the envs were reset once
        full = env.reset()
        assert full["observation"][:, 2].tolist() == [-1, -1]


def as_float32(values) -> list[float]:
    """What a float32 observation holds of each (large) int."""
    return [float(np.float32(v)) for v in values]


def test_set_seed_follows_torchrl_seed_chain(kind, no_leaks):
    """As TorchRL's batched envs: env 0 gets the seed, each next env the seed its predecessor returned
    (``seed_generator``), or the same seed with ``static_seed``; set_seed returns the seed after the last env."""
    with batched(kind, 2, CountingEnv, envs_per_worker=2) as env:
        chain = seed_chain(10, 5)
        assert env.set_seed(10) == chain[4]
        assert env.reset()["observation"][:, 2].tolist() == as_float32(chain[:4])
        assert env.set_seed(10, static_seed=True) == 10
        assert env.reset()["observation"][:, 2].tolist() == [10.0] * 4


def test_same_seed_same_data(kind, no_leaks):
    runs = []
    for _ in range(2):
        with batched(kind, 2, cartpole, envs_per_worker=2) as env:
            env.set_seed(3)
            torch.manual_seed(0)
            runs.append(env.rollout(40, break_when_any_done=False))
    assert torch.equal(runs[0]["next", "observation"], runs[1]["next", "observation"])


def test_parallel_equals_serial_bit_for_bit(no_leaks):
    with ParallelEnv(2, cartpole, envs_per_worker=2) as par, SerialEnv(4, cartpole) as ser:
        out = []
        for env in (par, ser):
            env.set_seed(7)
            torch.manual_seed(123)
            out.append(env.rollout(120, break_when_any_done=False))
        assert (out[0] == out[1]).all()
        assert out[0]["next", "done"].any(), "the rollout should cross episode ends"


@pytest.mark.parametrize("factory", [cartpole, RichSpacesEnv, FrameCountingEnv])
def test_random_rollout_equals_stepping_its_actions(kind, factory, no_leaks):
    """The lean random rollout stores exactly what stepping its actions one by one returns (vector, nested
    and image-sized leaves; across episode ends)."""
    with batched(kind, 2, factory, envs_per_worker=2) as env:
        env.set_seed(5)
        fast = env.rollout(30, break_when_any_done=False)
        env.set_seed(5)
        root, steps = env.reset(), []
        for t in range(30):
            root.update(fast[:, t].select(*env.action_keys))
            stepped, root = env.step_and_maybe_reset(root)
            steps.append(stepped)
        replay = torch.stack(steps, dim=1).select(*fast.keys(True, True))
        assert fast["next", "done"].any(), "the rollout should cross episode ends"
        assert set(replay.keys(True, True)) == set(fast.keys(True, True))
        assert (replay == fast).all()


@pytest.mark.parametrize("factory", [cartpole, functools.partial(gym.make, "Pendulum-v1", max_episode_steps=15),
                                     FrameCountingEnv])
def test_block_stepping_writes_what_one_by_one_stepping_writes(factory):
    """Gym envs with a Box observation are stepped as a block; the buffers must hold the same data as when
    each env is stepped on its own (across episode ends, continuous and discrete actions)."""
    groups, buffers = [], []
    for block in (True, False):
        group = EnvGroup([factory] * 3, "test", registered())
        buffer = allocate_buffers(group.specs, 3, shared=False)
        group.bind(buffer)
        assert group._block is not None
        if not block:
            group._block = None
        group.set_seed(1)
        group.reset()
        groups.append(group)
        buffers.append(buffer)
    action_spec = groups[0].specs.action.expand(3)
    torch.manual_seed(0)
    episode_ends = 0
    try:
        for _ in range(40):
            actions = action_spec.rand()
            for group, buffer in zip(groups, buffers):
                buffer["action"].update_(actions)
                group.step()
            assert (buffers[0] == buffers[1]).all()
            episode_ends += int(buffers[0]["next", "done"].sum())
        assert episode_ends > 0, "the steps should cross episode ends"
    finally:
        for group in groups:
            group.close()


def test_spinning_and_blocking_waits_give_the_same_data(no_leaks):
    """spin_s changes how the processes wait for each other, never what they compute."""
    out = []
    for spin_s in (0.0, 0.002):
        with ParallelEnv(2, cartpole, envs_per_worker=2, spin_s=spin_s) as env:
            assert env._pool.spin_s == spin_s
            env.set_seed(11)
            torch.manual_seed(4)
            out.append(env.rollout(60, break_when_any_done=False))
    assert (out[0] == out[1]).all()


def test_the_wait_changes_on_a_running_env(no_leaks):
    """``env.spin_s = x`` reaches the running workers (it is written into the shared-memory value each worker reads
    before every wait: ``protocol.WorkerChannel.serve``), is kept across a restart, and a bad value is refused and
    changes nothing. (What the value does to a wait: the ``Wait`` tests below, with a recording semaphore.)"""
    from tdcollect.envs.engine.protocol import REPLACING_COMMANDS

    def what_the_workers_read(env) -> float:
        spin = env._pool._handoff.spin_tensor
        assert spin.is_shared(), "the workers read the value from shared memory"
        return float(spin[0])

    with ParallelEnv(2, cartpole, spin_s=0.0) as env:
        env.spin_s = 0.4
        assert env.spin_s == 0.4 and what_the_workers_read(env) == pytest.approx(0.4)
        env.rand_step(env.reset())
        env.spin_s = 0.0
        assert what_the_workers_read(env) == 0.0
        with pytest.raises(ValueError, match="spin_s must be"):
            env.spin_s = -1
        assert env.spin_s == 0.0 and what_the_workers_read(env) == 0.0
        env.spin_s = 0.3  # (long enough that no worker blocks between the commands below, however loaded the machine)
        env.close()
        td = env.reset()
        for _ in range(REPLACING_COMMANDS):  # (fresh workers blocked for their first command: they are re-placed)
            td = env.rand_step(td)
        assert not env._pool._handoff.replacing
        assert env.spin_s == 0.3 and what_the_workers_read(env) == pytest.approx(0.3)


def test_after_a_pause_the_workers_are_re_placed_by_blocking_hand_offs(no_leaks):
    """Workers that waited long enough to block for their next command say so (``blocked[1 + w]`` in shared memory);
    the next ``REPLACING_COMMANDS`` synchronous commands are then handed off by blocking on both sides (the wait the
    workers read is 0, so that the scheduler places each wake-up afresh), and the last of them turns polling back on.
    Without a pause, nothing changes; ``env.spin_s`` reports the chosen wait throughout."""
    from tdcollect.envs.engine.protocol import REPLACING_COMMANDS

    spin_s = 0.2  # (long: the steps of this test never pause that long, however loaded the machine)

    def steps(env, td, n) -> tuple[list, object]:
        read = []
        for _ in range(n):
            _, td = env.step_and_maybe_reset(env.rand_action(td))
            read.append(float(env._pool._handoff.spin[0]))
            assert env.spin_s == spin_s
        return read, td

    with ParallelEnv(2, cartpole, spin_s=spin_s) as env:
        blocked = env._pool._handoff.blocked
        read, td = steps(env, env.reset(), 5)
        assert read == [spin_s] * 5, "no pause: both sides poll"
        deadline = time.monotonic() + 30
        while not blocked[1:].all() and time.monotonic() < deadline:
            time.sleep(0.05)  # (a pause: each worker polls spin_s for its command, then blocks and says so)
        assert blocked[1:].tolist() == [1, 1]
        read, td = steps(env, td, REPLACING_COMMANDS + 3)
        assert read == [0.0] * (REPLACING_COMMANDS - 1) + [spin_s] * 4
        assert not blocked[1:].any(), "polling again once re-placed"


class RecordingSemaphore:
    """Stands for a semaphore: records each ``acquire`` (``False`` for a poll, else the timeout) and is acquired at
    the call numbered ``acquired_at``."""

    def __init__(self, acquired_at: int):
        self.calls, self.acquired_at = [], acquired_at

    def acquire(self, block=True, timeout=None):
        self.calls.append(timeout if block else False)
        return len(self.calls) > self.acquired_at


def test_a_wait_sleeps_through_what_its_recent_waits_say_is_sure_to_pass(monkeypatch):
    """protocol.Wait: with no history it polls at once; after waits of ~50 ms it first sleeps until the margin before
    the shortest of them (``time.sleep``: never a timed semaphore wait), then polls; a wait found over right after its
    sleep is remembered as ending when the sleep began; with spin_s = 0 it leaves the blocking to its caller at once;
    every acquired wait is remembered."""
    import time as real_time
    import types

    from tdcollect.envs.engine import protocol
    from tdcollect.envs.engine.protocol import RECENT_WAITS, WAKE_MARGIN_S, Wait

    sleeps = []  # each sleep asked for; the clock moves on by it, as after a real one

    def sleep(seconds):
        sleeps.append(seconds)

    def clock():
        return real_time.perf_counter() + sum(sleeps)

    monkeypatch.setattr(protocol, "time", types.SimpleNamespace(perf_counter=clock, sleep=sleep))
    wait = Wait()
    fresh = RecordingSemaphore(acquired_at=1)
    assert wait.settle(fresh, spin_s=0.01)
    assert fresh.calls[:2] == [False, False] and sleeps == []  # polled: nothing known of this wait yet
    assert len(wait.recent) == 1

    wait.recent = [0.08, 0.05, 0.07]
    wait.start()
    learned = RecordingSemaphore(acquired_at=0)
    assert wait.settle(learned, spin_s=0.01)
    assert len(sleeps) == 1 and 0.05 - WAKE_MARGIN_S - 0.01 < sleeps[0] <= 0.05 - WAKE_MARGIN_S
    assert learned.calls == [False]  # no timed acquire: one poll after the sleep, and it was there
    assert len(wait.recent) == 4 and wait.recent[-1] < 0.01  # remembered as over when the sleep began

    wait.recent = [0.05]
    wait.start()
    not_yet = RecordingSemaphore(acquired_at=3)  # the check after the sleep and two polls find nothing
    assert wait.settle(not_yet, spin_s=10.0)
    assert not_yet.calls == [False, False, False, False] and len(sleeps) == 2

    blocking = RecordingSemaphore(acquired_at=5)
    assert not wait.settle(blocking, spin_s=0.0)
    assert blocking.calls == [] and len(sleeps) == 2  # spin_s = 0: the caller blocks at once
    assert len(wait.recent) <= RECENT_WAITS


def test_spinning_is_automatic_up_to_two_workers_per_core(monkeypatch):
    from tdcollect.envs.engine import platform_policy as pool

    monkeypatch.setattr(pool, "usable_cores", lambda: 4)
    assert pool.default_spin_s(1) == pool.default_spin_s(8) == pool.SPIN_S
    assert pool.default_spin_s(9) == 0.0
    assert pool.resolve_spin_s(None, 8) == pool.SPIN_S and pool.resolve_spin_s(0, 3) == 0.0
    assert pool.resolve_spin_s(None, 9) == 0.0 and pool.resolve_spin_s(0.002, 9) == 0.002


def test_policy_rollout_matches_random_rollout_structure(kind, no_leaks):
    def policy(td):
        return td.set("action", (td["observation"][:, 2] > 0).long())

    with batched(kind, 2, cartpole, envs_per_worker=2) as env:
        td = env.rollout(25, policy, break_when_any_done=False)
        assert td.batch_size == (4, 25)
        assert torch.equal(td["action"], (td["observation"][..., 2] > 0).long())


def test_list_of_factories_and_kwargs(kind, no_leaks):
    factories = [functools.partial(CountingEnv, episode_len=3), functools.partial(CountingEnv, episode_len=5)]
    with batched(kind, 2, factories, create_env_kwargs=[{"n_actions": 3}, {"n_actions": 3}]) as env:
        td = env.rollout(10, break_when_any_done=False)
        first_done = td["next", "done"].squeeze(-1).float().argmax(-1).tolist()
        assert first_done == [2, 4]


def test_torchrl_env_factory(kind, no_leaks):
    with batched(kind, 2, lambda: GymEnv("CartPole-v1")) as env:
        check_env_specs(env)
        td = env.rollout(20, break_when_any_done=False)
        assert td.batch_size == (2, 20)
        assert td["action"].shape == (2, 20, 2)  # GymEnv's one-hot actions


def test_rich_spaces_become_nested_keys(kind, no_leaks):
    with batched(kind, 2, RichSpacesEnv) as env:
        keys = set(env.full_observation_spec.keys(True, True))
        assert keys == {"pos", "mode", ("extra", "0"), ("extra", "1")}
        assert set(env.full_action_spec.keys(True, True)) == {("action", "move"), ("action", "jump")}
        check_env_specs(env)
        td = env.rollout(6, break_when_any_done=False)
        assert ((td["mode"] >= 0) & (td["mode"] <= 2)).all()  # Discrete(3, start=1) shifted to 0..2
        assert td["next", "truncated"][:, 3].all()


def test_public_step_does_not_alias_buffers(kind, no_leaks):
    with batched(kind, 1, CountingEnv, envs_per_worker=2) as env:
        td = env.reset()
        td["action"] = torch.tensor([1, 1])
        first = env.step(td)["next", "observation"].clone()
        td2 = env.reset()
        td2["action"] = torch.tensor([2, 2])
        out1 = env.step(td)
        env.step(td2)
        assert torch.equal(out1["next", "observation"][:, 1], torch.tensor([1.0, 1.0]))
        assert torch.equal(first[:, 0], torch.tensor([1.0, 1.0]))


def test_step_gives_what_torchrl_s_generic_step_gives(kind, no_leaks):
    """step()'s common case skips EnvBase.step's generic processing: the same keys, values and dtypes as through
    it, over an episode end, and never views of the buffers."""
    from torchrl.envs import EnvBase

    runs = []
    with batched(kind, 1, functools.partial(CountingEnv, episode_len=2), envs_per_worker=2) as env:
        for step in (env.step, functools.partial(EnvBase.step, env)):
            env.set_seed(3)
            td, steps = env.reset(), []
            for action in ([1, 2], [2, 0]):
                out = step(td.set("action", torch.tensor(action)))
                steps.append(out.clone())
                td = out["next"].exclude("reward").clone()
            runs.append(steps)
            buffer = env.next_buffer["observation"]
            assert out["next", "observation"].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    for ours, torchrl in zip(*runs):
        assert set(ours.keys(True, True)) == set(torchrl.keys(True, True))
        assert all(ours[key].dtype == torchrl[key].dtype for key in ours.keys(True, True))
        assert (ours == torchrl).all()
    assert runs[0][1]["next", "done"].all(), "the second step ends the episodes"


def test_the_next_root_shares_the_steps_entries_unless_an_env_ended(kind, no_leaks):
    """After a step where no env ended, the next root's observation and flags are the step's "next" tensors (as
    TorchRL's step_mdp shares them: one copy of a frame, not two), never views of the buffers; where an env ended,
    the root has its own reset observation."""
    with batched(kind, 1, functools.partial(CountingEnv, episode_len=2), envs_per_worker=2) as env:
        td = env.reset()
        td["action"] = torch.tensor([1, 2])
        td, root = env.step_and_maybe_reset(td)
        for key in ("observation", "done", "terminated", "truncated"):
            assert root[key] is td["next", key]
        kept = root["observation"].clone()
        root["action"] = torch.tensor([0, 0])
        td2, root2 = env.step_and_maybe_reset(root)
        assert torch.equal(root["observation"], kept) and torch.equal(td["next", "observation"], kept)
        assert td2["next", "done"].all()
        assert root2["observation"].data_ptr() != td2["next", "observation"].data_ptr()
        assert root2["observation"][:, 0].tolist() == [0, 0] and td2["next", "observation"][:, 0].tolist() == [2, 2]


def test_close_is_idempotent_and_the_next_use_restarts(kind, no_leaks):
    """TorchRL's semantics: a closed batched env starts again at its next reset / step / rollout."""
    env = batched(kind, 2, CountingEnv)
    first_pids = getattr(env, "worker_pids", None)
    env.rollout(3)
    env.close()
    env.close()
    assert env.is_closed
    assert getattr(env, "worker_pids", []) == [] or kind == "serial"
    td = env.reset()  # starts again: fresh envs (counting from 0)
    assert not env.is_closed
    assert td["observation"][:, 0].tolist() == [0.0, 0.0]
    rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["next", "observation"][:, :, 0].tolist() == [[1.0, 2.0, 3.0]] * 2
    if first_pids is not None:
        assert len(env.worker_pids) == 2 and not set(env.worker_pids) & set(first_pids)
    env.close()
    env.start()
    assert not env.is_closed
    env.start()  # a no-op while open
    env.close()


def test_gym_make_with_kwargs(kind, no_leaks):
    with batched(kind, 2, gym.make, create_env_kwargs={"id": "CartPole-v1", "max_episode_steps": 3}) as env:
        td = env.rollout(10, break_when_any_done=False)
        assert td["next", "truncated"][:, 2].all()


def test_module_machinery_works_on_the_env(kind, no_leaks):
    """EnvBase is an nn.Module: the step buffers must not take the place of the Module's own ``_buffers``."""
    with batched(kind, 2, cartpole) as env:
        assert isinstance(dict(env.named_buffers()), dict)
        env.state_dict()
        assert env.to("cpu") is env
        assert env.rollout(2).batch_size == (2, 2)


def test_actions_that_require_grad_tie_no_graph_to_the_buffers(kind, no_leaks):
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    with batched(kind, 2, ContinuousActionVecMockEnv) as env:
        weight = torch.ones((), requires_grad=True)  # as a policy's output outside torch.no_grad()
        td = env.reset()
        td["action"] = env.action_spec.rand() * weight
        env.step(td)
        env.reset()  # it raised "Autograd not support dtype: Bool" when the buffers held the graph
        buffers = [*env.root_buffer.values(True, True), *env.next_buffer.values(True, True)]
        assert not any(leaf.requires_grad for leaf in buffers)
        assert env.rollout(3).batch_size == (2, 3)


@pytest.mark.parametrize("device", [None, "cpu"])  # "cpu": the tensordicts TorchRL's Collector passes
def test_the_common_step_gives_what_the_general_path_gives(kind, device, no_leaks):
    """step_and_maybe_reset's and step's common path (``_common_step``) against the general one (the same env with
    the common path turned off): the same values, keys, dtypes, devices and sharing, over episode ends, with a
    policy's output carried to the next root; inputs it does not take (dim names, a lock) go the general way."""
    def run(env, common: bool) -> list:
        env.set_seed(5)
        taken = []
        if not common:
            env._common_step = lambda tensordict, keep_resets: False
        else:
            step = env._common_step
            env._common_step = lambda tensordict, keep_resets: taken.append(step(tensordict, keep_resets)) or taken[-1]
        root, outs, gen = env.reset(), [], torch.Generator().manual_seed(0)
        root = root if device is None else root.to(device)
        for t in range(40):
            root["action"] = torch.randint(0, 2, (4,), generator=gen)
            root["policy_out"] = torch.full((4, 2), float(t))
            td, root = env.step_and_maybe_reset(root)
            shared = [root[key] is td["next", key] for key in ("observation", "done", "terminated", "truncated")]
            shared.extend([td.device, td["next"].device, root.device])
            outs.append((td.clone(), root.clone(), shared))
        step = env.step(root.set("action", torch.tensor([1, 0, 1, 0])))
        del env._common_step
        return outs + [(step, step, [])], taken

    with batched(kind, 2, cartpole, envs_per_worker=2) as env:
        (ours, taken), (general, _) = run(env, True), run(env, False)
    assert taken and all(taken), "the common path was taken"
    assert any(td["next", "done"].any() for td, _, _ in ours), "some episodes ended"
    for (td, root, shared), (td_ref, root_ref, shared_ref) in zip(ours, general):
        for got, want in ((td, td_ref), (root, root_ref)):
            assert set(got.keys(True, True)) == set(want.keys(True, True))
            assert all(got[key].dtype == want[key].dtype for key in want.keys(True, True))
            assert (got == want).all()
        assert shared == shared_ref

    with batched(kind, 1, cartpole, envs_per_worker=2) as env:
        root = env.reset()
        root["action"] = torch.tensor([0, 1])
        root.names = ["env"]
        assert not env._common_step(root, True)
        td, _ = env.step_and_maybe_reset(root)
        assert td["next"].names == ["env"]
        root = env.reset().set("action", torch.tensor([0, 1])).lock_()
        assert not env._common_step(root, True)
        with pytest.raises(RuntimeError, match="locked"):
            env.step_and_maybe_reset(root)


def test_plain_tensordict_is_the_tensordict_new_unsafe_builds():
    """The common step's outputs are built by setting a TensorDict's state at once: the same state as
    ``TensorDict._new_unsafe`` gives, and a TensorDict that works as any other (set, index, lock, names)."""
    from tdcollect.envs.inputs import plain_tensordict

    leaves = {"a": torch.arange(3.0), "b": torch.zeros(3, 2, dtype=torch.bool)}
    td = plain_tensordict(dict(leaves), torch.Size([3]))
    assert td.__dict__ == TensorDict._new_unsafe(dict(leaves), batch_size=torch.Size([3])).__dict__
    assert type(td) is TensorDict and td.batch_size == (3,) and td.device is None and not td.is_locked
    td.set("c", torch.ones(3))
    with pytest.raises(RuntimeError):
        td.set("d", torch.ones(4))  # the batch size is checked as usual
    assert torch.equal(td[1:]["a"], torch.tensor([1.0, 2.0]))
    td.names = ["env"]
    assert td.names == ["env"] and td.lock_().is_locked


class PostingCartPole(gym.Wrapper):
    """CartPole that posts ``{"steps": n}`` on every ``every``-th step and ``{"reset": seed}`` on each reset."""

    def __init__(self, every: int):
        super().__init__(gym.make("CartPole-v1"))
        self.every, self.steps, self.posts = every, 0, {}

    def take_posts(self) -> dict:
        posts, self.posts = self.posts, {}
        return posts

    def reset(self, *, seed=None, options=None):
        self.posts["reset"] = seed
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps % self.every == 0:
            self.posts["steps"] = self.steps
        return self.env.step(action)


def test_posts_reach_the_main_process_with_the_answers_that_carry_them(no_leaks):
    # env i posts on every (i + 1)-th step: a step where no env of a worker posts gets no answer from it
    fns = [functools.partial(PostingCartPole, i + 1) for i in range(4)]
    with ParallelEnv(2, fns[:2]) as env, ParallelEnv(2, fns[2:]) as quiet:
        env.set_seed(7)
        env.reset()
        posts = env.take_posts()
        assert posts[0] == {"reset": 7} and isinstance(posts[1]["reset"], int) and set(posts) == {0, 1}
        env.reset()  # seeds are used once: later resets continue the envs' RNGs
        assert env.take_posts() == {0: {"reset": None}, 1: {"reset": None}}
        for step in range(1, 7):
            env.rand_step()
            expected = {i: {"steps": step} for i in range(2) if step % (i + 1) == 0}
            assert env.take_posts() == expected  # merged per env, then forgotten
        env.rand_step()
        env.rand_step()  # not taken in between: merged, the later value of a key replacing the earlier one
        assert env.take_posts() == {0: {"steps": 8}, 1: {"steps": 8}}
        quiet.reset()
        quiet.take_posts()
        quiet.rand_step()  # env 0 of quiet posts on every 3rd step, env 1 on every 4th
        assert quiet._pool.run(STEP) is None and quiet.take_posts() == {}  # step 2: nothing posted, no answer
        answers = quiet._pool.run(STEP)  # step 3: worker 0 answers, worker 1 does not
        assert answers == [(None, [(0, {"steps": 3})]), None]


class IndexedCartPole(gym.Wrapper):
    """CartPole that keeps the index ``env_index()`` gave its constructor."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.built_as = env_index()


def test_a_constructor_knows_which_env_it_builds(kind, no_leaks):
    assert env_index() is None
    with batched(kind, 2, IndexedCartPole, envs_per_worker=3) as env:
        assert list(env.built_as) == list(range(6))
        env.close()
        env.reset()  # built again
        assert list(env.built_as) == list(range(6))
    assert env_index() is None
