"""pytest plugin: run TorchRL's own env tests with tdcollect's ParallelEnv in place of TorchRL's.

``TDSWAP=torchrl`` keeps TorchRL's class (the reference run). ``TDSWAP_ONLY_PARALLEL=1`` keeps only the tests whose
source mentions ``ParallelEnv`` (or builds one through ``_make_envs`` / the ``maybe_fork_ParallelEnv`` fixture).
"""
import inspect
import os


def pytest_configure(config):
    import torchrl.envs
    import torchrl.envs.batched_envs

    if os.environ.get("TDSWAP", "ours") == "ours":
        from tdcollect.envs import ParallelEnv

        torchrl.envs.ParallelEnv = ParallelEnv  # what the test modules import, and the fixture's class
        torchrl.envs.batched_envs.ParallelEnv = ParallelEnv


def _builds_a_parallel_env(item) -> bool:
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        source = ""
    return ("ParallelEnv" in source or "_make_envs" in source
            or "maybe_fork_ParallelEnv" in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("TDSWAP_ONLY_PARALLEL"):
        return
    keep = [item for item in items if _builds_a_parallel_env(item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep
