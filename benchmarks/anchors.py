"""Reference ("anchor") systems the project is compared against.

Every ``run_<system>(workload, num_envs, num_workers, steps)`` steps
``num_envs`` copies of a workload for ``steps`` batched steps with random
actions (repeated until at least ``tdstyle.MIN_TIMED_SECONDS`` are timed),
after a warm-up (reset + a few steps), and returns a result record
(see :func:`benchmarks.tdstyle.result`) whose ``steps_per_s`` counts env
steps (``num_envs`` x batched steps) per second.  Each run closes every
process it starts.

Notes on process counts:

* ``serial`` runs all envs in the calling process (``num_workers`` = 0);
  it is the reference every other system is divided by.  It uses
  gymnasium's default ``NEXT_STEP`` autoreset, which does not step an env on
  the call after its episode ended; ``serial_same_step`` steps and resets it
  in one call, as we and TorchRL do (the same work per counted step).
* ``gym_async`` and ``sb3_subproc`` cannot place several envs in one
  worker: they always start one process per env, so their records report
  ``num_workers = num_envs`` and ``envs_per_worker = 1`` whatever worker
  count was requested.
* Importing TorchRL sets the global multiprocessing start method to
  ``spawn``; the gymnasium and SB3 runs therefore name ``fork`` explicitly,
  while the TorchRL runs keep TorchRL's own default.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from . import tdstyle
from .tdstyle import result
from .workloads import WORKLOADS

WARMUP_STEPS = 10
#: Start method for the gymnasium and SB3 subprocess vector envs.
FORK = "fork"


def _env_fns(workload: str, num_envs: int):
    return [WORKLOADS[workload]] * num_envs


def _random_actions(space, num_envs: int, steps: int, seed: int = 0):
    """Pre-draw every batch of actions (``[steps, num_envs, ...]``) for one env's action ``space`` (Discrete or
    Box), so sampling costs nothing when timed."""
    rng = np.random.default_rng(seed)
    if hasattr(space, "n"):
        return rng.integers(0, int(space.n), size=(steps, num_envs), dtype=np.int64)
    low, high = np.broadcast_arrays(space.low, space.high)
    return rng.uniform(low, high, size=(steps, num_envs, *space.shape)).astype(space.dtype)


def _time_numpy_vec(step, space, num_envs: int, steps: int):
    """Warm up, then time ``step(actions)`` over random action batches.

    The ``steps`` pre-drawn batches are replayed until at least
    :data:`~benchmarks.tdstyle.MIN_TIMED_SECONDS` have elapsed.
    Returns ``(batched_steps_done, seconds)``.
    """
    for actions in _random_actions(space, num_envs, WARMUP_STEPS, seed=1):
        step(actions)
    actions = _random_actions(space, num_envs, steps)
    done, seconds = 0, 0.0
    start = time.perf_counter()
    while seconds < tdstyle.MIN_TIMED_SECONDS:
        for batch in actions:
            step(batch)
        done += steps
        seconds = time.perf_counter() - start
    return done, seconds


# --------------------------------------------------------------- builders
def build_serial(workload: str, num_envs: int, num_workers: int = 0, same_step: bool = False):
    """gymnasium ``SyncVectorEnv`` of ``num_envs`` envs (no workers); ``same_step``: with ``SAME_STEP`` autoreset
    (else gymnasium's default, ``NEXT_STEP``)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    mode = AutoresetMode.SAME_STEP if same_step else AutoresetMode.NEXT_STEP
    return SyncVectorEnv(_env_fns(workload, num_envs), autoreset_mode=mode)


def build_gym_async(workload: str, num_envs: int, num_workers: int = 0):
    """gymnasium ``AsyncVectorEnv`` over shared memory, one process per env."""
    from gymnasium.vector import AsyncVectorEnv

    return AsyncVectorEnv(_env_fns(workload, num_envs), shared_memory=True,
                          context=FORK)


def build_sb3_subproc(workload: str, num_envs: int, num_workers: int = 0):
    """stable-baselines3 ``SubprocVecEnv``, one forked process per env."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return SubprocVecEnv(_env_fns(workload, num_envs), start_method=FORK)


def torchrl_wrapped_env(workload: str):
    """One workload env as a TorchRL ``GymWrapper`` (categorical actions)."""
    from torchrl.envs import GymWrapper

    return GymWrapper(WORKLOADS[workload](), categorical_action_encoding=True)


def torchrl_worker_env(workload: str, envs_per_worker: int):
    """The env one TorchRL worker owns: one env, or a ``SerialEnv`` of them."""
    from torchrl.envs import SerialEnv

    if envs_per_worker == 1:
        return torchrl_wrapped_env(workload)
    return SerialEnv(envs_per_worker,
                     functools.partial(torchrl_wrapped_env, workload))


def _torchrl_worker_factory(workload: str, envs_per_worker: int):
    return functools.partial(torchrl_worker_env, workload, envs_per_worker)


def _torchrl_make_parallel(workload, num_workers, envs_per_worker):
    from torchrl.envs import ParallelEnv

    return ParallelEnv(num_workers,
                       _torchrl_worker_factory(workload, envs_per_worker))


def torchrl_backend() -> tdstyle.Backend:
    """The TorchRL callables used by the ``torchrl_*`` systems."""
    from torchrl.collectors import MultiSyncCollector
    from torchrl.envs.utils import step_mdp

    return tdstyle.Backend(
        name="torchrl", make_parallel=_torchrl_make_parallel,
        worker_env_factory=_torchrl_worker_factory,
        multi_sync_collector=MultiSyncCollector, step_mdp=step_mdp,
    )


def build_torchrl_parallel(workload: str, num_envs: int, num_workers: int):
    """TorchRL ``ParallelEnv`` (workers start lazily, on first reset)."""
    return _torchrl_make_parallel(
        workload, num_workers, tdstyle.split_envs(num_envs, num_workers))


def build_torchrl_collector(workload: str, num_envs: int, num_workers: int):
    """TorchRL ``MultiSyncCollector`` with an MLP policy."""
    return tdstyle.build_collector(torchrl_backend(), workload, num_workers,
                                   tdstyle.split_envs(num_envs, num_workers))


# ------------------------------------------------------------------ runs
def _run_gym_vec(system, vec_env, workload, num_envs, num_workers, steps):
    try:
        vec_env.reset(seed=0)
        done, seconds = _time_numpy_vec(vec_env.step, vec_env.single_action_space, num_envs, steps)
    finally:
        vec_env.close()
    return result(system, workload, num_envs, num_workers,
                  num_envs // max(num_workers, 1), done, done * num_envs,
                  seconds, processes=num_workers)


def run_serial(workload: str, num_envs: int, num_workers: int,
               steps: int) -> dict:
    """Reference: ``SyncVectorEnv`` in this process (``num_workers`` ignored)."""
    env = build_serial(workload, num_envs)
    return _run_gym_vec("serial", env, workload, num_envs, 0, steps)


def run_serial_same_step(workload: str, num_envs: int, num_workers: int,
                         steps: int) -> dict:
    """``SyncVectorEnv`` with ``SAME_STEP`` autoreset: the same work per counted step as ours and TorchRL's
    (an env that ends is stepped and reset in one call). The ``serial`` reference uses gymnasium's default
    ``NEXT_STEP``, whose call after an episode's end resets that env without stepping it."""
    env = build_serial(workload, num_envs, same_step=True)
    return _run_gym_vec("serial_same_step", env, workload, num_envs, 0, steps)


def run_gym_async(workload: str, num_envs: int, num_workers: int,
                  steps: int) -> dict:
    """``AsyncVectorEnv(shared_memory=True)``: one process per env."""
    env = build_gym_async(workload, num_envs)
    return _run_gym_vec("gym_async", env, workload, num_envs, num_envs, steps)


def run_sb3_subproc(workload: str, num_envs: int, num_workers: int,
                    steps: int) -> dict:
    """SB3 ``SubprocVecEnv`` (fork): one process per env."""
    env = build_sb3_subproc(workload, num_envs)
    try:
        env.seed(0)
        env.reset()
        done, seconds = _time_numpy_vec(env.step, env.action_space, num_envs, steps)
    finally:
        env.close()
    return result("sb3_subproc", workload, num_envs, num_envs, 1, done,
                  done * num_envs, seconds, processes=num_envs)


def run_torchrl_parallel(workload: str, num_envs: int, num_workers: int,
                         steps: int) -> dict:
    """TorchRL ``ParallelEnv`` timed through ``env.rollout``."""
    return tdstyle.run_parallel(torchrl_backend(), workload, num_envs,
                                num_workers, steps)


def run_torchrl_collector(workload: str, num_envs: int, num_workers: int,
                          steps: int) -> dict:
    """TorchRL ``MultiSyncCollector`` frames per second."""
    return tdstyle.run_collector(torchrl_backend(), workload, num_envs,
                                 num_workers, steps)


def run_torchrl_step_loop(workload: str, num_envs: int, num_workers: int,
                          steps: int) -> dict:
    """TorchRL ``ParallelEnv`` through the public ``step_and_maybe_reset`` loop."""
    return tdstyle.run_step_loop(torchrl_backend(), workload, num_envs,
                                 num_workers, steps)


def run_torchrl_random_collector(workload: str, num_envs: int, num_workers: int,
                                 steps: int) -> dict:
    """TorchRL ``MultiSyncCollector`` with no policy (its random policy)."""
    return tdstyle.run_collector(torchrl_backend(), workload, num_envs,
                                 num_workers, steps, random_policy=True)


def run_torchrl_in_torchrl_collector(workload: str, num_envs: int,
                                     num_workers: int, steps: int) -> dict:
    """TorchRL's ``Collector`` over ``TransformedEnv(TorchRL ParallelEnv, StepCounter())``."""
    return tdstyle.run_torchrl_collector_over(torchrl_backend(), workload,
                                              num_envs, num_workers, steps)


#: EnvPool's own C++ builds of the workloads' games: reported as "steps/s of the same game", not as the same
#: Python env (``(task id, options)``; for ``atari``, options that turn its default preprocessing off).
ENVPOOL_TASKS = {
    "atari": ("Pong-v5", dict(img_height=210, img_width=160, gray_scale=False, stack_num=1, episodic_life=False,
                              reward_clip=False)),
    "atari84": ("Pong-v5", {}),
    "mujoco": ("HalfCheetah-v4", {}),
}


def run_envpool(workload: str, num_envs: int, num_workers: int,
                steps: int) -> dict:
    """EnvPool (a C++ thread pool of ``num_workers`` threads) stepping ``num_envs`` envs of the same game
    synchronously; only the workloads of :data:`ENVPOOL_TASKS`."""
    from .ours import SystemUnavailable

    if workload not in ENVPOOL_TASKS:
        raise SystemUnavailable(f"EnvPool has no build of the {workload!r} workload")
    try:
        import envpool
    except ImportError as exc:
        raise SystemUnavailable(f"`import envpool` failed: {exc!r}") from exc
    task, options = ENVPOOL_TASKS[workload]
    env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
                       num_threads=max(num_workers, 1), seed=0, **options)
    try:
        env.reset()
        done, seconds = _time_numpy_vec(env.step, env.action_space, num_envs, steps)
    finally:
        env.close()
    return result("envpool", workload, num_envs, num_workers, num_envs // max(num_workers, 1), done,
                  done * num_envs, seconds, threads=num_workers)


