"""The operating system, in one place: every call of the engine whose mechanism differs between Linux, macOS and
Windows, each with its portable path. The rest of the engine asks here and never tests the platform itself.

=============================  ======================  ======================  ==================================
what                           Linux                   macOS                   Windows
=============================  ======================  ======================  ==================================
start method by default        ``fork``                ``spawn`` (fork is      ``spawn`` (the only one)
(:func:`fork_is_safe`)                                 unsafe with the
                                                       system's libraries)
yield the core while polling   ``os.sched_yield``      ``os.sched_yield``      ``time.sleep(0)`` (``Sleep(0)``)
(:data:`yield_core`)
free shared memory             ``statvfs("/dev/shm")`` None: no such file      None: file mappings live in the
(:func:`shm_free_bytes`)                               system (POSIX shm)      paging file
files torch leaves in          ``/dev/shm/torch_*``    none to look for        none (mappings die with their
``/dev/shm`` when killed                                                       last handle)
(:func:`leftover_shm_files`)
cores this process may use     ``sched_getaffinity``   ``os.cpu_count()``      ``os.cpu_count()``
(:func:`usable_cores`)
anonymous shared files         ``memfd_create``        none: the portable      none: the portable path
(:func:`has_memfd`)                                    path
die with the parent            ``PR_SET_PDEATHSIG``    the worker watches      the worker watches the parent's
(:func:`ask_to_die_with_parent`)                       the parent's sentinel   handle
open files per process         ``RLIMIT_NOFILE``       ``RLIMIT_NOFILE``       no such limit (handles)
(:func:`open_files_limit`)                             (256 by default)
=============================  ======================  ======================  ==================================

Timed semaphore waits: macOS has no ``sem_timedwait``, and CPython turns a timed ``acquire`` there into a loop
that tries, sleeps 0, 1, 2, ... 20 ms, and tries again. So no wait of the engine that an answer ends takes a timed
semaphore ``acquire`` (see ``protocol.Wait`` and ``pool.WorkerPool``): untimed ``acquire`` blocks properly on every
platform, and so do ``multiprocessing.connection.wait`` (``select`` / ``WaitForMultipleObjects``) and ``time.sleep``.

It imports nothing of this package: the bottom of the engine, beside ``protocol.py``.
"""
from __future__ import annotations

import errno
import os
import sys
import time

#: the shared-memory file system of Linux, where torch makes its segments
SHM_DIR = "/dev/shm"
#: a ``ulimit -n`` of this many open files is raised, where the hard limit allows, before workers start
WANTED_OPEN_FILES = 4096


def is_linux() -> bool:
    return sys.platform.startswith("linux")


def is_windows() -> bool:
    return sys.platform == "win32"


def fork_is_safe() -> bool:
    """Whether ``fork`` may start workers by default: on Linux. On macOS fork exists but is unsafe with the
    system's libraries (CPython made spawn its default there in 3.8, as TorchRL and gymnasium do); Windows has no
    fork. (Read at each call: a test that sets ``sys.platform`` sees its answer.)"""
    return is_linux()


def _sleep_zero() -> None:
    time.sleep(0)


#: give the core to another runnable thread or process while polling (``sched_yield``; ``Sleep(0)`` on Windows)
yield_core = getattr(os, "sched_yield", None) or _sleep_zero


def shm_free_bytes() -> int | None:
    """Bytes free in the shared-memory file system; None where the platform has none to ask (macOS' POSIX shared
    memory and Windows' file mappings draw on the memory and the paging file: an allocation that cannot be had
    fails there and is reported then)."""
    if not hasattr(os, "statvfs"):
        return None
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:  # no /dev/shm (macOS, some containers)
        return None
    return stat.f_bavail * stat.f_frsize


def leftover_shm_files(pid: int) -> list[str]:
    """Paths of the shared-memory files that torch began for process ``pid`` and never unlinked (a process killed
    between making one and unlinking it, under torch's ``file_descriptor`` strategy: Linux only); [] elsewhere."""
    if not is_linux():
        return []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return [os.path.join(SHM_DIR, name) for name in names if name.startswith(f"torch_{pid}_")]


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the platform has one, else every core)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def has_memfd() -> bool:
    """Whether anonymous shared files (``memfd_create``, Linux) can back a rollout's storage."""
    return hasattr(os, "memfd_create")


def ask_to_die_with_parent() -> bool:
    """Ask the kernel to kill this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``); False where the
    platform has no such request (the worker's own watch of its parent then does it, see ``protocol.py``)."""
    if not is_linux():
        return False
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(1, signal.SIGKILL) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def open_files_limit() -> int | None:
    """This process' limit on open files (the soft ``RLIMIT_NOFILE``), after raising it towards
    :data:`WANTED_OPEN_FILES` where the hard limit allows (macOS starts at 256); None where there is no such limit
    (Windows counts handles, without a small limit) or it is unlimited."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < WANTED_OPEN_FILES:
        wanted = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(WANTED_OPEN_FILES, hard)
        if wanted > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                soft = wanted
            except (OSError, ValueError):
                pass
    return None if soft == resource.RLIM_INFINITY else int(soft)


def is_out_of_files(err: BaseException) -> bool:
    """Whether ``err`` is the platform's "too many open files" (``EMFILE`` / ``ENFILE``)."""
    if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return "Too many open files" in str(err)
