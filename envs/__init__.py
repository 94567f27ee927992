"""Batched TorchRL envs: ``SerialEnv`` (one process), ``ParallelEnv`` (worker processes, shared memory) and
``AsyncParallelEnv`` (the same, plus first-finished-first-served stepping); the gymnasium and SB3 faces
(``vector.py``, ``sb3_vec_env.py``) on the same engine.

Layers (each module imports only modules of lower floors; ``tests/test_layers.py`` keeps it so)::

    8  vector, sb3_vec_env                              the gymnasium / SB3 faces
    7  vector_core, async_parallel, view, tuning, demo  the faces' engine, async stepping, env[...], autotune
    6  parallel, vector_errors                          ParallelEnv: workers, buffers, restarts; the faces' errors
    5  serial, env_worker, vector_worker                SerialEnv; a worker's process body; the faces' envs in it
    4  batched, pool, group, dmlab2d, dm_players,       BatchedEnv (the TorchRL face), the pool, envs in a process,
       worker_rollout                                   rollouts the workers record
    3  adapters, dm_specs, rollout, platform_policy,    the families' steppers; ParallelEnv's half of the
       handshake                                        start-up handshake
    2  protocol, shared, specs, factories, gym_io, inputs
    1  errors, user_warnings, values, recycle, forwarding, preload, meltingpot_install

Route of one ``ParallelEnv.step`` or ``step_and_maybe_reset`` (5 of our files in this process, 3 in a worker; 6
when it hands out an output slot): ``batched.BatchedEnv._common_step`` (the actions checked by ``inputs``'s value
checks, copied into the action buffer) -> ``parallel.ParallelEnv._run_step`` -> ``pool.WorkerPool.run`` (wake each
worker, ``protocol.Wait`` for each) -> in each worker ``protocol.WorkerChannel.serve`` -> ``group.EnvGroup.step``
-> the family's stepper in ``adapters.py`` (step, auto-reset, write its rows of the shared buffers), then
``env_worker.SlotCopies`` copies its rows of the big "next" leaves into an output slot -> back, the small leaves
copied out with ``inputs.leaf_copier`` into ``inputs.plain_tensordict``s, the big ones handed out from the slot
(``recycle.OutputSlots``). Inputs the common step does not take (partial steps, nested keys, locked or named
tensordicts, actions to cast or outside their spec...) go the general way: ``inputs.checked_actions``, TorchRL's
masks, ``EnvBase.step``. ``ParallelVectorEnv.step`` and ``ParallelVecEnv.step`` (6 of our files in this process)
add the face and ``vector_core.EngineCore`` (actions in, observations out) in front of ``ParallelEnv.begin`` /
``finish`` (``pool.WorkerPool.send`` / ``wait_for``, then ``BatchedEnv._after_step``; not ``inputs``), the pair
their ``step_async`` / ``step_wait`` split (no thread: the workers step meanwhile), and
``vector_worker.EngineEnv`` between the stepper and the user's env: its autoreset mode (``engine_autoreset``, the
steppers' in-step reset) and its infos, posted (``EnvGroup.take_posts``: they come back with the worker's answer,
which a worker sends only when its envs posted something). A ``ParallelEnv.rollout`` with random actions:
``rollout.random_rollout`` ->
``worker_rollout.WorkerRollouts`` (storage every worker maps, one ``ROLL`` per span of steps) -> in each worker
``env_worker.Recording`` steps its envs through the span, writing each step into the storage.
"""
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
from .group import env_index
from .parallel import ParallelEnv
from .platform_policy import default_start_method
from .serial import SerialEnv
from .tuning import Tuning, autotune

__all__ = [
    "ParallelEnv",
    "AsyncParallelEnv",
    "SerialEnv",
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
    # DMLab2dEnv needs the optional dmlab2d package (pip install "tdcollect[dmlab2d]"): imported on first use
    if name == "DMLab2dEnv":
        from .dmlab2d import DMLab2dEnv

        return DMLab2dEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
