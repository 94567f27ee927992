"""Which costly env families a constructor refers to (imported once before workers start, see preload.py)."""
import functools
import subprocess
import sys
import textwrap

import gymnasium as gym

from tdcollect.envs.preload import costly_imports, import_now


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
        from unittest import mock
        import gymnasium as gym
        from tdcollect.envs import ParallelEnv, preload
        with mock.patch.dict(preload.COSTLY_FAMILIES, {"tabnanny": "tabnanny"}):
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
