"""Env faults: bad input and worker failures (an exception, a kill, a native crash, a stuck step, a death in the
start-up exchange) are a clear error in the main process, naming the worker and the cause, with nothing left
behind. Restarts: ``test_restarts.py``; collectors: ``test_faults_collectors.py``; exit, threads and close:
``test_lifecycle.py``; kills every half second and soaks: ``test_stress.py``."""
import functools
import gc
import os
import signal
import threading
import time

import gymnasium as gym
import pytest
import torch
from torchrl.envs import GymEnv

from tdcollect.envs import (
    EnvWorkerError,
    ParallelEnv,
    SerialEnv,
    SpecMismatchError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from tests.conftest import live_children, wait_gone
from tests.helpers import CountingEnv, CrashOnceEnv, FaultyEnv, OtherShapeEnv, StuckEnv, SuicidalEnv, cartpole

pytestmark = pytest.mark.timeout(90)

long_counting = functools.partial(CountingEnv, episode_len=100)


@pytest.mark.parametrize("instance", [lambda: gym.make("CartPole-v1"), lambda: GymEnv("CartPole-v1"),
                                      lambda: CountingEnv()])
@pytest.mark.parametrize("cls", [ParallelEnv, SerialEnv])
def test_env_instance_is_a_type_error_that_shows_the_fix(cls, instance, no_leaks):
    env = instance()
    children = len(live_children())
    with pytest.raises(TypeError, match=r"not an env instance.*lambda"):
        cls(2, env)
    assert len(live_children()) == children
    env.close()


def test_non_callable_and_bad_counts(no_leaks):
    with pytest.raises(TypeError, match="callable"):
        ParallelEnv(2, "CartPole-v1")
    with pytest.raises(ValueError, match="num_workers >= 1"):
        ParallelEnv(0, cartpole)
    with pytest.raises(ValueError, match="envs_per_worker >= 1"):
        ParallelEnv(2, cartpole, envs_per_worker=0)
    with pytest.raises(ValueError, match="list of 3 items but num_workers is 2"):
        ParallelEnv(2, [cartpole] * 3)
    with pytest.raises(ValueError, match="mp_start_method"):
        ParallelEnv(2, cartpole, mp_start_method="thread")
    with pytest.raises(ValueError, match="spin_s must be None"):
        ParallelEnv(2, cartpole, spin_s=-1)


def test_factory_that_captures_an_unpicklable_object(no_leaks):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be sent to a worker process"):
        ParallelEnv(2, lambda: (lock, CountingEnv())[1], mp_start_method="spawn")


#: A shutdown wait no healthy worker comes near: a test that took half of it waited for a worker to be killed.
LONG_SHUTDOWN_S = 60.0


@pytest.mark.parametrize("where", ["init", "reset", "step"])
def test_exception_in_worker_names_worker_type_message_and_traceback(where, no_leaks):
    factories = [CountingEnv, functools.partial(FaultyEnv, where)]
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        with ParallelEnv(2, factories, shutdown_timeout=LONG_SHUTDOWN_S) as env:
            env.rollout(10, break_when_any_done=False)
    err = info.value
    # a healthy worker still in its start-up exchange leaves at once: it is never waited for until it is killed
    assert time.monotonic() - start < LONG_SHUTDOWN_S / 2
    assert err.worker == 1 and err.exc_type == "ValueError" and "boom" in err.exc_message
    text = str(err)
    assert "worker 1 raised ValueError" in text and "boom" in text
    assert "helpers.py" in text and "Traceback" in text


def test_env_stays_usable_after_an_exception_in_step(no_leaks):
    with ParallelEnv(2, [CountingEnv, functools.partial(FaultyEnv, "step", at_step=2)]) as env:
        td = env.reset()
        td["action"] = torch.tensor([1, 1])
        env.step(td)
        with pytest.raises(EnvWorkerError, match="boom in step 2"):
            env.step(td)
        assert env.reset()["observation"].shape == (2, 3)


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_worker_killing_itself_is_reported_with_its_exit_code(spin_s, no_leaks):
    """Blocking and spinning waits both notice a dead worker."""
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"worker 1 .*SIGKILL") as info:
        with ParallelEnv(2, [CountingEnv, SuicidalEnv], spin_s=spin_s) as env:
            env.rollout(10, break_when_any_done=False)
    assert time.monotonic() - start < 10
    assert info.value.exitcode == -signal.SIGKILL
    assert env.is_closed


