"""The fault matrix, measured: for each fault, the error the main process gets, how long it took, and what
was left behind (live worker processes, new ``/dev/shm`` entries).

    python -m benchmarks.fault_matrix                        # every fault: prints a markdown table
    python -m benchmarks.fault_matrix --list                 # the faults' names
    python -m benchmarks.fault_matrix --only segfault --only "bad input"   # names containing either text

Only ``/dev/shm`` entries this process tree made are counted (other programs on the machine make and
remove theirs meanwhile): names this process registered with multiprocessing's resource tracker (named
semaphores, ``SharedMemory`` blocks) and torch's ``torch_<pid>_...`` files of this process or of a process
it started during the cell (its descendants are sampled while the cell runs). Entries made by the separate
scripts two cells run (``main process SIGKILLed``, ``no __main__ guard``) are registered with their own
resource trackers and are not counted.

Each cell runs in this process against a fresh ParallelEnv / MultiSyncCollector; the tests in
``tests/test_faults_env.py``, ``tests/test_faults_collectors.py``, ``tests/test_restarts.py`` and
``tests/test_lifecycle.py`` assert the same behaviour, this script only tabulates it.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import gymnasium as gym
import psutil
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv
from tests.helpers import CountingEnv, CrashOnceEnv, FaultyEnv, OtherShapeEnv, SlowEnv, StuckEnv

long_counting = functools.partial(CountingEnv, episode_len=100)


def _crash(how):
    return [long_counting, functools.partial(CrashOnceEnv, None, how, 3)]


def _env_rollout(factories, **kwargs):
    with ParallelEnv(2, factories, **kwargs) as env:
        env.rollout(10, break_when_any_done=False)


def _collect(factories, **kwargs):
    with MultiSyncCollector(factories, None, frames_per_batch=20, total_frames=100, **kwargs) as collector:
        list(collector)


def _step_with(action):
    with ParallelEnv(2, CountingEnv) as env:
        td = env.reset()
        td["action"] = action
        env.step(td)


def _interrupted_rollout():
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
    _env_rollout(functools.partial(SlowEnv, 0.05))


def _main_killed():
    """Seconds until the workers of a killed main process are all gone (the 'error' is their absence)."""
    script = (f"import sys, time; sys.path.insert(0, {os.getcwd()!r})\nfrom tdcollect.envs import ParallelEnv\n"
              "from tests.helpers import CountingEnv\nif __name__ == '__main__':\n"
              "    env = ParallelEnv(4, CountingEnv)\n    print(*env.worker_pids, flush=True)\n"
              "    time.sleep(60)\n")
    main = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in main.stdout.readline().split()]
    main.kill()
    main.wait()
    start = time.monotonic()
    while any(_running(p) for p in pids) and time.monotonic() - start < 10:
        time.sleep(0.01)
    left = [p for p in pids if _running(p)]
    raise RuntimeError(f"{len(pids)} workers of the killed main process: {len(left)} still running after "
                       f"{time.monotonic() - start:.2f} s")


def _unguarded():
    script = ("import gymnasium as gym\nfrom tdcollect.envs import ParallelEnv\n"
              "env = ParallelEnv(2, lambda: gym.make('CartPole-v1'), mp_start_method='spawn')\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "unguarded.py")
        with open(path, "w") as f:
            f.write(script)
        proc = subprocess.run([sys.executable, path], capture_output=True, text=True, cwd=os.getcwd(),
                              timeout=120, stdin=subprocess.DEVNULL)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line]
    raise RuntimeError(f"the script exited with {proc.returncode}: {errors[-1] if errors else proc.stderr[-200:]}")


CELLS = {
    "ParallelEnv: env raises in constructor": lambda: _env_rollout([CountingEnv, functools.partial(FaultyEnv, "init")]),
    "ParallelEnv: env raises in reset": lambda: _env_rollout([CountingEnv, functools.partial(FaultyEnv, "reset")]),
    "ParallelEnv: env raises in step": lambda: _env_rollout([CountingEnv, functools.partial(FaultyEnv, "step")]),
    "ParallelEnv: worker SIGKILLed in step": lambda: _env_rollout(_crash("kill")),
    "ParallelEnv: os.abort() in step": lambda: _env_rollout(_crash("abort")),
    "ParallelEnv: segfault in step": lambda: _env_rollout(_crash("segfault")),
    "ParallelEnv: step never returns (timeout=2)": lambda: _env_rollout([CountingEnv, StuckEnv], timeout=2),
    "ParallelEnv: Ctrl-C during rollout": _interrupted_rollout,
    "ParallelEnv: main process SIGKILLed": _main_killed,
    "ParallelEnv: no __main__ guard under spawn": _unguarded,
    "MultiSyncCollector: env raises in step": lambda: _collect([CountingEnv, functools.partial(FaultyEnv, "step")]),
    "MultiSyncCollector: worker SIGKILLed": lambda: _collect(_crash("kill")),
    "MultiSyncCollector: step never returns (timeout=2)": lambda: _collect([CountingEnv, StuckEnv], timeout=2),
    "bad input: action of wrong shape": lambda: _step_with(torch.tensor([[1], [1]])),
    "bad input: action of wrong dtype": lambda: _step_with(torch.tensor([1.0, 1.0])),
    "bad input: discrete action out of range": lambda: _step_with(torch.tensor([1, 7])),
    "bad input: env instance": lambda: ParallelEnv(2, gym.make("CartPole-v1")),
    "bad input: non-callable factory": lambda: ParallelEnv(2, "CartPole-v1"),
    "bad input: factories disagree on specs": lambda: ParallelEnv(2, [CountingEnv, OtherShapeEnv]),
    "bad input: num_workers < 1": lambda: ParallelEnv(0, CountingEnv),
}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if _running(p.pid) and "resource_tracker" not in " ".join(p.cmdline())}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


# ----------------------------------------------------------------- which /dev/shm entries are ours
#: every /dev/shm name this process ever registered with multiprocessing's resource tracker
_REGISTERED: set[str] = set()
_TORCH_SHM = re.compile(r"^torch_(\d+)_")
_RESOURCE_PREFIX = {"semaphore": "sem.", "shared_memory": ""}


def _track_registrations() -> None:
    """Remember (once per process) the names of the named semaphores and SharedMemory blocks this process
    registers with multiprocessing's resource tracker, as their /dev/shm entry names."""
    from multiprocessing import resource_tracker

    if getattr(resource_tracker.register, "_fault_matrix", False):
        return
    register = resource_tracker.register

    def tracked_register(name, rtype):
        if rtype in _RESOURCE_PREFIX:
            _REGISTERED.add(_RESOURCE_PREFIX[rtype] + name.lstrip("/"))
        return register(name, rtype)

    tracked_register._fault_matrix = True
    resource_tracker.register = tracked_register


