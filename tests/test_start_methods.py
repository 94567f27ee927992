"""fork / forkserver / spawn, closures under each, and the missing main guard."""
import subprocess
import sys
import textwrap

import pytest
import torch

from tdcollect.envs import ParallelEnv, SerialEnv, default_start_method
from tests.helpers import CountingEnv

#: a spawned script starts torch in its workers: a minute or more on a busy 2-core machine
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_closures_work_under_every_start_method(method, no_leaks):
    episode_len = 3  # captured by the closure below

    def factory():
        return CountingEnv(episode_len=episode_len)

    with ParallelEnv(2, lambda: factory(), mp_start_method=method, envs_per_worker=2) as env:
        assert env.start_method == method
        env.set_seed(0)
        torch.manual_seed(0)
        par = env.rollout(7, break_when_any_done=False)
    with SerialEnv(4, factory) as ser:
        ser.set_seed(0)
        torch.manual_seed(0)
        assert (ser.rollout(7, break_when_any_done=False) == par).all()
    assert par["next", "done"][:, 2].all()


def test_default_start_method_is_fork_on_linux():
    assert default_start_method() == ("fork" if sys.platform.startswith("linux") else "spawn")


SCRIPT = """
import gymnasium as gym
from tdcollect.envs import ParallelEnv
env = ParallelEnv(2, lambda: gym.make("CartPole-v1"), mp_start_method={method!r})
print("rollout", env.rollout(3).batch_size)
env.close()
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_missing_main_guard_gives_one_clear_message(method, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(SCRIPT.format(method=method)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert proc.stderr.count('if __name__ == "__main__":') == 1, proc.stderr
    assert "tdcollect.envs.errors.MissingMainGuardError: " in proc.stderr
    assert "During handling" not in proc.stderr
    assert "bootstrapping phase" not in proc.stderr


def test_guarded_script_runs_under_spawn(tmp_path):
    body = textwrap.indent(textwrap.dedent(SCRIPT.format(method="spawn")), "    ")
    script = tmp_path / "guarded.py"
    script.write_text('if __name__ == "__main__":\n' + body)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "rollout torch.Size([2, 3])" in proc.stdout


def test_workers_that_run_cuda_do_not_fork(monkeypatch):
    """A forked child cannot use CUDA once the parent has: a policy on a CUDA device makes the collectors' default
    the fork server, an explicit 'fork' is refused before anything starts, and the error of a forked worker that
    touched CUDA says what to pass."""
    from torch import nn

    from tdcollect.collectors.policies import runs_cuda
    from tdcollect.envs.engine.errors import EnvWorkerError
    from tdcollect.envs.engine.platform_policy import resolve_start_method

    assert runs_cuda("cuda:0", None) and runs_cuda(torch.device("cuda"), nn.Linear(2, 2))
    assert not runs_cuda(None, nn.Linear(2, 2)) and not runs_cuda("cpu", None) and not runs_cuda(None, None)
    assert resolve_start_method(None, cuda_in_workers=True) == "forkserver"
    assert resolve_start_method(None) == default_start_method()
    assert resolve_start_method("spawn", cuda_in_workers=True) == "spawn"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="MultiSyncCollector: its workers run CUDA code.*mp_start_method='forkserver'"):
        resolve_start_method("fork", cuda_in_workers=True, owner="MultiSyncCollector")
    assert resolve_start_method("fork") == "fork"  # CPU workers fork as before
    err = EnvWorkerError(0, "RuntimeError", "Cannot re-initialize CUDA in forked subprocess. To use CUDA ...", "tb",
                         "construction")
    assert "pass mp_start_method='forkserver' or 'spawn'" in str(err)
    assert "mp_start_method" not in str(EnvWorkerError(0, "ValueError", "bad", "tb", "step"))
