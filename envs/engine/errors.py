"""The errors a batched env raises in the main process, each naming the worker and the cause, and how a worker's
exception travels to it (:func:`error_report` in the worker, :func:`worker_error` in the main process)."""
from __future__ import annotations

import pickle
import signal
import traceback

import cloudpickle


class WorkerError(RuntimeError):
    """Something went wrong in worker ``worker`` (an index in ``range(num_workers)``)."""

    def __init__(self, message: str, worker: int):
        super().__init__(message)
        self.worker = worker


def failures_of(err: WorkerError) -> dict:
    """``{worker: exception}`` for every worker behind ``err`` (a pool attaches them as ``err.failures`` when
    several failed at once; else just ``err``'s own worker)."""
    return getattr(err, "failures", {err.worker: err})


#: what torch says in a forked child that touches CUDA after its parent did, and what to do about it
CUDA_AFTER_FORK = "Cannot re-initialize CUDA in forked subprocess"
CUDA_AFTER_FORK_HINT = ("\nA worker started with 'fork' cannot use CUDA once the main process has: pass "
                        "mp_start_method='forkserver' or 'spawn' (the script then needs a main guard).")


class EnvWorkerError(WorkerError):
    """An exception raised inside a worker (by an env's constructor, reset, step, ...).

    Attributes: ``worker``, ``exc_type`` (the original exception's type name), ``exc_message``,
    ``worker_traceback`` (the traceback as formatted in the worker), ``original`` (the exception object itself,
    when it could be pickled there and read here; else None).
    """

    def __init__(self, worker: int, exc_type: str, exc_message: str, worker_traceback: str, during: str):
        hint = CUDA_AFTER_FORK_HINT if CUDA_AFTER_FORK in exc_message else ""
        super().__init__(
            f"worker {worker} raised {exc_type} during {during}: {exc_message}{hint}\n"
            f"--- traceback in worker {worker} ---\n{worker_traceback.rstrip()}",
            worker,
        )
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        self.original: BaseException | None = None


class WorkerDiedError(WorkerError):
    """A worker process ended without being asked to (killed, crashed, exited)."""

    def __init__(self, worker: int, pid: int, exitcode: int | None, during: str):
        super().__init__(
            f"worker {worker} (pid {pid}) died during {during} with {describe_exit(exitcode)}; "
            "the env's other workers were shut down.",
            worker,
        )
        self.pid = pid
        self.exitcode = exitcode


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A worker did not answer within the env's ``timeout``."""

    def __init__(self, worker: int, timeout: float, during: str):
        super().__init__(
            f"worker {worker} did not finish {during} within {timeout:g} s (the env's `timeout`); "
            "the env was shut down. Raise `timeout=` if its steps are legitimately this slow.",
            worker,
        )
        self.timeout = timeout


class MissingMainGuardError(RuntimeError):
    """Workers started with spawn/forkserver re-ran the script's top level, which creates the env again."""


class SpecMismatchError(ValueError, RuntimeError):
    """Envs built by the factories disagree on their specs. (A ``RuntimeError`` too, as TorchRL's batched envs
    raise for the same fault.)"""


class ArgumentError(ValueError, RuntimeError):
    """A batched env or collector was given an argument it cannot use; raised before anything starts. (A
    ``RuntimeError`` too, as TorchRL's batched envs raise for the same faults.)"""


class SharedMemoryError(RuntimeError):
    """The shared memory (``/dev/shm``) cannot hold the buffers asked for; raised where they are allocated, with
    how much was needed, how much is free and the fix, before anything is written to them."""


class OpenFilesError(OSError):
    """This process may not open the files its workers and buffers need (the soft ``RLIMIT_NOFILE``: 256 by default
    on macOS, often 1024 on Linux); raised where the workers start, naming the limit and the fix."""


def open_files_error(doing: str, limit: int | None) -> OpenFilesError:
    """The :class:`OpenFilesError` of running out of open files while ``doing`` (``"starting 4 workers"``) under
    ``limit`` open files."""
    said = "no more" if limit is None else f"at most {limit}"
    return OpenFilesError(
        f"tdcollect ran out of open files {doing}: this process may open {said} (each worker takes a pipe and a "
        "process handle, and torch's shared tensors take one file each on Linux). Raise the limit (`ulimit -n 4096` "
        "in the shell that starts Python, or resource.setrlimit), or use fewer workers with more envs each "
        "(envs_per_worker=).")


class ConstructorError(TypeError, RuntimeError):
    """What was passed as an env constructor cannot build envs in a worker (an env instance, something not
    callable, a constructor that cannot be pickled)."""


def describe_exit(exitcode: int | None) -> str:
    """``exit code 3`` / ``exit code -9 (killed by SIGKILL)``."""
    if exitcode is None:
        return "no exit code (still running)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"exit code {exitcode} (killed by {name})"
    return f"exit code {exitcode}"


#: an exception pickled larger than this is not carried in an error report (its type, message and traceback are)
ORIGINAL_MAX_BYTES = 1 << 20


def pickled_exception(exc: BaseException) -> bytes | None:
    """``exc`` pickled, to travel to the other process; None when it cannot be (its text travels instead)."""
    try:
        return pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - any pickling failure means the same: send the text only
        return None


def unpickled_exception(blob: bytes | None) -> BaseException | None:
    """The exception :func:`pickled_exception` sent; None when there is none, or it cannot be read here (e.g. its
    class is not importable in this process) or is not an exception."""
    try:
        value = pickle.loads(blob) if blob is not None else None
    except Exception:  # noqa: BLE001 - the text is enough
        return None
    return value if isinstance(value, BaseException) else None


def error_report(exc: BaseException, during: str) -> dict:
    """What a worker sends about an exception: ``type``, ``message``, ``traceback``, ``during``, and ``original``:
    the exception itself, pickled (None when it cannot be, or is larger than :data:`ORIGINAL_MAX_BYTES`), so that
    the main process can raise the env's own exception type."""
    original = pickled_exception(exc)
    if original is not None and len(original) > ORIGINAL_MAX_BYTES:
        original = None
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc(),
            "during": during, "original": original}


def worker_error(w: int, report: dict) -> EnvWorkerError:
    """The main process' exception for worker ``w``'s error report (``original``: the worker's exception
    object, when it travelled and can be read here; else None)."""
    error = EnvWorkerError(w, report["type"], report["message"], report["traceback"], report["during"])
    error.original = unpickled_exception(report.get("original"))
    return error


def sendable(obj, error: type[Exception], cannot: str, fix: str) -> bytes:
    """``obj`` cloudpickled for the worker processes (lambdas and closures of a notebook or ``__main__`` too); when it
    cannot be, ``error(f"{cannot} (<why>){fix}")`` raised here, in the caller's process."""
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing to the user
        raise error(f"{cannot} ({type(exc).__name__}: {exc}){fix}") from exc
