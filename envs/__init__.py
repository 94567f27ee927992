"""Batched TorchRL envs: ``SerialEnv`` (one process) and ``ParallelEnv`` (worker processes, shared memory)."""
from .errors import (
    EnvWorkerError,
    MissingMainGuardError,
    SpecMismatchError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from .parallel import ParallelEnv
from .pool import default_start_method
from .serial import SerialEnv

__all__ = [
    "ParallelEnv",
    "SerialEnv",
    "default_start_method",
    "WorkerError",
    "EnvWorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "MissingMainGuardError",
    "SpecMismatchError",
]
