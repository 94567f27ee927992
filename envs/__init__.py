"""Batched TorchRL envs: ``SerialEnv`` (one process), ``ParallelEnv`` (worker processes, shared memory) and
``AsyncParallelEnv`` (the same, plus first-finished-first-served stepping)."""
from . import view  # noqa: F401 - env[...] of a ParallelEnv: view.py sets ParallelEnv.view_class
from .async_parallel import AsyncParallelEnv
from .errors import (
    ArgumentError,
    ConstructorError,
    EnvWorkerError,
    MissingMainGuardError,
    SharedMemoryError,
    SpecMismatchError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from .parallel import ParallelEnv
from .platform_policy import default_start_method
from .serial import SerialEnv
from .tuning import Tuning, autotune

__all__ = [
    "ParallelEnv",
    "AsyncParallelEnv",
    "SerialEnv",
    "autotune",
    "Tuning",
    "default_start_method",
    "WorkerError",
    "EnvWorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "MissingMainGuardError",
    "SpecMismatchError",
    "SharedMemoryError",
    "ArgumentError",
    "ConstructorError",
    "DMLab2dEnv",
]


def __getattr__(name):
    # DMLab2dEnv needs the optional dmlab2d package (pip install "tdcollect[dmlab2d]"): imported on first use
    if name == "DMLab2dEnv":
        from .dmlab2d import DMLab2dEnv

        return DMLab2dEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