def test_worker_killed_from_outside(no_leaks):
    env = ParallelEnv(3, cartpole)
    os.kill(env.worker_pids[2], signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match="worker 2"):
        env.rollout(5)
    assert env.is_closed and env.worker_pids == []


def test_a_call_to_a_killed_worker_says_it_died(no_leaks):
    """A call (here a forwarded attribute) sent to a worker that is dead: its pipe is broken, and the error names
    the dead worker, as a step's does."""
    env = ParallelEnv(2, cartpole)
    os.kill(env.worker_pids[1], signal.SIGKILL)
    wait_gone([env._pool.procs[1].pid])
    with pytest.raises(WorkerDiedError, match="worker 1"):
        list(env.spec)
    assert env.is_closed


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_killed_worker_leaves_no_half_made_segment(no_leaks):
    """A worker killed while torch shares a tensor leaves its ``/dev/shm/torch_<pid>_...`` file, which no one
    else would ever unlink: the main process removes it when it finds the worker dead."""
    env = ParallelEnv(2, cartpole)
    pid = env.worker_pids[1]
    os.kill(pid, signal.SIGKILL)
    orphan = f"/dev/shm/torch_{pid}_123_4"
    open(orphan, "wb").close()  # what the kill left, as torch names it
    try:
        with pytest.raises(WorkerDiedError, match="worker 1"):
            env.rollout(5)
        assert not os.path.exists(orphan)
    finally:
        if os.path.exists(orphan):
            os.unlink(orphan)


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_stuck_step_times_out(spin_s, no_leaks):
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match="worker 1 did not finish step within 1.5 s"):
        with ParallelEnv(2, [CountingEnv, StuckEnv], timeout=1.5, spin_s=spin_s) as env:
            env.rollout(3)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("cls", [ParallelEnv, SerialEnv])
def test_wrong_action_is_caught_before_sending(cls, no_leaks):
    with cls(2, CountingEnv, check_actions="raise") as env:
        td = env.reset()
        td["action"] = torch.tensor([[1], [1]])
        with pytest.raises(ValueError, match=r"'action' has shape \(2, 1\).*expects shape \(2,\)"):
            env.step(td)
        td["action"] = torch.tensor([1.5, 1.0])  # another dtype is cast (as TorchRL does), unless values change
        with pytest.raises(ValueError, match=r"'action' has dtype torch.float32 with non-integral values.*torch.int64"):
            env.step(td)
        td["action"] = torch.tensor([1, 7])
        with pytest.raises(ValueError, match=r"'action' holds values outside its spec \(integers in \[0, 2\]\)"):
            env.step(td)
        # nothing reached the envs: they still count from 0
        td["action"] = torch.tensor([2, 2])
        assert env.step(td)["next", "observation"][:, 0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("cls", [ParallelEnv, SerialEnv])
def test_actions_outside_the_spec_reach_the_envs_with_a_warning_by_default(cls, no_leaks):
    with cls(2, CountingEnv) as env:  # TorchRL's batched envs send such actions as they are; ours say so
        td = env.reset().set("action", torch.tensor([1, 7]))
        with pytest.warns(UserWarning, match=r"'action' holds values outside its spec \(integers in \[0, 2\]\); "
                                             "they were sent to the envs unchanged"):
            out = env.step(td)
        assert out["next", "observation"][:, 1].tolist() == [1.0, 7.0]  # the action each env observed
        td["action"] = torch.tensor([1.5, 1.0])  # a cast that would change the actions is refused all the same
        with pytest.raises(ValueError, match="non-integral values"):
            env.step(td)


def test_spec_mismatch_between_workers_lists_the_keys(no_leaks):
    with pytest.raises(SpecMismatchError, match=r"worker 1.*observation \(UnboundedContinuous shape=\(3,\)"):
        ParallelEnv(2, [CountingEnv, OtherShapeEnv])


def test_spec_mismatch_inside_serial_env(no_leaks):
    with pytest.raises(SpecMismatchError, match="env 1 has other specs than env 0"):
        SerialEnv(2, [CountingEnv, OtherShapeEnv])


def test_garbage_collected_env_stops_its_workers(no_leaks):
    env = ParallelEnv(2, CountingEnv)
    pids = env.worker_pids
    del env
    gc.collect()
    assert not wait_gone(pids), "the workers of a collected env are still running"


@pytest.mark.parametrize("cls", [ParallelEnv, SerialEnv])
def test_an_action_lacking_only_a_last_dim_of_one_is_given_it(cls, no_leaks):
    """TorchRL's envs take categorical actions ``[n]`` for a ``[n, 1]`` spec: so do ours (a view, no value repeated);
    any other shape is still refused."""
    from torchrl.testing.mocking_classes import CountingEnv as OneDimActionEnv

    with cls(2, OneDimActionEnv) as env:
        assert env.action_spec.shape == (2, 1)
        td = env.reset()
        td["action"] = torch.tensor([1, 0])
        out = env.step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 0]
        td = out["next"].set("action", torch.ones(2, 1, 1, dtype=torch.long))
        with pytest.raises(ValueError, match=r"'action' has shape \(2, 1, 1\)"):
            env.step(td)


