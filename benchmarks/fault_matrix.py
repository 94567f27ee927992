"""The fault matrix, measured: for each fault, the error the main process gets, how long it took, and what
was left behind (live worker processes, new ``/dev/shm`` entries).

    python -m benchmarks.fault_matrix            # prints a markdown table

Each cell runs in this process against a fresh ParallelEnv / MultiSyncCollector; the tests in
``tests/test_faults.py``, ``tests/test_reliability.py`` and ``tests/test_collectors_faults.py`` assert
the same behaviour, this script only tabulates it.
"""
from __future__ import annotations

import functools
import os
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
    script = ("import sys, time; sys.path.insert(0, %r)\nfrom tdcollect.envs import ParallelEnv\n"
              "from tests.helpers import CountingEnv\nif __name__ == '__main__':\n"
              "    env = ParallelEnv(4, CountingEnv)\n    print(*env.worker_pids, flush=True)\n"
              "    time.sleep(60)\n" % os.getcwd())
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
    return set(os.listdir("/dev/shm"))


def measure(cell) -> dict:
    children, shm = _children(), _shm()
    start = time.monotonic()
    try:
        cell()
        error = "(no error!)"
    except BaseException as exc:  # noqa: BLE001 - every error is what we tabulate
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    seconds = time.monotonic() - start
    time.sleep(0.2)
    return {"error": error, "seconds": seconds, "processes": len(_children() - children),
            "segments": len(_shm() - shm)}


def main() -> None:
    print("| fault | error in the main process | time to error (s) | leaked processes | leaked /dev/shm |")
    print("|---|---|---:|---:|---:|")
    for name, cell in CELLS.items():
        r = measure(cell)
        error = r["error"].replace("|", "/")[:110]
        print(f"| {name} | {error} | {r['seconds']:.2f} | {r['processes']} | {r['segments']} |", flush=True)


if __name__ == "__main__":
    main()
