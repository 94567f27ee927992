"""Lifecycle: scripts that exit without cleaning up, Ctrl-C, the main process killed, threads (workers outlive
the thread that made them; two threads at once are refused; close() from another thread is a clear error), use
after shutdown, named semaphores and torch segments released at close(), 200 create/close cycles with flat fds and
/dev/shm, and the caller's torch threads. close() on every face: ``test_close_every_face.py``."""
import functools
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psutil
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, WorkerDiedError
from tests.conftest import our_semaphores, our_shm_entries, shm_entries, wait_gone
from tests.helpers import CountingEnv, GatedEnv, SlowEnv, cartpole, wait_for_file

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


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.long)])
@pytest.mark.parametrize("case", ["normal", "exception", "ctrl-c"])
def test_a_script_that_never_shuts_its_collector_down_exits(case, method, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNCLOSED_COLLECTOR)
    proc = subprocess.run([sys.executable, str(script), case, method], capture_output=True, text=True, timeout=90,
                          cwd=os.getcwd())
    pids = [int(p) for p in next(line for line in proc.stdout.splitlines() if line.startswith("PIDS")).split()[1:]]
    if case == "normal":
        assert proc.returncode == 0 and "END" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "END" not in proc.stdout
        assert ("the loss exploded" if case == "exception" else "KeyboardInterrupt") in proc.stderr
    assert not wait_gone(pids), "workers outlived the script"  # (a hang is subprocess.run's TimeoutExpired)


#: How long to wait for something that must *not* happen (workers killed when the thread that made them ends):
#: no event marks its absence, so a wait is the only way to see it.
PDEATHSIG_GRACE_S = 0.5


def test_workers_outlive_the_thread_that_made_them(no_leaks):
    made = {}

    def build():
        made["env"] = ParallelEnv(2, CountingEnv, mp_start_method="fork")
        made["collector"] = MultiSyncCollector([cartpole] * 2, frames_per_batch=20, mp_start_method="fork")

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    time.sleep(PDEATHSIG_GRACE_S)  # a signal tied to the creating thread's end would have come by now
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
        assert not wait_gone(pids), "workers outlived the killed main process"
    finally:
        proc.kill()


def at_the_gate(folder, call, errors: list) -> threading.Thread:
    """A started thread that runs ``call()`` once the ``GatedEnv`` in ``folder`` entered its gated step (this
    thread's step is then under way), keeps the ``RuntimeError`` it raises in ``errors``, then opens the gate."""
    def run():
        try:
            wait_for_file(str(folder / "entered"))
            call()
        except RuntimeError as exc:
            errors.append(exc)
        finally:
            (folder / "open").touch()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_two_threads_stepping_one_env_are_refused(tmp_path, no_leaks):
    """The other thread calls while this one's step is under way: the env's 2nd step waits at a gate that the
    other thread opens after its call (no timing)."""
    errors = []
    with ParallelEnv(1, functools.partial(GatedEnv, str(tmp_path)), mp_start_method="fork") as env:
        thread = at_the_gate(tmp_path, lambda: env.rollout(2), errors)
        rollout = env.rollout(5, break_when_any_done=False)
        thread.join()
    assert rollout.batch_size == (1, 5)
    assert rollout["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 4, 5], "the other thread stepped nothing"
    assert len(errors) == 1 and "another thread" in str(errors[0]), errors


def test_two_threads_iterating_one_collector_are_refused(tmp_path, no_leaks):
    errors = []
    with MultiSyncCollector([functools.partial(GatedEnv, str(tmp_path))], frames_per_batch=4, total_frames=8,
                            mp_start_method="fork") as collector:
        thread = at_the_gate(tmp_path, lambda: next(iter(collector)), errors)  # during the first batch
        batches = list(collector)
        thread.join()
    assert len(batches) == 2
    assert torch.cat([b["next", "observation"][0, :, 0] for b in batches]).tolist() == list(range(1, 9))
    assert len(errors) == 1 and "two threads" in str(errors[0]), errors


def test_close_from_another_thread_during_a_rollout_is_a_clear_error(tmp_path, no_leaks):
    env = ParallelEnv(1, functools.partial(GatedEnv, str(tmp_path)), mp_start_method="fork", shutdown_timeout=0.5)

    def close_during_the_second_step():
        wait_for_file(str(tmp_path / "entered"))
        env.close()  # the worker waits at the gate: close() gives it shutdown_timeout, then kills it

    closer = threading.Thread(target=close_during_the_second_step)
    closer.start()
    with pytest.raises(RuntimeError, match="closed"):
        env.rollout(5, break_when_any_done=False)
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


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=pytest.mark.long), "forkserver"])
def test_close_releases_named_semaphores(method):
    before = our_semaphores()
    env = ParallelEnv(2, CountingEnv, mp_start_method=method)
    made = our_semaphores() - before
    assert made, "spawn/forkserver semaphores are named and live in /dev/shm while the env is open"
    env.rollout(2)
    env.close()
    assert not made & shm_entries(), "close() must release the env's named semaphores"
    collector = MultiSyncCollector([cartpole], frames_per_batch=10, mp_start_method=method)
    made = our_semaphores() - before
    assert made
    collector.shutdown()
    assert not made & shm_entries(), "shutdown() must release the collector's named semaphores"


@pytest.mark.parametrize("face", ["vector", "sb3", "multisync", "parallel"])
def test_the_callers_torch_threads(face, no_leaks):
    """gymnasium's and SB3's faces leave the caller's torch threads alone (its training runs there); ParallelEnv
    and the process collectors lower them by one per worker while their workers run, as TorchRL's do, and give them
    back at close / shutdown."""
    import gymnasium as gym
    import torch

    from tests.faces import build

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        owner = build(face, lambda: gym.make("CartPole-v1"))
        during = torch.get_num_threads()
        owner.shutdown() if face == "multisync" else owner.close()
        assert during == (2 if face in ("parallel", "multisync") else 4)
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------- Ctrl-C, the main process killed
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


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.long)])
def test_workers_exit_when_the_main_process_is_killed(method, tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(_ORPHAN_SCRIPT.format(root=os.getcwd(), method=method))
    main = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in main.stdout.readline().split()]
        assert len(pids) == 4, "the script did not start its workers"
        main.kill()
        main.wait(10)
        alive = wait_gone(pids)
        assert not alive, f"workers still running 5 s after the main process was killed: {alive}"
    finally:
        main.kill()
        main.wait(10)


# ----------------------------------------------------------------- nothing leaks over many cycles
def _open_fds() -> dict[str, str]:
    """This process's open file descriptors: ``{fd: what it points to}``."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd of the listing itself, closed by now
            pass
    return fds


@pytest.mark.parametrize("cycles", [15, pytest.param(200, marks=pytest.mark.long)])
def test_create_close_cycles_keep_fds_and_shm_flat(cycles, no_leaks, unrelated_shm):
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
    for cycle in range(cycles):
        if cycle == cycles // 2:
            unrelated = unrelated_shm()  # other programs' entries, still there when we check
        with ParallelEnv(2, CountingEnv) as env:
            pids.update(env.worker_pids)
            env.rollout(2)
    fds_after, shm_after = snapshot()
    assert unrelated <= shm_entries() and not unrelated & shm_after
    assert len(fds_after) <= len(fds) + 2, (
        f"open fds grew from {len(fds)} to {len(fds_after)} over {cycles} cycles; new: "
        f"{sorted(fds_after[fd] for fd in set(fds_after) - set(fds))}")
    assert shm_after <= shm, f"/dev/shm entries left behind over {cycles} cycles: {sorted(shm_after - shm)}"


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