@pytest.mark.parametrize("how, signame", [("abort", "SIGABRT"), ("segfault", "SIGSEGV")])
def test_native_crash_in_step_names_worker_and_signal(how, signame, no_leaks):
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker 1 .*died during step.*{signame}"):
        with ParallelEnv(2, [long_counting, functools.partial(CrashOnceEnv, None, how)]) as env:
            env.rollout(10, break_when_any_done=False)
    assert time.monotonic() - start < 10
    assert env.is_closed and env.worker_pids == []


# ----------------------------------------------------------------- start-up
def dies_soon_after_construction(delay: float) -> CountingEnv:
    """Built at once; its process is SIGKILLed ``delay`` s later (in the middle of the start-up exchange)."""
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return CountingEnv()


def slow_to_build(delay: float) -> CountingEnv:
    time.sleep(delay)
    return CountingEnv()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_worker_dying_in_the_start_up_exchange_is_a_worker_died_error_and_pins_nothing(no_leaks):
    factories = [functools.partial(dies_soon_after_construction, 0.3), functools.partial(slow_to_build, 1.0)]
    ParallelEnv(1, CountingEnv).close()  # warm up lazily created helpers
    fds = _open_fds()
    for _ in range(3):
        # worker 0 says hello at once and is dead by the time worker 1 has said hello and its setup is sent
        with pytest.raises(WorkerDiedError, match=r"worker 0 \(pid \d+\) died during start-up"):
            ParallelEnv(2, factories, mp_start_method="fork")
    gc.collect()  # what is left in reference cycles is garbage, not pinned
    assert _open_fds() <= fds + 1, f"open fds grew from {fds} to {_open_fds()}"


def test_a_worker_runs_only_its_declared_calls(no_leaks):
    """``CALL`` reaches a worker's declared calls by name only (protocol.py); another name is an error that names
    them, and the worker goes on serving."""
    with ParallelEnv(2, CountingEnv) as env:
        with pytest.raises(EnvWorkerError, match=r"no call 'close'.*bind_rollout.*bind_slots.*env_attribute.*set_seed"):
            env._pool.call("close", [()] * 2)  # a method of the worker's env group, not declared
        assert env.rollout(3).batch_size == (2, 3)


def test_the_env_s_own_exception_travels_with_the_error(no_leaks):
    """The error report carries the env's exception object (pickled): ``EnvWorkerError.original`` is the env's own
    exception, with its type and arguments."""
    with ParallelEnv(2, functools.partial(FaultyEnv, "step", at_step=2)) as env:
        with pytest.raises(EnvWorkerError) as caught:
            env.rollout(3)
    original = caught.value.original
    assert type(original) is ValueError and original.args == ("boom in step 2",)
