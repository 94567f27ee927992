"""Which costly env families a constructor refers to (imported once before workers start, see engine/preload.py)."""
import functools
import importlib
import importlib.util
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

from tdcollect.envs.engine import preload
from tdcollect.envs.engine.preload import import_now
from tdcollect.envs.libs import costly_imports as families_costly_imports


def costly_imports(fn):
    """What the faces ask: the costly imports of every registered family that ``fn`` refers to."""
    return preload.costly_imports(fn, families_costly_imports())


def imports_itself():
    from meltingpot import substrate  # noqa: F401 - only its name is read, never run here

    return substrate


def torchrl_wrapper(name):
    from torchrl.envs.libs.meltingpot import MeltingpotEnv

    return MeltingpotEnv(name)


def test_constructors_that_refer_to_meltingpot():
    assert costly_imports(imports_itself) == {"meltingpot.substrate"}
    assert costly_imports(lambda: torchrl_wrapper("coins")) == {"meltingpot.substrate"}
    assert costly_imports(functools.partial(torchrl_wrapper, "coins")) == {"meltingpot.substrate"}


def test_constructors_that_do_not():
    assert costly_imports(lambda: gym.make("CartPole-v1")) == set()
    assert costly_imports(functools.partial(gym.make, "CartPole-v1")) == set()
    cycle = []
    cycle.append(lambda: cycle[0])
    assert costly_imports(cycle[0]) == set()


def test_a_module_that_fails_to_import_is_left_to_the_workers():
    import_now(["no_such_module_anywhere", "json"])
    assert "json" in sys.modules


def test_fork_workers_inherit_the_import(no_leaks):
    """A ParallelEnv whose constructor imports a costly family imports it in the main process first (fork)."""
    script = textwrap.dedent("""
        import sys
        import gymnasium as gym
        from tdcollect.envs import ParallelEnv
        from tdcollect.envs.engine.stepper import Family
        from tdcollect.envs.libs import register
        register(Family(name="a family whose import is costly", costly_imports={"tabnanny": "tabnanny"}))
        def make():
            import tabnanny  # noqa: F401
            return gym.make("CartPole-v1")
        assert "tabnanny" not in sys.modules
        env = ParallelEnv(2, make, mp_start_method="fork")
        env.close()
        print("tabnanny" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"  # forked workers only inherit it from there


def test_what_tensordict_imports_at_first_use_is_imported_before_the_fork(no_leaks):
    """tensordict imports pandas and h5py (where installed) the first time it converts a dict, which every TorchRL
    spec's ``zero()`` reaches: the pool imports them before forking its workers, so no forked worker pays for it."""
    missing = [module for module in preload.TENSORDICT_FIRST_USE if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"not installed here: {missing}")
    script = textwrap.dedent("""
        import sys
        import gymnasium as gym
        from tdcollect.envs import ParallelEnv
        assert "pandas" not in sys.modules and "h5py" not in sys.modules
        env = ParallelEnv(2, lambda: gym.make("CartPole-v1"), mp_start_method="fork")
        print("pandas" in sys.modules, "h5py" in sys.modules)
        env.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_tensordict_first_use_lists_only_what_is_installed_and_not_imported(monkeypatch):
    monkeypatch.setattr(preload, "TENSORDICT_FIRST_USE", ("json", "no_such_module_anywhere"))
    monkeypatch.delitem(sys.modules, "json")
    assert preload.tensordict_first_use() == ["json"]
    importlib.import_module("json")
    assert preload.tensordict_first_use() == []
