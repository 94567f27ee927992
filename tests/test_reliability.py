"""Reliability (fault matrix rows not covered in test_faults.py): native crashes, Ctrl-C, the main process
dying, automatic restart for ParallelEnv and MultiSyncCollector, and many create/close cycles."""
import functools
import gc
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import EnvWorkerError, ParallelEnv, WorkerDiedError
from tests.conftest import _OUR_SEMAPHORES, shm_entries
from tests.helpers import CountingEnv, CrashOnceEnv, SlowEnv

pytestmark = pytest.mark.timeout(90)

long_counting = functools.partial(CountingEnv, episode_len=100)


@pytest.mark.parametrize("how, signame", [("abort", "SIGABRT"), ("segfault", "SIGSEGV")])
def test_native_crash_in_step_names_worker_and_signal(how, signame, no_leaks):
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker 1 .*died during step.*{signame}"):
        with ParallelEnv(2, [long_counting, functools.partial(CrashOnceEnv, None, how)]) as env:
            env.rollout(10, break_when_any_done=False)
    assert time.monotonic() - start < 10
    assert env.is_closed and env.worker_pids == []


@pytest.fixture
def ctrl_c_raises():
    """Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when it started (a shell
    starts background jobs with SIGINT ignored); make it so for the test, as in an interactive session."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_main_thread_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_during_a_rollout_closes_the_env(ctrl_c_raises, no_leaks):
    env = ParallelEnv(2, functools.partial(SlowEnv, 0.05))
    timer = _interrupt_main_thread_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        env.rollout(1000, break_when_any_done=False)
    timer.join()
    assert time.monotonic() - start < 5
    assert env.is_closed and env.worker_pids == []


def test_ctrl_c_during_collection_shuts_the_collector_down(ctrl_c_raises, no_leaks):
    collector = MultiSyncCollector([functools.partial(SlowEnv, 0.05)] * 2, None, frames_per_batch=200,
                                   total_frames=-1)
    timer = _interrupt_main_thread_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        for _ in collector:
            pass
    timer.join()
    assert collector.worker_pids == []


_ORPHAN_SCRIPT = """
import functools, os, sys, time
sys.path.insert(0, {root!r})
from tests.helpers import CountingEnv
from tdcollect.envs import ParallelEnv
from tdcollect.collectors import MultiSyncCollector