ANCHORS = {
    "serial": run_serial,
    "serial_same_step": run_serial_same_step,
    "gym_async": run_gym_async,
    "sb3_subproc": run_sb3_subproc,
    "torchrl_parallel": run_torchrl_parallel,
    "torchrl_step_loop": run_torchrl_step_loop,
    "torchrl_collector": run_torchrl_collector,
    "torchrl_random_collector": run_torchrl_random_collector,
    "torchrl_in_torchrl_collector": run_torchrl_in_torchrl_collector,
    "envpool": run_envpool,
}

def _close(obj) -> None:
    obj.close()


def _shutdown(obj) -> None:
    obj.shutdown()


#: Constructors for start-up / memory measurements, system ->
#: ``(build(workload, num_envs, num_workers), first_use(obj), close(obj))``.
#: ``first_use`` forces lazily started workers to exist.  Close functions are
#: explicit: probing ``hasattr(env, "shutdown")`` on a TorchRL ``ParallelEnv``
#: forwards the lookup to its workers, which then crash.
BUILDERS = {
    "serial": (build_serial, lambda env: env.reset(seed=0), _close),
    "gym_async": (build_gym_async, lambda env: env.reset(seed=0), _close),
    "sb3_subproc": (build_sb3_subproc, lambda env: env.reset(), _close),
    "torchrl_parallel": (build_torchrl_parallel, lambda env: env.reset(),
                         _close),
    "torchrl_collector": (build_torchrl_collector,
                          lambda collector: next(iter(collector)), _shutdown),
}