def _descendants(pid: int) -> set[int]:
    """Pids of ``pid``'s live descendants (from ``/proc/<pid>/task/<tid>/children``; psutil elsewhere)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid and not os.path.isdir("/proc"):
                return {p.pid for p in psutil.Process(pid).children(recursive=True)}
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = {int(c) for c in f.read().split()}
            except OSError:
                continue
            todo.extend(children - found)
            found |= children
    return found


class _PidSampler(threading.Thread):
    """Collects the pids of this process's descendants every ``interval`` seconds until ``stop()``, so
    that workers which were started and ended within a cell are known afterwards."""

    def __init__(self, interval: float = 0.01):
        super().__init__(daemon=True)
        self.interval, self.pids = interval, {os.getpid()}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.pids |= _descendants(os.getpid())
            self._stop_event.wait(self.interval)

    def stop(self) -> set[int]:
        self._stop_event.set()
        self.join()
        return self.pids | _descendants(os.getpid())


def ours(entries: set[str], pids: set[int]) -> set[str]:
    """The ``entries`` this process tree made: registered by this process (see :func:`_track_registrations`)
    or torch files ``torch_<pid>_...`` of a process in ``pids``."""
    out = set()
    for name in entries:
        match = _TORCH_SHM.match(name)
        if name in _REGISTERED or (match and int(match.group(1)) in pids):
            out.add(name)
    return out


def measure(cell) -> dict:
    _track_registrations()
    children, shm = _children(), _shm()
    sampler = _PidSampler()
    sampler.start()
    start = time.monotonic()
    try:
        cell()
        error = "(no error!)"
    except BaseException as exc:  # noqa: BLE001 - every error is what we tabulate
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    seconds = time.monotonic() - start
    time.sleep(0.2)
    pids = sampler.stop()
    return {"error": error, "seconds": seconds, "processes": len(_children() - children),
            "segments": len(ours(_shm() - shm, pids))}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fault_matrix",
        description="Run each fault against a fresh ParallelEnv / MultiSyncCollector and print a markdown "
                    "table: the error the main process gets, the time to it, and the worker processes and "
                    "/dev/shm entries (of this process tree) left behind.",
    )
    parser.add_argument("--only", action="append", metavar="TEXT", default=None,
                        help="run only the faults whose name contains TEXT (case-insensitive); repeat to add "
                             "more, e.g. --only segfault --only 'bad input'")
    parser.add_argument("--list", action="store_true", help="print the faults' names and exit")
    args = parser.parse_args(argv)
    args.cells = select(args.only)
    if not args.cells:
        parser.error(f"no fault's name contains any of {args.only}; --list shows the names")
    return args


def select(only: list[str] | None) -> dict:
    """The cells whose name contains one of ``only`` (case-insensitive); all of them for None."""
    if not only:
        return dict(CELLS)
    wanted = [text.lower() for text in only]
    return {name: cell for name, cell in CELLS.items() if any(text in name.lower() for text in wanted)}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.list:
        print("\n".join(args.cells))
        return
    print("| fault | error in the main process | time to error (s) | leaked processes | leaked /dev/shm |")
    print("|---|---|---:|---:|---:|")
    for name, cell in args.cells.items():
        r = measure(cell)
        error = r["error"].replace("|", "/")[:110]
        print(f"| {name} | {error} | {r['seconds']:.2f} | {r['processes']} | {r['segments']} |", flush=True)


if __name__ == "__main__":
    main()
