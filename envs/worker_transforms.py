"""TorchRL transforms run inside each ParallelEnv worker, over the worker's ``[envs_per_worker]`` batch.

``ParallelEnv(n, make_env, envs_per_worker=k, worker_transform=T)`` gives the data of
``TransformedEnv(ParallelEnv(n, make_env, envs_per_worker=k), T)``, but each worker runs ``T`` on its own ``k`` envs
right after they step, and the shared buffers hold the transformed data: the main process does no per-frame
work, and the transforms of ``n`` workers run on ``n`` cores at once.

In a worker, the ``k`` envs (an :class:`~.engine.group.EnvGroup`) are a :class:`~tdcollect.envs.SerialEnv` of
batch ``[k]`` (:meth:`~tdcollect.envs.SerialEnv.of_group`) under a TorchRL ``TransformedEnv``, stepped through
TorchRL's own ``step_and_maybe_reset``: the transforms see what they would see in the main process (resets of
some envs arrive as ``"_reset"`` entries, so ``CatFrames``, ``RewardSum`` and ``StepCounter`` reset just those
envs). :class:`TransformedGroup` offers the worker the group's interface, one row per env.

A transform whose state spans envs has no place there: ``VecNorm``'s statistics would be per worker. Such
transforms are refused (:func:`check_worker_transform`); append them in the main process instead::

    env = TransformedEnv(ParallelEnv(2, make_env, envs_per_worker=4, worker_transform=pixels), VecNorm(...))

:func:`move_transforms_to_workers` does that split for a pipeline built the TorchRL way
(``TransformedEnv(ParallelEnv(...))`` and its appended transforms): one line added before it is used.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
from tensordict import TensorDictBase
from torchrl.envs import Compose, Transform, TransformedEnv

from .engine.errors import ArgumentError, sendable
from .engine.shared import BufferViews, EnvSpecs
from .libs.envbase import TorchRLStepper, transform_parts
from .transforms.native import GroupUnderTransform, NativeTransformedGroup, native_ops_of

logger = logging.getLogger(__name__)

#: transforms whose state spans the envs of a batch: kept in the main process (their name starts so)
SPANNING = ("VecNorm",)


def _spanning(transform: Transform) -> Transform | None:
    """The first transform in ``transform`` (a ``Compose`` looked into) whose state spans envs, or None."""
    return next((part for part in transform_parts(transform) if type(part).__name__.startswith(SPANNING)), None)


def check_worker_transform(transform: Any, owner: str = "ParallelEnv") -> None:
    """Raise :class:`~tdcollect.envs.errors.ArgumentError` unless ``transform`` is a TorchRL ``Transform`` that may
    run per worker (or a constructor of one: checked when the worker builds it)."""
    if isinstance(transform, Transform):
        part = _spanning(transform)
        if part is not None:
            raise ArgumentError(
                f"{owner}: worker_transform holds {type(part).__name__}, whose statistics span all the envs; "
                f"in the workers each would keep its own. Leave it out of worker_transform and append it in "
                f"this process: TransformedEnv({owner}(..., worker_transform=...), {type(part).__name__}(...)).")
        return
    if isinstance(transform, type) or not callable(transform):
        raise ArgumentError(
            f"{owner}: worker_transform must be a TorchRL Transform (e.g. Compose(ToTensorImage(), GrayScale())) or a "
            f"function returning one, got {transform!r}.")


class WorkerTransform:
    """What a ParallelEnv sends its workers: the transform (or its constructor), cloudpickled; called on a worker's
    built :class:`~.engine.group.EnvGroup`, it returns the :class:`TransformedGroup` the worker steps."""

    def __init__(self, transform: Transform | Callable[[], Transform], owner: str):
        check_worker_transform(transform, owner)
        self.owner = owner
        self.payload = sendable(transform, ArgumentError, f"{owner}: worker_transform cannot be sent to a worker "
                                "process", "; pass a function that builds the transform.")

    def build(self) -> Transform:
        """The transform, built here (a fresh copy per call)."""
        transform = cloudpickle.loads(self.payload)
        if not isinstance(transform, Transform):
            transform = transform()
        if not isinstance(transform, Transform):
            raise ArgumentError(f"{self.owner}: worker_transform returned {type(transform).__name__}, not a TorchRL "
                                "Transform.")
        check_worker_transform(transform, self.owner)
        return transform

    def __call__(self, group) -> TransformedGroup | NativeTransformedGroup:
        """The group the worker steps: :class:`~.transforms.native.NativeTransformedGroup` where every part of the
        transform has an engine-native version (see ``native.py``), else :class:`TransformedGroup`."""
        try:
            transform = self.build()
        except BaseException:
            group.close()
            raise
        transformed = TransformedGroup(group, transform, self.owner)
        ops = native_ops_of(transform, group.specs, transformed.specs, len(group))
        if isinstance(ops, str):
            logger.debug("%s: worker transform on TorchRL's TransformedEnv: %s", self.owner, ops)
            return transformed
        logger.debug("%s: worker transform native", self.owner)
        return NativeTransformedGroup(group, transformed.env, transformed.specs, ops, self.owner)


def _unbatched(spec):
    """One env's spec from a ``[k, *B]`` spec."""
    return spec[0].clone()


