"""tdcollect installs one top-level package, ``tdcollect``: a project with its own ``envs/`` and
``collectors/`` packages (most RL repositories have an ``envs/`` folder) imports both side by side."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import envs, collectors                      # the project's own packages
from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv

assert envs.MINE and collectors.MINE, "the project's own packages were shadowed"
assert not hasattr(envs, "ParallelEnv")

if __name__ == "__main__":
    # spawn: every worker imports this script again, inside this project, next to its envs/ package
    with ParallelEnv(1, envs.make, envs_per_worker=2, mp_start_method="spawn") as env:
        rollout = env.rollout(3, break_when_any_done=False)
    assert rollout.batch_size == (2, 3), rollout.batch_size
    collector = MultiSyncCollector([envs.make], frames_per_batch=4, total_frames=4, mp_start_method="spawn")
    batches = list(collector)
    collector.shutdown()
    assert batches[0].batch_size == (1, 4), batches[0].batch_size
    print("side by side ok")
"""


def _project(tmp_path):
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        MINE = True

        def make():
            return gym.make("CartPole-v1")
    """))
    (tmp_path / "collectors").mkdir()
    (tmp_path / "collectors" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def test_own_envs_package_and_tdcollect_import_side_by_side(tmp_path):
    project = _project(tmp_path)
    proc = subprocess.run([sys.executable, "train.py"], cwd=project, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "side by side ok" in proc.stdout


def test_no_generic_top_level_packages_are_installed(tmp_path):
    code = ("import importlib.util as u; import tdcollect.envs, tdcollect.collectors; "
            "print(u.find_spec('envs'), u.find_spec('collectors'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["None", "None"]
