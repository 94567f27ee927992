"""The errors the vector facades raise in the main process: an env's exception as its own type
(:func:`worker_exception`), a call's result or exception (:func:`call_result`), values that cannot be unpickled
(:func:`unpickled`), and envs whose spaces disagree (:class:`SpaceMismatchError`)."""
from __future__ import annotations

import builtins
import pickle
import types

import gymnasium as gym

from ..engine.errors import EnvWorkerError, SpecMismatchError, WorkerError, unpickled_exception
from . import worker as vector_worker


class SpaceMismatchError(SpecMismatchError, RuntimeError):
    """The envs of one vector env disagree on their spaces (a ``SpecMismatchError`` that is also a
    ``RuntimeError``, the error gymnasium's vector envs raise for it)."""


def unpickled(blob: bytes, index: int, what: str):
    """A value env ``index`` sent pickled (``what`` it is, for the error when it cannot be read here)."""
    try:
        return pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - one clear error for any unpickling failure
        raise TypeError(f"env {index}: {what} cannot be read in the main process ({type(exc).__name__}: {exc}).") \
            from None


def call_result(ok: bool, blob: bytes | None, text: str, index: int, op: str):
    """A reply of ``EngineEnv.serve_requests``: the value, or raise the env's exception."""
    if ok:
        return unpickled(blob, index, f"the result of {op!r}")
    error = unpickled_exception(blob)
    if error is None:
        error = RuntimeError(text.splitlines()[0] if text else f"env {index} failed in {op!r}")
    if hasattr(error, "add_note"):
        error.add_note(f"(raised by env {index} in its worker process, during {op!r})\n{text.rstrip()}")
    raise error


# ----------------------------------------------------------------- env errors as their own type
_COMBINED: dict[type, type | None] = {}


def worker_exception(err: EnvWorkerError, original: BaseException | None) -> BaseException:
    """``err`` as an exception that is both an :class:`EnvWorkerError` (worker index, message, the worker's
    traceback) and an instance of the type the env raised (``original``'s, or the type of that name among the
    builtins, gymnasium's errors and this package's), so that ``except ValueError`` catches an env's
    ``ValueError`` as it would in a single process. When no such type can be made (its layout forbids it),
    ``original`` itself with ``err`` as its cause; ``err`` when neither is known."""
    cls = type(original) if isinstance(original, Exception) else _exception_type(err.exc_type)
    if cls is None or issubclass(cls, WorkerError):
        return err
    combined = _combined(cls)
    if combined is None:
        if original is None:
            return err
        original.__cause__ = err
        return original
    try:
        new = combined(str(err))
    except Exception:  # noqa: BLE001 - a type whose constructor refuses the message: raise the original
        if original is None:
            return err
        original.__cause__ = err
        return original
    new.__dict__.update(err.__dict__)
    return new


def _exception_type(name: str) -> type | None:
    cls = getattr(vector_worker, name, None) or getattr(builtins, name, None) or getattr(gym.error, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def _message_init(self, message: str) -> None:
    BaseException.__init__(self, message)  # the attributes of the EnvWorkerError are copied in afterwards


def _combined(cls: type) -> type | None:
    if cls not in _COMBINED:
        try:
            _COMBINED[cls] = types.new_class(f"Worker{cls.__name__}", (EnvWorkerError, cls), exec_body=lambda ns: (
                ns.update({"__module__": __name__, "__init__": _message_init,
                           "__doc__": f"A {cls.__name__} raised by an env in its worker."})))
        except TypeError:  # e.g. OSError: its instance layout cannot be combined with another
            _COMBINED[cls] = None
    return _COMBINED[cls]
