"""Benchmark entries for this project's own ``tdcollect.envs`` / ``tdcollect.collectors``.

They share the TorchRL-style runners in :mod:`benchmarks.tdstyle` and the
anchors' signature ``run(workload, num_envs, num_workers, steps)``.  When
the packages cannot be imported, or lack ``ParallelEnv`` /
``MultiSyncCollector``, the runs raise :class:`SystemUnavailable` and the
CLI skips them with a note.
"""

from __future__ import annotations

import functools
import importlib

from . import tdstyle
from .workloads import WORKLOADS


class SystemUnavailable(RuntimeError):
    """Raised by a run whose library is missing or incomplete."""


def _import(module: str, attr: str):
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any import-time failure makes it unusable
        raise SystemUnavailable(f"`import {module}` failed: {exc!r}") from exc
    if not hasattr(mod, attr):
        raise SystemUnavailable(f"`{module}` has no `{attr}` yet")
    return getattr(mod, attr)


def tdcollect_worker_env(workload: str, envs_per_worker: int):
    """The env one collector worker owns: our ``SerialEnv`` of gym envs."""
    serial_env = _import("tdcollect.envs", "SerialEnv")
    return serial_env(envs_per_worker, WORKLOADS[workload])


def _worker_factory(workload: str, envs_per_worker: int):
    return functools.partial(tdcollect_worker_env, workload, envs_per_worker)


def _make_parallel(workload: str, num_workers: int, envs_per_worker: int):
    parallel_env = _import("tdcollect.envs", "ParallelEnv")
    return parallel_env(num_workers, WORKLOADS[workload],
                        envs_per_worker=envs_per_worker)


def tdcollect_backend(need_collector: bool = False) -> tdstyle.Backend:
    """Our package's callables; raises :class:`SystemUnavailable` if absent."""
    from torchrl.envs.utils import step_mdp

    _import("tdcollect.envs", "ParallelEnv")
    collector = (_import("tdcollect.collectors", "MultiSyncCollector")
                 if need_collector else None)
    return tdstyle.Backend(
        name="tdcollect", make_parallel=_make_parallel,
        worker_env_factory=_worker_factory,
        multi_sync_collector=collector, step_mdp=step_mdp,
    )


def run_tdcollect_parallel(workload: str, num_envs: int, num_workers: int,
                           steps: int) -> dict:
    """Our ``envs.ParallelEnv`` timed through ``env.rollout``."""
    return tdstyle.run_parallel(tdcollect_backend(), workload, num_envs,
                                num_workers, steps)


def run_tdcollect_collector(workload: str, num_envs: int, num_workers: int,
                            steps: int) -> dict:
    """Our ``collectors.MultiSyncCollector`` frames per second."""
    return tdstyle.run_collector(tdcollect_backend(need_collector=True),
                                 workload, num_envs, num_workers, steps)


def run_tdcollect_random_collector(workload: str, num_envs: int, num_workers: int,
                                   steps: int) -> dict:
    """Our ``collectors.MultiSyncCollector`` with no policy (random actions)."""
    return tdstyle.run_collector(tdcollect_backend(need_collector=True),
                                 workload, num_envs, num_workers, steps, random_policy=True)


def build_tdcollect_parallel(workload: str, num_envs: int, num_workers: int):
    """Our ``ParallelEnv`` for start-up / memory measurements."""
    tdcollect_backend()
    return _make_parallel(workload, num_workers,
                          tdstyle.split_envs(num_envs, num_workers))


def build_tdcollect_collector(workload: str, num_envs: int, num_workers: int):
    """Our ``MultiSyncCollector`` for start-up / memory measurements."""
    return tdstyle.build_collector(tdcollect_backend(need_collector=True),
                                   workload, num_workers,
                                   tdstyle.split_envs(num_envs, num_workers))


def run_tdcollect_step_loop(workload: str, num_envs: int, num_workers: int,
                            steps: int) -> dict:
    """Our ``ParallelEnv`` through the public ``step_and_maybe_reset`` loop."""
    return tdstyle.run_step_loop(tdcollect_backend(), workload, num_envs,
                                 num_workers, steps)


def run_tdcollect_in_torchrl_collector(workload: str, num_envs: int,
                                       num_workers: int, steps: int) -> dict:
    """TorchRL's ``Collector`` over ``TransformedEnv(our ParallelEnv, StepCounter())``."""
    return tdstyle.run_torchrl_collector_over(tdcollect_backend(), workload,
                                              num_envs, num_workers, steps)


OURS = {
    "tdcollect_parallel": run_tdcollect_parallel,
    "tdcollect_step_loop": run_tdcollect_step_loop,
    "tdcollect_collector": run_tdcollect_collector,
    "tdcollect_random_collector": run_tdcollect_random_collector,
    "tdcollect_in_torchrl_collector": run_tdcollect_in_torchrl_collector,
}

BUILDERS = {
    "tdcollect_parallel": (build_tdcollect_parallel,
                           lambda env: env.reset(), lambda env: env.close()),
    "tdcollect_collector": (build_tdcollect_collector,
                            lambda c: next(iter(c)), lambda c: c.shutdown()),
}
