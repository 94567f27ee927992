"""The errors a user of ``tdcollect.envs`` can catch. They are defined in ``engine/errors.py``, where the engine raises
them, and named after this module (``tdcollect.envs.errors.WorkerDiedError`` in a traceback): the path to import."""
from .engine.errors import (
    ArgumentError,
    ConstructorError,
    EnvWorkerError,
    MissingMainGuardError,
    OpenFilesError,
    SharedMemoryError,
    SpecMismatchError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)

__all__ = [
    "WorkerError",
    "EnvWorkerError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "MissingMainGuardError",
    "SpecMismatchError",
    "SharedMemoryError",
    "OpenFilesError",
    "ArgumentError",
    "ConstructorError",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
