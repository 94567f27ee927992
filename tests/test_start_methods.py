"""fork / forkserver / spawn, closures under each, and the missing main guard."""
import subprocess
import sys
import textwrap

import pytest
import torch

from tdcollect.envs import ParallelEnv, SerialEnv, default_start_method
from tests.helpers import CountingEnv

pytestmark = pytest.mark.timeout(90)


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
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=80)
    assert proc.returncode != 0
    assert proc.stderr.count('if __name__ == "__main__":') == 1, proc.stderr
    assert "tdcollect.envs.errors.MissingMainGuardError: " in proc.stderr
    assert "During handling" not in proc.stderr
    assert "bootstrapping phase" not in proc.stderr


def test_guarded_script_runs_under_spawn(tmp_path):
    body = textwrap.indent(textwrap.dedent(SCRIPT.format(method="spawn")), "    ")
    script = tmp_path / "guarded.py"
    script.write_text('if __name__ == "__main__":\n' + body)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stderr
    assert "rollout torch.Size([2, 3])" in proc.stdout
