"""The platform promises, in one file that runs on every platform: in the Linux suite, in the Windows tier (a real
Windows CPython under Wine: ``.ci/windows/run``) and in the macOS-semantics tier (``.ci/macos/run``: macOS' semaphore,
``/dev/shm``, ``memfd`` and open-file semantics imitated on Linux, spawn). Cases are few and each starts few workers:
a spawned worker under Wine takes 10-30 s to import torch.

What it holds: the README's Python blocks run unmodified; a native engine that allows one instance per process runs
4-wide in 4 processes (``ParallelEnv`` and the SB3 face) with the data of each engine run alone, and two instances
in one worker are the engine's own error in this process; an unguarded ``MultiSyncCollector`` script under spawn
ends in one message naming the guard, a non-zero exit status, nothing left behind; a worker's exception comes back
with its traceback, a killed worker is a ``WorkerDiedError`` with its exit code, a hung step times out,
``max_restarts`` replaces a worker, an interrupt (Ctrl-C) ends the wait and ``close()`` leaves no process."""
from __future__ import annotations

import _thread
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch

from tdcollect.envs import ParallelEnv, default_start_method
from tdcollect.envs.engine.group import seed_chain
from tdcollect.envs.errors import EnvWorkerError, WorkerDiedError, WorkerTimeoutError
from tests.conftest import live_children, wait_gone
from tests.native_engine.engine import EngineInUseError, OneInstanceEngineEnv, library_path_for_this_platform

ROOT = Path(__file__).resolve().parents[1]
#: every case's limit: a Windows worker's start under Wine takes up to ~30 s
pytestmark = pytest.mark.timeout(300)
#: the start method each case uses: the platform's default, except on Linux, where the spawn road is the one the
#: other platforms take (the Linux default, fork, is covered by the rest of the suite)
START = "spawn" if sys.platform.startswith("linux") else None
SEED = 7
STEPS = 30


def children_left(within: float = 10.0) -> list[int]:
    """Child processes of this one still running after up to ``within`` seconds (multiprocessing's resource tracker
    and fork server left out)."""
    return wait_gone([child.pid for child in live_children()], within)


@pytest.fixture(scope="module")
def engine_path(tmp_path_factory) -> str:
    return library_path_for_this_platform(str(tmp_path_factory.mktemp("engine")))


def make_engine(path: str) -> OneInstanceEngineEnv:
    return OneInstanceEngineEnv(path)


def fixed_actions(num_envs: int) -> np.ndarray:
    """``[STEPS, num_envs]`` actions in {0, 1, 2}, the same on every platform."""
    return np.random.default_rng(0).integers(0, 3, size=(STEPS, num_envs))


def alone(path: str, seed: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    """One engine in this process, reset with ``seed``, stepped with ``actions`` and reset (unseeded) when an episode
    ends, as the batched envs auto-reset: the observations acted on, and each step's next observation, reward and
    done."""
    env = OneInstanceEngineEnv(path)
    try:
        obs, _ = env.reset(seed=seed)
        out = {"observation": [], "next_observation": [], "reward": [], "done": []}
        for action in actions:
            out["observation"].append(obs)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            out["next_observation"].append(next_obs)
            out["reward"].append(reward)
            out["done"].append(terminated or truncated)
            obs = env.reset()[0] if terminated or truncated else next_obs
    finally:
        env.close()
    return {key: np.asarray(value) for key, value in out.items()}


def test_the_default_start_method_is_spawn_where_fork_is_unsafe(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["fork", "spawn", "forkserver"])
    assert default_start_method() == "spawn"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert default_start_method() == "spawn"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["fork", "spawn", "forkserver"])
    assert default_start_method() == "fork"


