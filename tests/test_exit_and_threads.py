"""Scripts exit without cleaning up; threads: workers outlive the thread that made them, two threads at once
are refused, close() from another thread is a clear error; use after shutdown is a clear error; named
semaphores leave /dev/shm at close()."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, WorkerDiedError
from tests.conftest import _OUR_SEMAPHORES, shm_entries
from tests.helpers import CountingEnv, SlowEnv, cartpole

pytestmark = pytest.mark.timeout(120)

UNCLOSED_COLLECTOR = textwrap.dedent("""
    import os, signal, sys, time
    import gymnasium as gym
    from tdcollect.collectors import MultiSyncCollector

    def make():
        return gym.make("CartPole-v1")

    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
        case, method = sys.argv[1], sys.argv[2]
        collector = MultiSyncCollector([make] * 2, frames_per_batch=20, total_frames=60, mp_start_method=method)
        print("PIDS", *collector.worker_pids, flush=True)
        for i, batch in enumerate(collector):       # never shut down
            if i == 1 and case == "exception":
                raise ValueError("the loss exploded")
            if i == 1 and case == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(10)
        print("END", flush=True)
""")


def _gone(pids, within=5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("case", ["normal", "exception", "ctrl-c"])
def test_a_script_that_never_shuts_its_collector_down_exits(case, method, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNCLOSED_COLLECTOR)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script), case, method], capture_output=True, text=True, timeout=90,
                          cwd=os.getcwd())
    took = time.monotonic() - start
    pids = [int(p) for p in next(line for line in proc.stdout.splitlines() if line.startswith("PIDS")).split()[1:]]
    if case == "normal":
        assert proc.returncode == 0 and "END" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "END" not in proc.stdout
        assert ("the loss exploded" if case == "exception" else "KeyboardInterrupt") in proc.stderr
    assert _gone(pids), "workers outlived the script"
    assert took < 60


def test_workers_outlive_the_thread_that_made_them(no_leaks):
    made = {}

    def build():
        made["env"] = ParallelEnv(2, CountingEnv, mp_start_method="fork")
        made["collector"] = MultiSyncCollector([cartpole] * 2, frames_per_batch=20, mp_start_method="fork")

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    time.sleep(0.5)  # the creating thread is gone
    env, collector = made["env"], made["collector"]
    try:
        assert len(env.worker_pids) == 2 and len(collector.worker_pids) == 2
        assert env.rollout(3).batch_size == (2, 3)
        assert next(iter(collector)).batch_size == (2, 10)
    finally:
        env.close()
        collector.shutdown()


ENV_IN_A_THREAD = textwrap.dedent("""
    import threading, time
    from tdcollect.envs import ParallelEnv
    from tests.helpers import CountingEnv

    made = []
    thread = threading.Thread(target=lambda: made.append(ParallelEnv(2, CountingEnv, mp_start_method="fork")))
    thread.start(); thread.join()
    print("PIDS", *made[0].worker_pids, flush=True)
    time.sleep(60)
""")


def test_workers_made_in_a_thread_still_exit_when_the_main_process_is_killed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", ENV_IN_A_THREAD], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2, line
        proc.kill()
        proc.wait(10)
        assert _gone(pids, within=5.0), "workers outlived the killed main process"
    finally:
        proc.kill()


def test_two_threads_stepping_one_env_are_refused(no_leaks):
    errors = []
    with ParallelEnv(1, lambda: SlowEnv(0.02), mp_start_method="fork") as env:
        def other_thread():
            time.sleep(0.2)
            try:
                env.rollout(2)
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        rollout = env.rollout(30, break_when_any_done=False)
        thread.join()
    assert rollout.batch_size == (1, 30)
    assert len(errors) == 1 and "another thread" in str(errors[0])


def test_two_threads_iterating_one_collector_are_refused(no_leaks):
    errors = []
    with MultiSyncCollector([lambda: SlowEnv(0.02)], frames_per_batch=30, total_frames=60,
                            mp_start_method="fork") as collector:
        def other_thread():
            time.sleep(0.2)
            try:
                next(iter(collector))
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        batches = list(collector)
        thread.join()
    assert len(batches) == 2
    assert len(errors) == 1 and "two threads" in str(errors[0])


def test_close_from_another_thread_during_a_rollout_is_a_clear_error(no_leaks):
    env = ParallelEnv(1, lambda: SlowEnv(0.02), mp_start_method="fork")
    closer = threading.Timer(0.3, env.close)
    closer.start()
    with pytest.raises(RuntimeError, match="closed"):
        env.rollout(200, break_when_any_done=False)
    closer.join()
    assert env.is_closed


def test_a_collector_after_shutdown_or_a_fatal_error_says_so(no_leaks):
    collector = MultiSyncCollector([cartpole], frames_per_batch=10, total_frames=20)
    collector.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(collector))
    collector = MultiSyncCollector([cartpole], frames_per_batch=10, total_frames=-1)
    it = iter(collector)
    next(it)
    psutil.Process(collector.worker_pids[0]).kill()
    with pytest.raises(WorkerDiedError):
        next(it)
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(collector))


def _our_semaphores() -> set:
    return {name for name in shm_entries() if name in _OUR_SEMAPHORES}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_close_releases_named_semaphores(method):
    before = _our_semaphores()
    env = ParallelEnv(2, CountingEnv, mp_start_method=method)
    made = _our_semaphores() - before
    assert made, "spawn/forkserver semaphores are named and live in /dev/shm while the env is open"
    env.rollout(2)
    env.close()
    assert not made & shm_entries(), "close() must release the env's named semaphores"
    collector = MultiSyncCollector([cartpole], frames_per_batch=10, mp_start_method=method)
    made = _our_semaphores() - before
    assert made
    collector.shutdown()
    assert not made & shm_entries(), "shutdown() must release the collector's named semaphores"


@pytest.mark.parametrize("face", ["vector", "sb3", "multisync", "parallel"])
def test_the_callers_torch_threads(face, no_leaks):
    """gymnasium's and SB3's faces and the collectors leave the caller's torch threads alone (its training runs
    there); ParallelEnv lowers them by one per worker while its workers run, as TorchRL's does, and gives them
    back at close."""
    import gymnasium as gym
    import torch

    from tests.faces import build

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        owner = build(face, lambda: gym.make("CartPole-v1"))
        during = torch.get_num_threads()
        owner.shutdown() if face == "multisync" else owner.close()
        assert during == (2 if face == "parallel" else 4)
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)
