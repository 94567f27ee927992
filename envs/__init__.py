"""Batched TorchRL envs: ``SerialEnv`` (one process), ``ParallelEnv`` (worker processes, shared memory) and
``AsyncParallelEnv`` (the same, plus first-finished-first-served stepping).

The package in layers (``tests/test_layers.py`` keeps them so)::

    envs/            the TorchRL face: BatchedEnv, SerialEnv, ParallelEnv, AsyncParallelEnv, views, rollouts,
                     what a caller's tensordict brings in, forwarding, constructors, autotune, transforms run
                     in the workers, the demo
    envs/engine/     the worker protocol, the pool, the worker body, EnvGroup, shared buffers and the handshake,
                     recycled memory, worker-recorded rollouts, the platform policy, preloads, errors and value
                     checks; the Stepper / Family contract. It knows no env family and no face.
    envs/libs/       one module per env family (gymnasium, TorchRL EnvBase, dm_env, dmlab2d, MeltingPot,
                     PettingZoo); each defines its ``FAMILY``
    envs/vector/     the gymnasium and SB3 faces (numpy in, numpy out) on the same engine

Each subpackage's docstring maps its modules. One ``ParallelEnv.step_and_maybe_reset``: ``batched.BatchedEnv``
checks the actions (``inputs``) and copies them into the shared action buffer -> ``parallel.ParallelEnv`` ->
``engine.pool.WorkerPool.run`` wakes each worker -> in each worker ``engine.protocol.WorkerChannel.serve`` ->
``engine.group.EnvGroup.step`` -> each env's stepper (its family's, ``libs/``) steps it and writes its rows of the
shared buffers -> back in this process, the outputs are built from the buffers (``inputs``, ``engine.recycle``).
"""
from . import view  # noqa: F401 - env[...] of a ParallelEnv: view.py sets ParallelEnv.view_class
from .async_parallel import AsyncParallelEnv
from .engine.group import env_index
from .engine.platform_policy import default_start_method
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
from .libs import register
from .parallel import ParallelEnv
from .serial import SerialEnv
from .transforms.per_env import FAMILY as _PER_ENV_TRANSFORMS
from .tuning import Tuning, autotune
from .worker_transforms import move_transforms_to_workers

register(_PER_ENV_TRANSFORMS)  # (a family on the transforms' layer, above the families of libs/)

__all__ = [
    "ParallelEnv",
    "AsyncParallelEnv",
    "SerialEnv",
    "move_transforms_to_workers",
    "env_index",
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
    # DMLab2dEnv needs the optional dmlab2d package (pip install "tdcollect[dmlab2d]"): imported on first use, and
    # a missing package is said here, at the import, not at the first level built
    if name == "DMLab2dEnv":
        from .libs.dmlab2d import DMLab2dEnv, dmlab2d_module

        dmlab2d_module()

        return DMLab2dEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