def test_the_readme_python_blocks_run_unmodified(tmp_path):
    """Every ```python block of the README, as written, in one script (each block under its own main guard: one
    interpreter start instead of three, which under Wine is 20 s each)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert len(blocks) >= 3
    script = tmp_path / "readme_blocks.py"
    script.write_text("\n\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch.Size([8, 100, 1])" in done.stdout, done.stdout
    assert children_left() == []


def test_one_instance_engines_in_four_processes_give_each_engines_own_data(engine_path):
    actions = fixed_actions(4)
    with ParallelEnv(4, make_engine, {"path": engine_path}, mp_start_method=START) as env:
        env.set_seed(SEED)
        td = env.reset()
        rows = {"observation": [], "next_observation": [], "reward": [], "done": []}
        for t in range(STEPS):
            td["action"] = torch.as_tensor(actions[t]).reshape(env.action_spec.shape)
            rows["observation"].append(td["observation"].clone())
            out, td = env.step_and_maybe_reset(td)
            rows["next_observation"].append(out["next", "observation"].clone())
            rows["reward"].append(out["next", "reward"].reshape(4).clone())
            rows["done"].append(out["next", "done"].reshape(4).clone())
    ours = {key: torch.stack(value, 1).numpy() for key, value in rows.items()}  # [4, STEPS, ...]
    for i, seed in enumerate(seed_chain(SEED, 4)):  # TorchRL's seeds: env i + 1 gets seed_generator(env i's)
        single = alone(engine_path, seed, actions[:, i])
        for key, value in single.items():
            np.testing.assert_array_equal(ours[key][i], value, err_msg=f"env {i}, {key}")
    assert children_left() == []


def test_the_sb3_face_steps_one_engine_per_process(engine_path):
    pytest.importorskip("stable_baselines3", reason="the SB3 face needs stable-baselines3")
    from tdcollect.envs.vector import ParallelVecEnv

    actions = fixed_actions(4)
    env = ParallelVecEnv([lambda: OneInstanceEngineEnv(engine_path)] * 4, START, envs_per_worker=1)
    try:
        env.seed(SEED)
        obs = env.reset()
        seen = [obs.copy()]
        for t in range(STEPS):
            obs, rewards, dones, infos = env.step(actions[t])
            seen.append(np.where(dones[:, None], np.stack([i["terminal_observation"] if d else o for i, d, o in
                                                            zip(infos, dones, obs)]), obs))
    finally:
        env.close()
    for i in range(4):
        single = alone(engine_path, SEED + i, actions[:, i])  # SB3's seeds: env i gets seed + i
        np.testing.assert_array_equal(seen[0][i], single["observation"][0])
        np.testing.assert_array_equal(np.stack([s[i] for s in seen[1:]]), single["next_observation"])
    assert children_left() == []


def test_two_engines_in_one_worker_are_the_engines_own_error_here(engine_path):
    with pytest.raises(EnvWorkerError) as caught:
        ParallelEnv(1, make_engine, {"path": engine_path}, envs_per_worker=2, mp_start_method=START)
    message = str(caught.value)
    assert EngineInUseError.__name__ in message and "one instance per process" in message, message
    assert "worker 0" in message, message
    assert children_left() == []


UNGUARDED = """\
import gymnasium as gym

from tdcollect.collectors import MultiSyncCollector

collector = MultiSyncCollector([lambda: gym.make("CartPole-v1")] * 2, None, frames_per_batch=64, total_frames=128,
                               {start})
for batch in collector:
    print(batch.batch_size)
collector.shutdown()
"""


def test_an_unguarded_multisync_script_names_the_guard_and_leaves_nothing(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED.format(start="" if START is None else f"mp_start_method={START!r}"))
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode != 0
    assert done.stderr.count("MissingMainGuardError") == 1, done.stderr[-3000:]
    assert 'if __name__ == "__main__":' in done.stderr
    assert time.monotonic() - began < 240
    assert children_left() == []
    left = [p.pid for p in psutil.process_iter() if _runs(p, str(script))]
    assert left == [], left


def _runs(process: psutil.Process, script: str) -> bool:
    try:
        return any(script in part for part in process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return False


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class FaultEnv(gym.Env):
    """obs = [steps]; action 0 steps, 1 raises ``ValueError``, 2 hangs for an hour."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if action == 1:
            raise ValueError("boom on purpose")
        if action == 2:
            time.sleep(3600)
        self.count += 1
        return np.array([self.count], np.float32), 1.0, False, False, {}


def step_with(env, actions) -> torch.Tensor:
    td = env.reset()
    td["action"] = torch.as_tensor(actions).reshape(env.action_spec.shape)
    return env.step(td)["next", "observation"]


def test_an_interrupt_a_worker_exception_and_a_killed_worker_reach_this_process(ctrl_c_raises):
    env = ParallelEnv(2, FaultEnv, mp_start_method=START, spin_s=0)
    try:
        timer = threading.Timer(1.0, _thread.interrupt_main)  # Ctrl-C, as the main thread receives it
        timer.start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            step_with(env, [2, 0])  # worker 0 hangs: the main process blocks on it
        assert time.monotonic() - began < 10
        env.close()
        assert children_left() == []  # Ctrl-C, then close: the workers are gone
        env = ParallelEnv(2, FaultEnv, mp_start_method=START)
        with pytest.raises(EnvWorkerError) as caught:
            step_with(env, [0, 1])
        message = str(caught.value)
        assert "worker 1" in message and "ValueError" in message and "boom on purpose" in message, message
        assert "Traceback" in message and "in step" in message, message
        assert step_with(env, [0, 0]).reshape(-1).tolist() == [1.0, 1.0]  # the env goes on
        victim = env._pool.pids[1]
        psutil.Process(victim).kill()  # (SIGKILL; TerminateProcess on Windows)
        began = time.monotonic()
        with pytest.raises(WorkerDiedError) as died:
            step_with(env, [0, 0])
        assert time.monotonic() - began < 10
        assert died.value.worker == 1 and died.value.exitcode not in (None, 0), died.value
        assert "exit code" in str(died.value)
    finally:
        env.close()
    assert children_left() == []


