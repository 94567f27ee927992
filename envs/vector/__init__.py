"""tdcollect's engine behind gymnasium's and Stable-Baselines3's vector-env interfaces: numpy in, numpy out.

- :class:`ParallelVectorEnv` (``gymnasium_vector.py``): a ``gymnasium.vector.VectorEnv`` with ``AsyncVectorEnv``'s
  constructor arguments plus ``envs_per_worker``.
- ``ParallelVecEnv`` (``sb3_vec_env.py``): a ``stable_baselines3`` ``VecEnv``, for
  ``make_vec_env(env_id, n_envs, vec_env_cls=ParallelVecEnv)``. Imported on first use, so importing this
  package never imports Stable-Baselines3.

Both run the envs in ParallelEnv's workers (several envs per worker, shared-memory buffers, semaphores, fault
handling, opt-in restarts); every env is built in its worker, never in this process. Their modules::

    gymnasium_vector.py   ParallelVectorEnv: gymnasium's VectorEnv API, async calls, autoreset modes
    sb3_vec_env.py        ParallelVecEnv: SB3's VecEnv API
    core.py               EngineCore / EngineWorkers: actions in, observations out, over a ParallelEnv
    worker.py             EngineEnv: the user's env inside a worker (autoreset mode, infos, declared calls)
    errors.py             how the faces' errors read (gymnasium's and SB3's exception types)
"""
from .errors import SpaceMismatchError
from .gymnasium_vector import ParallelVectorEnv

__all__ = ["ParallelVectorEnv", "ParallelVecEnv", "SpaceMismatchError"]


def __getattr__(name):
    # the SB3 face needs the optional stable-baselines3 (pip install "tdcollect[sb3]"): imported on first use
    if name == "ParallelVecEnv":
        from .sb3_vec_env import ParallelVecEnv

        return ParallelVecEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
