"""One thread at a time in a batched env, and a ``close()`` from another thread as one error.

A batched env steps one batch at a time: two threads calling it at once would mix their data silently, so a guarded
method (:func:`one_thread`) refuses a call from a second thread while another is inside. A ``close()`` from another
thread (or a signal handler) while a call runs ends that call with the one "closed" ``RuntimeError``, whatever it was
doing, and a call never starts the env again under a close. :class:`CallState` keeps what that takes; the env
(``batched.BatchedEnv``) holds it as ``_calls``, beside its ``_in_use`` lock, and provides ``_wait_for_close()`` and
``closed_under_error(name)``.
"""
from __future__ import annotations

import functools
import threading


class CallState:
    """What :func:`one_thread` keeps of the call in flight: how deep it is (guarded methods call each other), how
    many ``close()`` calls came from other threads during calls (``closes``), and how many there were when the
    call in flight began (``entry``): when they differ, the env was closed under the call, which then ends with the
    one "closed" error. ``closer``: the thread of a ``close()`` under way, or None; a call that another thread
    begins meanwhile (before or after the call that close() found in flight lets go of the env) waits for the close
    to end and ends with the "closed" error: it would otherwise start the env again, or step it, under the
    shutdown."""

    __slots__ = ("depth", "closes", "entry", "closer")

    def __init__(self):
        self.depth = 0
        self.closes = 0
        self.entry = 0
        self.closer = None

    def closing_elsewhere(self) -> bool:
        """Whether a ``close()`` is under way in another thread than this one."""
        closer = self.closer
        return closer is not None and closer != threading.get_ident()

    @property
    def closed_under(self) -> bool:
        """Whether a call is in flight and ``close()`` came from another thread since it began."""
        return self.depth > 0 and self.closes != self.entry


def one_thread(method):
    """Refuse a call while another thread is inside a guarded method of the same env (reentrant within one thread):
    a batched env steps one batch at a time, and two threads would mix their data silently. A ``close()`` from
    another thread while the call runs ends it with one error, the "closed" ``RuntimeError``, whatever it was doing
    (see :meth:`BatchedEnv.close`), and the call never starts the env again."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        calls = self._calls
        if not self._in_use.acquire(blocking=False):
            if calls.closing_elsewhere():
                self._wait_for_close()
                raise self.closed_under_error(name)
            raise RuntimeError(f"{self.owner}.{name}() was called while another thread is stepping or "
                               "resetting this env; a batched env steps one batch at a time. Give each thread its own "
                               "env, or serialize the calls with a lock.")
        if not calls.depth:
            calls.entry = calls.closes
            if calls.closing_elsewhere():  # (read after ``entry``: a close() that begins later counts in ``closes``)
                self._in_use.release()
                self._wait_for_close()
                raise self.closed_under_error(name)
        calls.depth += 1
        try:
            return method(self, *args, **kwargs)
        except Exception:
            if calls.closes != calls.entry:
                raise self.closed_under_error(name) from None
            raise
        finally:
            calls.depth -= 1
            self._in_use.release()

    return guarded
