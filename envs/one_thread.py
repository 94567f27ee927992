"""One thread at a time: a batched env steps one batch at a time, so a second thread entering it is refused."""
from __future__ import annotations

import functools


def one_thread(method):
    """Refuse a call while another thread is inside a guarded method of the same env: a batched env steps
    one batch at a time, and two threads would mix their data silently. (Reentrant within one thread.)"""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        lock = self._in_use
        if not lock.acquire(blocking=False):
            raise RuntimeError(
                f"{self.owner}.{method.__name__}() was called while another thread is stepping or resetting this "
                "env; a batched env steps one batch at a time. Give each thread its own env, or serialize the "
                "calls with a lock."
            )
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release()

    return guarded
