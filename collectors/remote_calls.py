"""TorchRL's remote helpers on a collector: ``map_fn(method_name, list_of_args, list_of_kwargs)``,
``get_distant_attr(name)``, ``_dump_env_transform(step)`` (what TorchRL's ``Evaluator`` calls to save the videos
of a recorder transform) and ``enable_profile(...)`` (see ``profiling.py``).

Names are TorchRL's attribute paths: ``"env.batch_size"``, ``"env.transform[0]"``, ``"stats['frames']"``
(:func:`resolve`). On :class:`~tdcollect.collectors.Collector` they reach the collector itself. On the process
collectors each call goes to every worker's collector loop (``BatchLoop``, which knows ``worker_idx``,
``frames_per_batch`` and its env), through the worker protocol's ``CALL`` — but paths into the replay buffer
(``"replay_buffer.__len__"``): the workers' batches are written into the collector's buffer by the main process,
so every worker's replay buffer is that one, and the call is answered here, once per worker.
"""
from __future__ import annotations

import ast
import re

import cloudpickle

from tdcollect.envs.engine.errors import EnvWorkerError

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


_PART = re.compile(r"^([^\[\]]*)((?:\[[^\]]+\])*)$")
#: paths into attributes a process collector holds in the main process, for all its workers
MAIN_PROCESS_PATHS = ("replay_buffer",)


def parse_path(path: str) -> list[tuple[str, list]]:
    """TorchRL's attribute ``path`` as ``[(name, [subscript keys]), ...]``: dotted names with subscripts, e.g.
    ``"env.transform[0].loc"`` or ``"schemes['policy']"`` (a subscript is a Python literal); a ``ValueError`` for
    anything else (checked in the main process, before any worker is asked)."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"an attribute path must be a non-empty string such as 'env.batch_size', got {path!r}.")
    parts = []
    for part in path.split("."):
        match = _PART.match(part)
        if match is None or not (match.group(1) or match.group(2)):
            raise ValueError(f"{path!r} is not an attribute path (names with [subscripts], joined by dots).")
        keys = []
        for key in re.findall(r"\[([^\]]+)\]", match.group(2)):
            try:
                keys.append(ast.literal_eval(key))
            except (ValueError, SyntaxError):
                raise ValueError(f"{path!r}: the subscript [{key}] is not a Python literal.") from None
        parts.append((match.group(1), keys))
    return parts


def resolve(obj, path: str):
    """The object at TorchRL's attribute ``path`` (see :func:`parse_path`) from ``obj``."""
    for name, keys in parse_path(path):
        if name:
            obj = getattr(obj, name)
        for key in keys:
            obj = obj[key]
    return obj


def _in_main_process(path: str) -> bool:
    return parse_path(path)[0][0] in MAIN_PROCESS_PATHS


def call_path(obj, path: str, args: tuple = (), kwargs: dict | None = None):
    """What TorchRL's ``map_fn`` runs on each collector: the callable at ``path`` called with the arguments, or the
    value at ``path`` when it is not callable (then without arguments)."""
    target = resolve(obj, path)
    if callable(target):
        return target(*args, **(kwargs or {}))
    if args or kwargs:
        raise ValueError(f"map_fn: {path!r} is not callable ({type(target).__name__}); it takes no arguments.")
    return target


def dump_env_transform(env, step: int | None = None) -> None:
    """Call ``env.transform.dump(step=step)`` when the env's transform has one (a video recorder)."""
    dump = getattr(getattr(env, "transform", None), "dump", None)
    if callable(dump):
        dump(step=step)


class AttributeCalls:
    """TorchRL's ``getattr_policy(attr)`` and ``getattr_rb(attr)``: an attribute of the policy (the module given)
    or of the replay buffer, both held in this process (TorchRL's trainers read the buffer's and the env's specs
    through these); ``getattr_env`` is each kind's own."""

    def getattr_policy(self, attr: str):
        module = self._policy_module()
        return getattr(self.policy if module is None else module, attr)

    def getattr_rb(self, attr: str):
        return getattr(self.replay_buffer, attr)


class LocalCalls(AttributeCalls):
    """The helpers for a collector whose env and policy are in this process."""

    worker_idx = None  # TorchRL's: the index of a collector that is a worker (None: it is not)

    def getattr_env(self, attr: str):
        """An attribute of the env this collector steps (TorchRL's ``getattr_env``)."""
        return getattr(self.env, attr)

    def map_fn(self, method_name: str, list_of_args=None, list_of_kwargs=None) -> list:
        return [call_path(self, method_name, args, kwargs)
                for args, kwargs in paired_arguments(list_of_args, list_of_kwargs)]

    def get_distant_attr(self, name: str):
        return resolve(self, name)

    def _dump_env_transform(self, step: int | None = None) -> None:
        dump_env_transform(getattr(self, "env", None), step)

    def enable_profile(self, **settings) -> None:
        """TorchRL's ``enable_profile`` (``num_rollouts``, ``warmup_rollouts``, ``save_path``, ``activities``, ...;
        ``workers`` is ignored): the rollouts run here, so they are profiled here."""
        self.profile_config = profile_config(type(self).__name__, self.batches > 0, **settings)
        self._loop.profiler = RolloutProfiler(self.profile_config, 0)


class WorkerCalls(AttributeCalls):
    """The helpers for the process collectors: one call per worker, on its collector loop."""

    def getattr_env(self, attr: str):
        """An attribute of the first worker's env (TorchRL's ``getattr_env``: ``"full_action_spec_unbatched"``, ...);
        an ``AttributeError`` when it has none."""
        if not isinstance(attr, str) or not attr.isidentifier():
            raise TypeError(f"getattr_env takes an attribute name, got {attr!r}.")
        self._settle()
        try:
            return self._pool.call("call_method", [("get_distant_attr", (f"env.{attr}",), {})], [0])[0]
        except EnvWorkerError as err:
            if err.exc_type == "AttributeError":  # (as TorchRL's: the worker's AttributeError, here)
                raise AttributeError(err.exc_message) from None
            raise

    def map_fn(self, method_name: str, list_of_args=None, list_of_kwargs=None) -> list:
        pairs = paired_arguments(list_of_args, list_of_kwargs, self.num_workers)
        if _in_main_process(method_name):
            return [call_path(self, method_name, args, kwargs) for args, kwargs in pairs]
        self._settle()
        return self._pool.call("call_method", [(method_name, args, kwargs) for args, kwargs in pairs])

    def get_distant_attr(self, name: str) -> list:
        if _in_main_process(name):
            return [resolve(self, name)] * self.num_workers
        return self.map_fn("get_distant_attr", [(name,)] * self.num_workers)

    def enable_profile(self, **settings) -> None:
        """TorchRL's ``enable_profile``: the rollouts of the ``workers`` given (default ``[0]``) are profiled in
        those workers, each writing its own trace (``{worker_idx}`` in ``save_path``)."""
        self.profile_config = profile_config(self.owner, self.batches > 0, **settings)
        workers = [w for w in self.profile_config.workers if 0 <= w < self.num_workers]
        self._settle()
        self._pool.call("enable_profile", [(cloudpickle.dumps(self.profile_config),)] * len(workers), workers)
