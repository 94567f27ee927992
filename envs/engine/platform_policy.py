"""Platform policy: which start method, how many usable cores, whether to poll before blocking, and what a
worker does when it finds itself importing an unguarded main module. Every owner of worker processes (the
envs' and the collectors' pools) asks here."""
from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import threading

import torch

from .portability import fork_is_safe, usable_cores
from .protocol import MISSING_GUARD_EXIT

START_METHODS = ("fork", "forkserver", "spawn")
SPIN_S = 0.001  # how long a side polls before it blocks, when there are cores enough (see default_spin_s)
#: Workers per usable core up to which the waits poll by default. Measured on 2 cores (ratios to serial, 2-3
#: interleaved rounds, block -> poll): 2 workers, cheap x4 0.29 -> 0.62, cheap x32 0.81 -> 1.17, costly x4
#: 1.21 -> 1.32, costly x32 1.64 -> 1.74 (public step loop); 4 workers: 0.22 -> 0.46, 0.78 -> 1.19, 1.02 -> 1.28,
#: 1.49 -> 1.59; 8 workers: costly 1.05 -> 0.91 and 1.56 -> 1.44, cheap mixed. A wait sleeps through the part its
#: recent waits say is sure to pass (``protocol.Wait``), so polling costs a core only near an answer.
SPIN_WORKERS_PER_CORE = 2

GUARD_MESSAGE = """\
{owner}'s worker processes (start method {method!r}) re-ran the top level of your script, which creates
the {owner} again. With 'spawn' and 'forkserver', each worker imports the main module, so the code that
creates envs must sit under a main guard:

    if __name__ == "__main__":
        env = ParallelEnv(...)
        ...

On Linux, mp_start_method="fork" (the default there unless the workers run CUDA code) does not re-run the
script; Windows has no fork and macOS starts workers with spawn by default: there the guard is needed."""



def built_on_cpu(method):
    """Run ``method`` (a constructor, a start) with the CPU as torch's default device: the buffers, flags and
    tables it makes are CPU memory even inside a caller's ``with torch.device("cuda"):`` block. Only then is a
    device mode entered: workers forked inside one would run every torch call of their life through it (measured:
    +25 µs per step of CartPole 2 x 4)."""
    @functools.wraps(method)
    def on_cpu(*args, **kwargs):
        if torch.get_default_device().type == "cpu":
            return method(*args, **kwargs)
        with torch.device("cpu"):
            return method(*args, **kwargs)

    return on_cpu


def default_start_method() -> str:
    """``"fork"`` on Linux (fast start, no main guard needed); ``"spawn"`` elsewhere: Windows has no fork, and on
    macOS fork is unsafe with the system's libraries (spawn is CPython's default there, and TorchRL's and
    gymnasium's). See ``portability.fork_is_safe``."""
    if fork_is_safe() and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def default_spin_s(num_workers: int) -> float:
    """:data:`SPIN_S` up to :data:`SPIN_WORKERS_PER_CORE` workers per usable core, else 0 (block at once: more
    pollers than that take the workers' cores)."""
    return SPIN_S if num_workers <= SPIN_WORKERS_PER_CORE * usable_cores() else 0.0


def resolve_spin_s(spin_s: float | None, num_workers: int) -> float:
    if spin_s is None:
        return default_spin_s(num_workers)
    if not isinstance(spin_s, (int, float)) or spin_s < 0:
        raise ValueError(f"spin_s must be None (automatic) or seconds >= 0, got {spin_s!r}.")
    return float(spin_s)


