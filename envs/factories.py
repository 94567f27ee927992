"""Checking env constructors in the main process, and sending them to workers with cloudpickle."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import torch

from . import libs
from .engine.errors import ArgumentError, ConstructorError, sendable
from .engine.preload import costly_imports
from .engine.user_warnings import warn_caller


def constructors_and_kwargs(
    create_env_fn: Callable | Sequence[Callable],
    count: int,
    create_env_kwargs: dict | Sequence[dict] | None,
    owner: str,
    count_name: str,
) -> tuple[list[Callable], list[dict]]:
    """Check the constructors and return ``count`` of them and ``count`` kwargs dicts, one per slot (new dicts:
    updating one leaves the caller's and the other slots' alone; :func:`bind_kwargs` makes zero-argument
    constructors of them).

    ``create_env_fn``: one callable for all slots or a list of ``count`` callables.
    ``create_env_kwargs``: one dict for all slots or a list of ``count`` dicts.
    Raises :class:`~tdcollect.envs.errors.ConstructorError` / :class:`~tdcollect.envs.errors.ArgumentError` (in
    the calling process, before anything starts).
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ArgumentError(f"{owner} needs {count_name} >= 1 (an int), got {count!r}.")
    fns = _per_slot(create_env_fn, count, owner, count_name, "create_env_fn")
    kwargs = _per_slot(create_env_kwargs or {}, count, owner, count_name, "create_env_kwargs")
    for fn in fns:
        check_factory(fn, owner)
    for kw in kwargs:
        if not isinstance(kw, dict):
            raise ArgumentError(f"{owner}: create_env_kwargs must be a dict or a list of dicts, got {kw!r}.")
    return fns, [dict(kw) for kw in kwargs]


def bind_kwargs(fns: Sequence[Callable], kwargs: Sequence[dict]) -> list[Callable[[], Any]]:
    """Zero-argument constructors: ``fns[i]`` called with ``kwargs[i]``."""
    return [functools.partial(fn, **kw) if kw else fn for fn, kw in zip(fns, kwargs)]


def update_slot_kwargs(current: list[dict], update: dict | Sequence[dict], count_name: str) -> None:
    """Update ``current`` (one kwargs dict per slot) in place with ``update``: one dict for every slot, or one
    per slot (:class:`~tdcollect.envs.errors.ArgumentError` when the lengths differ)."""
    if isinstance(update, dict):
        for kw in current:
            kw.update(update)
        return
    update = list(update)
    if len(update) != len(current):
        raise ArgumentError(
            f"len(kwargs) and {count_name} mismatch: got {len(update)} kwargs dicts for {len(current)} slots; pass "
            "one dict for every slot or one per slot."
        )
    for kw, new in zip(current, update):
        kw.update(new)


def _per_slot(value, count, owner, count_name, arg_name):
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ArgumentError(
                f"{owner}: len({arg_name}) and {count_name} mismatch: {arg_name} is a list of {len(value)} items "
                f"but {count_name} is {count}; give one item per slot or a single one for all."
            )
        return list(value)
    return [value] * count


def check_factory(fn: Any, owner: str = "ParallelEnv") -> None:
    """Raise :class:`~tdcollect.envs.errors.ConstructorError` (a ``TypeError``) unless ``fn`` is a constructor
    (and not an env instance); the message shows a call of ``owner`` that would work (see :func:`example_calls`)."""
    if is_env_instance(fn):
        name = type(fn).__name__
        make = _remake_expression(fn)
        raise ConstructorError(
            f"{owner} takes a function that builds an env, not an env instance (got a {name} object). "
            "An instance lives in this process and often cannot be copied to another one; pass a "
            f"constructor and the env is built where it runs, e.g. {example_calls(owner, make)}."
        )
    if not callable(fn):
        example = example_calls(owner, "gymnasium.make('CartPole-v1')")
        raise ConstructorError(
            f"{owner} takes a callable that builds an env, got {type(fn).__name__} {fn!r}; e.g. {example}."
        )


#: How each owner takes its constructors: the count first (``ParallelEnv(4, make)``), or keyword-only
#: (``MultiSyncCollector([make] * 4)`` / ``MultiSyncCollector(make, num_workers=4)``).
_COUNT_FIRST = ("ParallelEnv", "AsyncParallelEnv", "SerialEnv")
_COUNT_BY_KEYWORD = ("MultiSyncCollector", "RayCollector")