def test_max_restarts_replaces_a_failing_worker_and_a_hung_step_times_out():
    env = ParallelEnv(2, FaultEnv, mp_start_method=START, max_restarts=1)
    try:
        with pytest.warns(RuntimeWarning, match="restarting worker 1"):
            out = step_with(env, [0, 1])
        assert env.restarts == [0, 1]
        assert out.reshape(-1).tolist()[0] == 1.0
        assert step_with(env, [0, 0]).reshape(-1).tolist() == [1.0, 1.0]
        env._pool.timeout = 3.0  # (set now: a worker's start under Wine takes longer than a step may)
        began = time.monotonic()
        with pytest.raises(WorkerTimeoutError):  # the budget is spent: the error itself
            step_with(env, [2, 0])
        assert 2.5 < time.monotonic() - began < 30
    finally:
        env.close()
    assert children_left() == []


TORCHRL_SCRIPT = """\
import sys

import gymnasium as gym
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import ParallelEnv


def make_env():
    return gym.make("CartPole-v1")


def ours(obj):
    return any(base.__module__.startswith("tdcollect.") for base in type(obj).__mro__)


if __name__ == "__main__":
    env = ParallelEnv(2, make_env, **({"mp_start_method": sys.argv[1]} if len(sys.argv) > 1 else {}))
    print("env ours", ours(env), tuple(env.rollout(5)["next", "reward"].shape))
    env.close()
    collector = MultiSyncCollector([make_env] * 2, None, frames_per_batch=32, total_frames=64)
    print("collector ours", ours(collector), sum(batch.numel() for batch in collector))
    collector.shutdown()
    sys.exit(3)
"""


def test_tdcollect_run_replaces_torchrls_classes_in_a_spawned_script(tmp_path):
    """``tdcollect run`` (a ``sitecustomize`` on ``PYTHONPATH`` for the processes the script starts) on a TorchRL
    script, under this platform's start method: our classes, the script's output and exit status."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRL_SCRIPT)
    method = () if START is None else (START,)
    done = subprocess.run([sys.executable, "-m", "tdcollect", "run", str(script), *method], cwd=tmp_path,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "env ours True (2, 5, 1)" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "collector ours True 64" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "tdcollect run:" in done.stderr
    assert children_left() == []


OUT_OF_FILES = """\
import resource
import sys

import gymnasium as gym

from tdcollect.envs import ParallelEnv
from tdcollect.envs.errors import OpenFilesError

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))  # (the hard limit too: it cannot be raised back)
    try:
        ParallelEnv(12, lambda: gym.make("CartPole-v1"), mp_start_method=sys.argv[1])
    except OpenFilesError as err:
        print("OpenFilesError:", err)
        sys.exit(0)
    sys.exit("started: no error")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no small limit on open files (handles)")
def test_too_few_open_files_is_one_error_that_names_the_limit(tmp_path):
    """macOS allows 256 open files; a process whose hard limit is below what its workers and buffers need gets one
    ``OpenFilesError`` naming the limit and the fix (where the hard limit allows, the soft one is raised first)."""
    script = tmp_path / "few_files.py"
    script.write_text(OUT_OF_FILES)
    done = subprocess.run([sys.executable, str(script), START or "spawn"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "at most 40" in done.stdout and "ulimit -n" in done.stdout, done.stdout
    assert children_left() == []


def test_the_asynchronous_env_worker_transforms_and_the_asynchronous_collector_run_here():
    """The rest of the engine's roads on this platform: ``AsyncParallelEnv`` (first finished, first served), a
    worker transform (TorchRL's ``StepCounter`` in each worker) and ``MultiAsyncCollector``."""
    from torchrl.envs import StepCounter

    from tdcollect.collectors import MultiAsyncCollector
    from tdcollect.envs import AsyncParallelEnv

    with AsyncParallelEnv(2, make_cartpole, batch_workers=1, mp_start_method=START) as env:
        env.async_reset()
        seen = []
        for _ in range(6):
            td = env.recv()
            seen.extend(td["env_ids"].tolist())
            td["action"] = torch.zeros_like(td["env_ids"])
            env.send(td)
        assert sorted(set(seen)) == [0, 1]
    with ParallelEnv(2, make_cartpole, mp_start_method=START, worker_transform=StepCounter()) as env:
        rollout = env.rollout(4, break_when_any_done=False)
        assert rollout["next", "step_count"].reshape(2, 4).tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]
    collector = MultiAsyncCollector([make_cartpole] * 2, None, frames_per_batch=8, total_frames=32,
                                    mp_start_method=START)
    try:
        frames = sum(batch.numel() for batch in collector)
    finally:
        collector.shutdown()
    assert frames == 32
    assert children_left() == []