class TransformedGroup(GroupUnderTransform):
    """A worker's ``k`` envs under a TorchRL transform, with an :class:`~.engine.group.EnvGroup`'s interface for the
    worker (``specs``: one env's transformed specs; ``bind``, ``step``, ``reset``, ``set_seed``, ...).

    ``env``: the ``TransformedEnv`` over a ``SerialEnv`` of batch ``[k]`` holding the group; one
    :class:`~tdcollect.envs.libs.envbase.TorchRLStepper` writes its outputs into the worker's ``[k]`` rows."""

    def __init__(self, group, transform: Transform, owner: str):
        from .serial import SerialEnv  # (here: a ParallelEnv imports this module, and SerialEnv is a floor above)

        self.inner = group
        self.owner = owner
        try:
            self.env = TransformedEnv(SerialEnv.of_group(group, owner), transform)
            self._stepper = TorchRLStepper(self.env)
        except BaseException:
            group.close()
            raise
        batched = self._stepper.specs
        self.specs = EnvSpecs(observation=_unbatched(batched.observation), action=_unbatched(batched.action),
                              reward=_unbatched(batched.reward), done=_unbatched(batched.done))
        self.has_objects = self._stepper.has_objects
        self._k = len(group)

    def bind(self, buffers: TensorDictBase) -> None:
        """Take the worker's ``[k]`` rows of the buffers: the transformed env's outputs go there."""
        self._stepper.bind(BufferViews(buffers.unsqueeze(0), self.inner.first_index), 0)

    def set_seed(self, seed: int | None, static_seed: bool = False, episodes: bool = False) -> int | None:
        """Seed the envs through the transformed env's ``set_seed`` (``episodes`` cannot pass through it: the next
        reset is the transformed env's, as in TorchRL)."""
        return self._stepper.set_seed(seed, static_seed)

    def reset(self, mask: np.ndarray | None = None) -> list | None:
        """Reset every env (``mask is None``) or the elements where ``mask`` (bool ``[k, prod(B)]``) is True, through
        the transformed env (a partial reset as ``"_reset"`` entries)."""
        if mask is None or mask.all():
            self._stepper.reset()
        elif mask.any():
            self._stepper.reset_elements(mask.reshape(-1))
        return self.objects_of(range(self._k) if mask is None else np.flatnonzero(mask.any(1)).tolist())

    def step(self, mask: np.ndarray | None = None) -> list | None:
        """Step every env, as one transformed batch. A ``mask`` must hold all of them: the transforms step the
        worker's envs together."""
        self.refuse_partial_step(mask)
        self._stepper.step()
        return self.objects_of(range(self._k))

    def objects_of(self, touched) -> list | None:
        """The non-tensor entries of the envs in ``touched``, one per env (see ``EnvGroup.objects_of``)."""
        if not self.has_objects:
            return None
        objects = self._stepper.objects
        return [(i, {"root": objects["root"][i], "next": None if objects["next"] is None else objects["next"][i]})
                for i in touched]

    def close(self) -> None:
        self._stepper.close()  # closes the SerialEnv, which closes the group


def move_transforms_to_workers(env: TransformedEnv) -> TransformedEnv:
    """``TransformedEnv(ParallelEnv(...), T)`` as ``TransformedEnv(ParallelEnv(..., worker_transform=head), tail)``:
    ``head`` is ``T``'s leading transforms up to the first one whose state spans envs (``VecNorm``), ``tail`` the
    rest (left in this process, in order). The same data; the per-frame work runs in the workers. When every
    transform moves, the ``ParallelEnv`` itself is returned (an empty ``TransformedEnv`` would run TorchRL's
    per-step code here for nothing: ~1 ms a step, serial with the workers).

    The ParallelEnv is built again with its own arguments and the old one closed (its workers stop), so call this
    once, before the env is used. Returns the new env; ``env`` itself when no transform can move, or when its
    base is a ``SerialEnv`` (``ParallelEnv(1, ..., serial_for_single=True)`` builds one: no workers).
    Anything else is an :class:`~tdcollect.envs.errors.ArgumentError`."""
    from .serial import SerialEnv

    base = env.base_env if isinstance(env, TransformedEnv) else env
    if isinstance(env, TransformedEnv) and type(base) is SerialEnv:
        return env  # (ParallelEnv(1, ..., serial_for_single=True)): no workers, the transforms stay here
    rebuild = getattr(type(base), "with_worker_transform", None)  # (on the class: an env forwards the rest)
    if not isinstance(env, TransformedEnv) or rebuild is None:
        raise ArgumentError(f"move_transforms_to_workers takes TransformedEnv(ParallelEnv(...), transforms), got "
                            f"{type(env).__name__}" + (f"({type(base).__name__})"
                                                        if isinstance(env, TransformedEnv) else "") + ".")
    if base.worker_transform is not None:
        raise ArgumentError("move_transforms_to_workers: this ParallelEnv already runs a worker_transform.")
    parts = list(env.transform.transforms) if isinstance(env.transform, Compose) else [env.transform]
    moving = 0
    while moving < len(parts) and _spanning(parts[moving]) is None:
        moving += 1
    if moving == 0:
        return env
    head = Compose(*[part.clone() for part in parts[:moving]])
    if moving == len(parts):  # nothing stays here: no TransformedEnv, whose per-step code would cost this process
        return rebuild(base, head)
    tail = Compose(*[part.clone() for part in parts[moving:]])
    return TransformedEnv(rebuild(base, head), tail)