def example_calls(owner: str, make: str) -> str:
    """Calls of ``owner`` (with 4 envs or workers) that its signature accepts, building each env with the
    expression ``make`` (e.g. ``"MyEnv(...)"``); for another owner, the constructor alone."""
    if owner in _COUNT_FIRST:
        extra = ", batch_workers=2" if owner == "AsyncParallelEnv" else ""
        partial = _partial_expression(make)
        calls = [f"{owner}(4, lambda: {make}{extra})"]
        if partial:
            calls.append(f"{owner}(4, {partial}{extra})")
        return " or ".join(calls)
    if owner in _COUNT_BY_KEYWORD:
        return f"{owner}([lambda: {make}] * 4) or {owner}(lambda: {make}, num_workers=4)"
    return f"a constructor such as lambda: {make}"


def _partial_expression(make: str) -> str | None:
    """``"MyEnv(...)"`` -> ``"functools.partial(MyEnv, ...)"``; None for other expressions."""
    if make.endswith("(...)") and make[:-5].isidentifier():
        return f"functools.partial({make[:-5]}, ...)"
    return None


def _remake_expression(env: Any) -> str:
    """An expression that builds an env like ``env``: its family's (e.g. ``gymnasium.make('<id>')``), else
    ``<type name>(...)``."""
    return libs.remake_expression(env) or f"{type(env).__name__}(...)"


def is_env_instance(obj: Any) -> bool:
    """Whether ``obj`` is an env rather than a constructor: an env object of a family (``tdcollect.envs.libs``), or
    anything else that steps and resets (not a class)."""
    if isinstance(obj, type):
        return False
    return libs.is_env_instance(obj) or (hasattr(obj, "step") and hasattr(obj, "reset"))


class PickledFactory:
    """A zero-argument constructor serialized with cloudpickle, so lambdas and closures defined in a
    notebook or in ``__main__`` reach workers under every start method. ``imports``: the costly modules it
    refers to, for the pool to import once before its workers start
    (:func:`~tdcollect.envs.engine.preload.costly_imports`)."""

    def __init__(self, fn: Callable[[], Any], owner: str, slot: str):
        self.imports = costly_imports(fn, libs.costly_imports())  # see engine/preload.py
        self.payload = sendable(fn, ConstructorError, f"{owner}: the constructor for {slot} cannot be sent to a worker "
                                "process", ". A constructor must not capture live env or engine objects; create them "
                                "inside the function instead.")

    def __call__(self):
        return cloudpickle.loads(self.payload)()


#: TorchRL batched-env arguments that change nothing here: the buffers are always shared memory, allocated once
#: and written in place; outputs are new CPU tensors; metadata always comes from the workers' envs.
IGNORED_TORCHRL_OPTIONS = frozenset({
    "pin_memory", "share_individual_td", "shared_memory", "policy_proof", "allow_step_when_done", "non_blocking",
    "use_buffers", "metadata_from_workers", "consolidate", "memmap",
})


#: ParallelEnv's arguments that no longer have an effect: name -> why (a ``FutureWarning`` when one is given)
PARALLEL_DEPRECATED = {"pipeline": "random-action rollouts are recorded by the workers themselves"}


def check_torchrl_options(owner: str, device, options: dict, deprecated: dict | None = None) -> torch.device | None:
    """Accept TorchRL's batched-env arguments that this package honours by construction (see
    :data:`IGNORED_TORCHRL_OPTIONS`) and, with a ``FutureWarning``, the ``deprecated`` ones (name -> why; e.g.
    :data:`PARALLEL_DEPRECATED`); raise :class:`~tdcollect.envs.errors.ArgumentError` for an unknown argument,
    ``memmap=True`` and a device this process cannot use. Returns ``device`` as a ``torch.device`` (None: the
    CPU): where the batched env's data lives for its caller (its specs and outputs; the envs step on the CPU)."""
    deprecated = deprecated or {}
    unknown = sorted(set(options) - IGNORED_TORCHRL_OPTIONS - deprecated.keys())
    for name, why in deprecated.items():
        if options.get(name) is not None:
            warn_caller(f"{owner}({name}=...) has no effect and will be removed: {why}.", FutureWarning)
    if unknown:
        raise ArgumentError(f"{owner} got unexpected keyword arguments {unknown}.")
    if options.get("memmap"):
        raise ArgumentError(f"{owner}: memmap=True is not supported; the buffers are shared memory.")
    if device is None:
        return None
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, TypeError) as err:
        raise ArgumentError(f"{owner}: device={device!r} cannot be used in this process ({err}); pass a device torch "
                            "can allocate on here (e.g. 'cpu', or 'cuda' where a GPU is visible).") from None
    return device
