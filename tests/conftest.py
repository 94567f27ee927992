import os

import psutil
import pytest

_SERVICE_PROCESSES = ("resource_tracker", "forkserver")


def live_children() -> list[psutil.Process]:
    """Child processes of this test process, less multiprocessing's own long-lived helpers."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if not any(name in cmdline for name in _SERVICE_PROCESSES):
            out.append(proc)
    return out


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    import gc

    before_shm = shm_entries()
    before_children = {p.pid for p in live_children()}
    yield
    gc.collect()
    left = [p for p in live_children() if p.pid not in before_children]
    psutil.wait_procs(left, timeout=3)
    left = [p for p in live_children() if p.pid not in before_children]
    new_shm = shm_entries() - before_shm
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    assert not new_shm, f"/dev/shm entries left behind: {sorted(new_shm)}"
