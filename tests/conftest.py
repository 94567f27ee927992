"""Fixtures and helpers every test file may use: ``no_leaks`` (no child process and no /dev/shm entry of ours
left behind), ``unrelated_shm`` (other programs' /dev/shm entries, for the leak checks to ignore), ``ctrl_c_raises``
(Ctrl-C is a ``KeyboardInterrupt`` in this process, however the test run was started), and
``live_children``, ``wait_gone``, ``our_semaphores``, ``our_shm_entries`` (what a process tree of ours holds)."""
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

_SERVICE_PROCESSES = ("resource_tracker", "forkserver")


@pytest.fixture
def ctrl_c_raises():
    """Make Ctrl-C (SIGINT, or ``_thread.interrupt_main()``) a ``KeyboardInterrupt`` in this process for the test,
    as in an interactive session. Python turns SIGINT into ``KeyboardInterrupt`` only if SIGINT was not ignored
    when it started, and a shell without job control (a script's ``pytest ... &``, ``nohup``) starts background
    jobs with SIGINT ignored: there ``_thread.interrupt_main()`` does nothing and a test that waits for the
    interrupt waits for ever."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def live_children(process: psutil.Process | None = None) -> list[psutil.Process]:
    """Child processes of ``process`` (default: this test process), less multiprocessing's own long-lived
    helpers."""
    out = []
    for proc in (process or psutil.Process()).children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if not any(name in cmdline for name in _SERVICE_PROCESSES):
            out.append(proc)
    return out


_OUR_SEMAPHORES: set[str] = set()  # and multiprocessing.shared_memory segments
_TRACKED = {"semaphore": "sem.", "shared_memory": ""}  # resource type -> its /dev/shm entry's prefix
_TRACKED_PREFIXES = ("sem.", "psm_")
_UNRELATED_PREFIX = "unrelated-"  # files ``unrelated_shm`` makes; another pytest-xdist worker's may show any time


def _track_semaphores() -> None:
    """Remember the named semaphores and ``multiprocessing.shared_memory`` segments this process registers (ours
    are all made in the main process), so that /dev/shm entries made by unrelated processes on the same machine
    (another pytest-xdist worker, say) are not mistaken for our leaks."""
    from multiprocessing import resource_tracker

    register, unregister = resource_tracker.register, resource_tracker.unregister

    def tracked_register(name, rtype):
        if rtype in _TRACKED:
            _OUR_SEMAPHORES.add(_TRACKED[rtype] + name.lstrip("/"))
        return register(name, rtype)

    def tracked_unregister(name, rtype):
        if rtype in _TRACKED:
            _OUR_SEMAPHORES.discard(_TRACKED[rtype] + name.lstrip("/"))
        return unregister(name, rtype)

    resource_tracker.register, resource_tracker.unregister = tracked_register, tracked_unregister


_track_semaphores()


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:  # none here (Windows, macOS, or its imitation: tests/macos_semantics)
        return set()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, within: float = 5.0) -> list[int]:
    """Wait up to ``within`` s for the processes ``pids`` to end; returns those still running (empty: all gone)."""
    deadline = time.monotonic() + within
    alive = [pid for pid in pids if running(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if running(pid)]
    return alive


def our_semaphores() -> set[str]:
    """The /dev/shm entries of the named semaphores (and shared-memory segments) this process registered."""
    return {name for name in shm_entries() if name in _OUR_SEMAPHORES}


_TORCH_SHM = re.compile(r"^torch_(\d+)_")


def our_shm_entries(pids: set[int]) -> set[str]:
    """The ``/dev/shm`` entries this process tree made, leaving out those of every other program on the
    machine: the named semaphores this process registered with multiprocessing's resource tracker (a
    ParallelEnv's ``wake`` / ``done`` semaphores under spawn and forkserver) and torch's shared-memory files
    ``torch_<pid>_<n>_<k>`` made by a process in ``pids`` (under the file_system sharing strategy they stay until
    released; under file_descriptor, the default, they are unlinked at once)."""
    ours = {name for name in our_semaphores() if name.startswith("sem.")}
    for name in shm_entries():
        match = _TORCH_SHM.match(name)
        if match and int(match.group(1)) in pids:
            ours.add(name)
    return ours


def _made_by_another_live_process(entry: str) -> bool:
    """Whether ``entry`` is a torch segment (``torch_<pid>_...``, unlinked by its maker once its pages are
    reserved) that a live process other than this one is making right now — another pytest-xdist worker, say.
    Its file shows for the milliseconds a big segment takes to reserve."""
    if not entry.startswith("torch_"):
        return False
    try:
        pid = int(entry.split("_")[1])
    except (IndexError, ValueError):
        return False
    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    return pid not in ours and psutil.pid_exists(pid)


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    import gc

    before_shm = shm_entries()
    before_children = {p.pid for p in live_children()}

    def leftovers() -> tuple[list, set]:
        left = [p for p in live_children() if p.pid not in before_children]
        if left:
            psutil.wait_procs(left, timeout=3)
            left = [p for p in live_children() if p.pid not in before_children]
        new_shm = {e for e in shm_entries() - before_shm if not e.startswith(_UNRELATED_PREFIX)
                   and (not e.startswith(_TRACKED_PREFIXES) or e in _OUR_SEMAPHORES)}
        return left, {e for e in new_shm if not _made_by_another_live_process(e)}

    yield
    # the young generations first (an env dropped without close() is there); a full collection (~0.2 s with
    # torch loaded) only when something is still left, before failing
    gc.collect(1)
    left, new_shm = leftovers()
    if left or new_shm:
        gc.collect()
        left, new_shm = leftovers()
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    assert not new_shm, f"/dev/shm entries left behind: {sorted(new_shm)}"


_HOLD_SHM_SCRIPT = """
import multiprocessing, signal, sys, time
from multiprocessing import shared_memory

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
shm = shared_memory.SharedMemory(create=True, size=64)
sem = multiprocessing.get_context("spawn").Semaphore()  # a named semaphore: /dev/shm/sem.mp-...
print(shm.name, "sem." + sem._semlock.name.lstrip("/"), flush=True)
try:
    while True:
        time.sleep(1)
finally:
    shm.close()
    shm.unlink()
"""


@pytest.fixture
def unrelated_shm():
    """``make()`` creates /dev/shm entries the way other programs on the machine do, while the test runs:
    a file of its own, a file named like another torch process's shared memory, and — from a separate
    process that holds them until the test ends — a ``multiprocessing.shared_memory.SharedMemory`` and a
    named semaphore. Returns their names; all are removed at teardown (before ``no_leaks`` looks)."""
    files, procs = [], []

    def make() -> set[str]:
        names = {f"{_UNRELATED_PREFIX}{uuid.uuid4().hex}", f"torch_{os.getppid()}_{uuid.uuid4().int % 10**9}_1"}
        for name in names:
            with open(os.path.join("/dev/shm", name), "wb") as f:
                f.write(b"not ours")
            files.append(name)
        proc = subprocess.Popen([sys.executable, "-c", _HOLD_SHM_SCRIPT], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        names.update(proc.stdout.readline().split())
        proc.stdout.close()  # no fd of ours stays open for it
        assert len(names) == 4 and names <= shm_entries(), names
        return names

    yield make
    for proc in procs:
        proc.terminate()
        proc.wait(10)
    for name in files:
        os.unlink(os.path.join("/dev/shm", name))
