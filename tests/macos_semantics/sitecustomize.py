"""macOS' semantics, imitated on Linux in every Python process that has this folder first on ``PYTHONPATH`` (the
macOS tier, ``.ci/macos/run``, and ``benchmarks/macos_waits.py``; the package never imports it). What CPython and
the system give a program on macOS, as far as the engine can meet it:

- a *timed* semaphore ``acquire`` polls: macOS has no ``sem_timedwait``, and CPython's
  ``Modules/_multiprocessing/semaphore.c`` (``sem_timedwait_save``) then tries, sleeps 0, 1, 2, ... up to 20 ms
  (never past the deadline) and tries again; an untimed ``acquire`` and ``acquire(False)`` are unchanged;
- ``Semaphore.get_value()`` raises ``NotImplementedError`` (no ``sem_getvalue`` there);
- no ``os.sched_getaffinity``, no ``os.memfd_create``;
- no ``/dev/shm`` for tdcollect's modules (``os.statvfs`` and ``os.listdir`` of it raise ``FileNotFoundError``);
- a limit of 256 open files (the soft ``RLIMIT_NOFILE`` of a macOS shell).

Not imitated: ``sys.platform`` (the stdlib would take its macOS code paths, which do not run on Linux), so the tier
chooses spawn itself; 31-character shared-memory names (the engine names none: torch and multiprocessing do).
"""
import errno
import multiprocessing.synchronize
import os
import resource
import sys
import time

MAX_DELAY_S = 0.020
DELAY_STEP_S = 0.001


def _timed_like_macos(acquire_now, timeout: float) -> bool:
    """CPython's ``sem_timedwait_save``: poll, sleeping 0, 1, 2, ... 20 ms between tries, until ``timeout``."""
    deadline = time.monotonic() + max(0.0, timeout)
    delay = 0.0
    while True:
        if acquire_now(False):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, MAX_DELAY_S, left))
        delay += DELAY_STEP_S


def _no_get_value():
    raise NotImplementedError("sem_getvalue is not implemented on macOS (imitated)")


_make_methods = multiprocessing.synchronize.SemLock._make_methods


def _make_methods_like_macos(self):
    _make_methods(self)
    raw = self._semlock.acquire

    def acquire(block=True, timeout=None):
        if not block or timeout is None:
            return raw(block)
        return _timed_like_macos(raw, timeout)

    self.acquire = acquire
    if isinstance(self, multiprocessing.synchronize.Semaphore):
        self.get_value = _no_get_value


multiprocessing.synchronize.SemLock._make_methods = _make_methods_like_macos

for _name in ("sched_getaffinity", "memfd_create"):
    if hasattr(os, _name):
        delattr(os, _name)

_statvfs = os.statvfs
_listdir = os.listdir


def _no_dev_shm(path) -> None:
    """``/dev/shm`` is gone for tdcollect's modules (the standard library, which still runs its Linux code paths
    here, keeps it: its shared heap lives there on Linux and in the temp folder on macOS)."""
    if isinstance(path, int) or not os.fsdecode(path).startswith("/dev/shm"):
        return
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller.startswith("tdcollect"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (macOS has no /dev/shm; imitated)", path)


def _statvfs_like_macos(path):
    _no_dev_shm(path)
    return _statvfs(path)


def _listdir_like_macos(path="."):
    _no_dev_shm(path)
    return _listdir(path)


os.statvfs = _statvfs_like_macos
os.listdir = _listdir_like_macos

_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _soft == resource.RLIM_INFINITY or _soft > 256:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, _hard))