if __name__ == "__main__":
    env = ParallelEnv(2, CountingEnv, mp_start_method={method!r})
    collector = MultiSyncCollector([CountingEnv] * 2, None, frames_per_batch=20, mp_start_method={method!r})
    next(iter(collector))
    print(" ".join(map(str, env.worker_pids + collector.worker_pids)), flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_exit_when_the_main_process_is_killed(method, tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(_ORPHAN_SCRIPT.format(root=os.getcwd(), method=method))
    main = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in main.stdout.readline().split()]
        assert len(pids) == 4, "the script did not start its workers"
        main.kill()
        main.wait(10)
        start = time.monotonic()
        alive = pids
        while alive and time.monotonic() - start < 2.0:
            time.sleep(0.05)
            alive = [p for p in pids if _running(p)]
        assert not alive, f"workers still running 2 s after the main process was killed: {alive}"
    finally:
        main.kill()
        main.wait(10)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ----------------------------------------------------------------- automatic restart
@pytest.mark.parametrize("how, error", [("kill", "died"), ("raise", "ValueError")])
def test_parallel_env_restarts_a_failed_worker(how, error, tmp_path, no_leaks):
    crash_once = functools.partial(CrashOnceEnv, str(tmp_path / "crashed"), how, 3)
    with pytest.warns(RuntimeWarning, match=rf"restarting worker 1 after: .*{error}"):
        with ParallelEnv(2, [long_counting, crash_once], envs_per_worker=2, max_restarts=1) as env:
            env.set_seed(0)
            td = env.rollout(6, break_when_any_done=False)
            assert env.restarts == [0, 1]
    counts = td["next", "observation"][..., 0]
    truncated = td["next", "truncated"][..., 0]
    # worker 0's envs never noticed
    assert counts[:2].tolist() == [[1, 2, 3, 4, 5, 6]] * 2
    assert not truncated[:2].any() and not td["next", "done"][:2].any()
    # worker 1's envs: the failed step (3rd) is truncated, with the reset observation and reward 0 ...
    assert counts[2:, :2].tolist() == [[1, 2]] * 2
    assert truncated[2:, 2].all() and not td["next", "terminated"][2:, 2].any()
    assert counts[2:, 2].tolist() == [0, 0] and (td["next", "reward"][2:, 2] == 0).all()
    # ... and the restarted envs go on from a fresh episode
    assert counts[2:, 3:].tolist() == [[1, 2, 3]] * 2
    assert not truncated[2:, 3:].any()


def test_parallel_env_past_max_restarts_raises_and_closes(no_leaks):
    always = functools.partial(CrashOnceEnv, None, "kill", 2)
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with pytest.raises(WorkerDiedError, match="worker 1"):
            with ParallelEnv(2, [long_counting, always], max_restarts=1) as env:
                env.rollout(10, break_when_any_done=False)
    assert env.is_closed and env.worker_pids == []


def test_without_max_restarts_an_env_error_is_raised(no_leaks):
    with ParallelEnv(2, [long_counting, functools.partial(CrashOnceEnv, None, "raise", 2)]) as env:
        with pytest.raises(EnvWorkerError, match="worker 1 raised ValueError"):
            env.rollout(5, break_when_any_done=False)
        assert env.restarts == [0, 0]


def test_collector_restarts_a_dead_worker_and_refills_its_batch(tmp_path, no_leaks):
    crash_in_second_batch = functools.partial(CrashOnceEnv, str(tmp_path / "crashed"), "kill", 13)
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with MultiSyncCollector([long_counting, crash_in_second_batch], None, frames_per_batch=20,
                                total_frames=60, max_restarts=1) as collector:
            batches = [batch.clone() for batch in collector]
            assert collector.restarts == [0, 1]
    assert [b.batch_size for b in batches] == [torch.Size([2, 10])] * 3
    counts = [b["next", "observation"][:, :, 0] for b in batches]
    assert counts[1][0].tolist() == list(range(11, 21))  # worker 0 untouched
    assert counts[1][1].tolist() == list(range(1, 11))   # worker 1 refilled by its replacement, a fresh episode
    ids = [b["collector", "traj_ids"] for b in batches]
    assert ids[1][1, 0] != ids[0][1, -1], "the replacement's episode must get a new trajectory id"
    assert ids[1][0, 0] == ids[0][0, -1]


def test_collector_past_max_restarts_raises_and_shuts_down(no_leaks):
    always = functools.partial(CrashOnceEnv, None, "raise", 2)
    with pytest.warns(RuntimeWarning):
        with pytest.raises(EnvWorkerError, match="worker 1 raised ValueError"):
            with MultiSyncCollector([long_counting, always], None, frames_per_batch=20, total_frames=100,
                                    max_restarts=2) as collector:
                list(collector)
    assert collector.worker_pids == []


# ----------------------------------------------------------------- nothing leaks
_TORCH_SHM = re.compile(r"^torch_(\d+)_")


def our_shm_entries(pids: set[int]) -> set[str]:
    """The ``/dev/shm`` entries this process tree made, leaving out those of every other program on the
    machine: the named semaphores this process registered with multiprocessing's resource tracker (as
    ``tests.conftest`` tracks them; a ParallelEnv's ``wake`` / ``done`` semaphores under spawn and
    forkserver) and torch's shared-memory files ``torch_<pid>_<n>_<k>`` made by a process in ``pids``
    (under the file_system sharing strategy they stay until released; under file_descriptor, the default,
    they are unlinked at once)."""
    ours = set()
    for name in shm_entries():
        if name.startswith("sem."):
            if name in _OUR_SEMAPHORES:
                ours.add(name)
            continue
        match = _TORCH_SHM.match(name)
        if match and int(match.group(1)) in pids:
            ours.add(name)
    return ours


def _open_fds() -> dict[str, str]:
    """This process's open file descriptors: ``{fd: what it points to}``."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd of the listing itself, closed by now
            pass
    return fds


@pytest.mark.slow
def test_200_create_close_cycles_keep_fds_and_shm_flat(no_leaks, unrelated_shm):
    pids = {os.getpid()}  # this process and every worker it started: the torch_<pid>_... files that are ours

    def snapshot():
        # fds of closed envs that only a full collection frees are not leaks (under pytest a few envs' buffer
        # fds regularly wait for it; the count then depends on when the collector last ran)
        gc.collect()
        return _open_fds(), our_shm_entries(pids)

    warm_up = ParallelEnv(2, CountingEnv)  # warm up lazily created helpers (resource tracker, ...)
    pids.update(warm_up.worker_pids)
    warm_up.close()
    fds, shm = snapshot()
    for cycle in range(200):
        if cycle == 100:
            unrelated = unrelated_shm()  # other programs' entries, still there when we check
        with ParallelEnv(2, CountingEnv) as env:
            pids.update(env.worker_pids)
            env.rollout(2)
    fds_after, shm_after = snapshot()
    assert unrelated <= shm_entries() and not unrelated & shm_after
    assert len(fds_after) <= len(fds) + 2, (
        f"open fds grew from {len(fds)} to {len(fds_after)} over 200 cycles; new: "
        f"{sorted(fds_after[fd] for fd in set(fds_after) - set(fds))}")
    assert shm_after <= shm, f"/dev/shm entries left behind over 200 cycles: {sorted(shm_after - shm)}"


def test_the_shm_check_still_sees_our_own_leaks(no_leaks, unrelated_shm):
    """What ``our_shm_entries`` must count: a named semaphore made in this process and not released (as a
    spawn ParallelEnv leaks them if it is never closed), and torch files of this process or of one of our
    workers — even with other programs' entries around."""
    pids = {os.getpid()}
    before = our_shm_entries(pids)
    unrelated = unrelated_shm()
    assert our_shm_entries(pids) == before
    leaked_sem = multiprocessing.get_context("spawn").Semaphore()
    sem_name = "sem." + leaked_sem._semlock.name.lstrip("/")
    with ParallelEnv(1, CountingEnv) as env:
        worker = env.worker_pids[0]
    pids.add(worker)
    torch_names = [f"torch_{pid}_{uuid.uuid4().int % 10**9}_7" for pid in (os.getpid(), worker)]
    try:
        for name in torch_names:
            open(os.path.join("/dev/shm", name), "wb").close()
        assert our_shm_entries(pids) - before == {sem_name, *torch_names}
        assert not unrelated & our_shm_entries(pids)
    finally:
        for name in torch_names:
            os.unlink(os.path.join("/dev/shm", name))
        del leaked_sem
        gc.collect()
    assert our_shm_entries(pids) == before