def exit_if_bootstrapping() -> None:
    """Called first by every constructor that starts workers: inside a worker that is importing an
    unguarded main module, leave quietly with MISSING_GUARD_EXIT (the main process explains)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(MISSING_GUARD_EXIT)


def resolve_start_method(method: str | None, cuda_in_workers: bool = False, owner: str = "tdcollect") -> str:
    """The start method to use. ``cuda_in_workers``: the workers will run CUDA code (a policy on a CUDA device).
    A forked child cannot use CUDA once this process has initialised it, so then the default is ``"forkserver"``
    (``"spawn"`` where the platform has no fork server: either way the script needs a main guard, as with
    TorchRL, whose default is ``"spawn"``), and an explicit ``"fork"`` is refused here, before any worker starts."""
    if method is None:
        if cuda_in_workers:
            return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        return default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"mp_start_method must be one of {START_METHODS}, got {method!r}.")
    if method == "fork" and cuda_in_workers and torch.cuda.is_initialized():
        raise ValueError(f"{owner}: its workers run CUDA code, and a forked process cannot use CUDA once the main "
                         "process has (here it has): pass mp_start_method='forkserver' or 'spawn' (and put the "
                         "script's code under `if __name__ == \"__main__\":`), or leave mp_start_method unset.")
    return method


def caller_threads(before: int, workers: int, num_threads: int | None = None) -> int:
    """This process' torch threads while ``workers`` workers run, as TorchRL sets them: ``num_threads`` if given,
    else one fewer per worker than ``before``, at least 1."""
    return num_threads or max(1, before - workers)


class CallerThreads:
    """This process' torch threads while ``ParallelEnv`` workers run, as TorchRL sets them: one fewer per worker
    (at least 1), or an env's ``num_threads``. Counted over every env running now from the count before the first
    of them started, and back to that count when the last one stops, in whatever order they stop (giving back
    what each env took, a count clamped at 1, left an env closed first handing out threads it never took)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._base: int | None = None
        self._live: dict[int, tuple[int, int | None]] = {}  # id(env) -> (workers, num_threads)

    def take(self, owner: object, workers: int, num_threads: int | None = None) -> None:
        with self._lock:
            if not self._live:
                self._base = torch.get_num_threads()
            self._live[id(owner)] = (workers, num_threads)
            self._apply()

    def give_back(self, owner: object) -> None:
        with self._lock:
            if self._live.pop(id(owner), None) is None:
                return
            if self._live:
                self._apply()
            else:
                torch.set_num_threads(self._base)
                self._base = None

    def _apply(self) -> None:
        chosen = [n for _, n in self._live.values() if n]
        workers = sum(w for w, _ in self._live.values())
        torch.set_num_threads(caller_threads(self._base, workers, chosen[-1] if chosen else None))


#: the one count of this process
CALLER_THREADS = CallerThreads()


def split_envs(num_envs: int, num_workers: int | None, envs_per_worker: int | None, owner: str) -> tuple[int, int]:
    """``(num_workers, envs_per_worker)`` for ``num_envs`` envs: as given (they must multiply to ``num_envs``),
    or by default the largest number of workers that divides ``num_envs`` and fits in the usable cores."""
    for name, value in (("num_workers", num_workers), ("envs_per_worker", envs_per_worker)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{owner}: {name} must be an int >= 1 (or None), got {value!r}.")
    if num_workers is None and envs_per_worker is None:
        cores = usable_cores()
        num_workers = max(d for d in range(1, min(num_envs, cores) + 1) if num_envs % d == 0)
    elif num_workers is None:
        num_workers = num_envs // envs_per_worker
    envs_per_worker = envs_per_worker or num_envs // num_workers
    if num_workers * envs_per_worker != num_envs:
        raise ValueError(f"{owner}: {num_envs} envs cannot be split into num_workers={num_workers} x "
                         f"envs_per_worker={envs_per_worker}; choose values that multiply to {num_envs}.")
    return num_workers, envs_per_worker


def check_start_method(method: str | None, owner: str) -> str | None:
    """``method`` if it is one of this platform's start methods (or None: the engine's default); else the
    ``ValueError`` of ``multiprocessing.get_context``, naming the choices."""
    if method is None:
        return None
    try:
        multiprocessing.get_context(method)
    except ValueError as err:
        raise ValueError(f"{err}: {owner} takes one of {multiprocessing.get_all_start_methods()} "
                         "(or None for the default: 'fork' on Linux, 'spawn' on macOS and Windows).") from None
    return method
