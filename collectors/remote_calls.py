"""TorchRL's remote helpers on a collector: ``map_fn(method_name, list_of_args, list_of_kwargs)``,
``get_distant_attr(name)``, ``_dump_env_transform(step)`` (what TorchRL's ``Evaluator`` calls to save the videos
of a recorder transform) and ``enable_profile(...)`` (see ``profiling.py``).

On :class:`~tdcollect.collectors.Collector` they reach the collector itself. On the process collectors each call
goes to every worker's collector loop (``BatchLoop``, which knows ``worker_idx``, ``frames_per_batch`` and its env),
through the worker protocol's ``CALL``.
"""
from __future__ import annotations

import cloudpickle

from .profiling import RolloutProfiler, profile_config


def paired_arguments(list_of_args, list_of_kwargs, expected: int | None = None) -> list[tuple[tuple, dict]]:
    """``[(args, kwargs), ...]`` from TorchRL's two lists (either may be None); ``expected``: the number of
    workers each pair goes to, in order."""
    if list_of_args is None:
        list_of_args = [()] * (len(list_of_kwargs) if list_of_kwargs else (expected or 1))
    if list_of_kwargs is None:
        list_of_kwargs = [{}] * len(list_of_args)
    if len(list_of_args) != len(list_of_kwargs):
        raise ValueError(f"map_fn: list_of_args and list_of_kwargs must have the same length, got "
                         f"{len(list_of_args)} and {len(list_of_kwargs)}.")
    if expected is not None and len(list_of_args) != expected:
        raise ValueError(f"map_fn: Expected {expected} argument entries (one per worker), got {len(list_of_args)}.")
    return [(tuple(args), dict(kwargs)) for args, kwargs in zip(list_of_args, list_of_kwargs)]


def dump_env_transform(env, step: int | None = None) -> None:
    """Call ``env.transform.dump(step=step)`` when the env's transform has one (a video recorder)."""
    dump = getattr(getattr(env, "transform", None), "dump", None)
    if callable(dump):
        dump(step=step)


class LocalCalls:
    """The helpers for a collector whose env and policy are in this process."""

    worker_idx = None  # TorchRL's: the index of a collector that is a worker (None: it is not)

    def map_fn(self, method_name: str, list_of_args=None, list_of_kwargs=None) -> list:
        method = getattr(self, method_name)
        if not callable(method):
            raise AttributeError(f"map_fn: {type(self).__name__}.{method_name} is not callable.")
        return [method(*args, **kwargs) for args, kwargs in paired_arguments(list_of_args, list_of_kwargs)]

    def get_distant_attr(self, name: str):
        return getattr(self, name)

    def _dump_env_transform(self, step: int | None = None) -> None:
        dump_env_transform(getattr(self, "env", None), step)

    def enable_profile(self, **settings) -> None:
        """TorchRL's ``enable_profile`` (``num_rollouts``, ``warmup_rollouts``, ``save_path``, ``activities``, ...;
        ``workers`` is ignored): the rollouts run here, so they are profiled here."""
        self.profile_config = profile_config(type(self).__name__, self.batches > 0, **settings)
        self._loop.profiler = RolloutProfiler(self.profile_config, 0)


class WorkerCalls:
    """The helpers for the process collectors: one call per worker, on its collector loop."""

    def map_fn(self, method_name: str, list_of_args=None, list_of_kwargs=None) -> list:
        pairs = paired_arguments(list_of_args, list_of_kwargs, self.num_workers)
        self._settle()
        return self._pool.call("call_method", [(method_name, args, kwargs) for args, kwargs in pairs])

    def get_distant_attr(self, name: str) -> list:
        return self.map_fn("get_distant_attr", [(name,)] * self.num_workers)

    def enable_profile(self, **settings) -> None:
        """TorchRL's ``enable_profile``: the rollouts of the ``workers`` given (default ``[0]``) are profiled in
        those workers, each writing its own trace (``{worker_idx}`` in ``save_path``)."""
        self.profile_config = profile_config(self.owner, self.batches > 0, **settings)
        workers = [w for w in self.profile_config.workers if 0 <= w < self.num_workers]
        self._settle()
        self._pool.call("enable_profile", [(cloudpickle.dumps(self.profile_config),)] * len(workers), workers)
