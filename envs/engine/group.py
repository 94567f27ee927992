"""EnvGroup: k envs in one process stepping into a ``[k]`` slice of the buffers, each through its family's stepper
(``stepper.py``).

This is what :class:`~tdcollect.envs.SerialEnv` runs in the main process and what every
:class:`~tdcollect.envs.ParallelEnv` worker runs in its own process, so both produce the same data. Also here:
TorchRL's seed chain and the worker side of forwarded attributes (:func:`resolve_on_env`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tensordict import TensorDictBase
from torchrl._utils import seed_generator

from .shared import BufferViews, EnvSpecs
from .specs import check_same_specs
from .stepper import Family, block_stepper, make_stepper


def seed_chain(seed: int, count: int, static_seed: bool = False) -> list[int]:
    """The first ``count`` seeds of TorchRL's chain: ``seed``, ``seed_generator(seed)``, ... (env ``i`` of a batched
    env seeded with ``seed`` gets the ``i``-th, see :meth:`EnvGroup.set_seed`); ``count`` times ``seed`` with
    ``static_seed``."""
    seeds = [seed]
    while len(seeds) < count:
        seeds.append(seeds[-1] if static_seed else seed_generator(seeds[-1]))
    return seeds[:count]


_BUILDING: list[int] = []  # the index of the env a constructor is building now (see env_index)


def env_index() -> int | None:
    """Inside an env constructor that a ``SerialEnv`` / ``ParallelEnv`` (or a facade on them) runs: the index of the
    env it builds in its batched env (``0 .. num_envs - 1``; env ``i`` of a ParallelEnv lives in worker
    ``i // envs_per_worker``), e.g. to give each env its own level or seed. None anywhere else."""
    return _BUILDING[-1] if _BUILDING else None


def resolve_on_env(env: Any, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None):
    """Follow ``path`` from ``env`` (the worker side of a forwarded attribute, see ``tdcollect.envs.forwarding``);
    ``op`` is ``"has"`` (does the attribute exist), ``"get"`` (its value) or ``"call"`` (call it with ``args`` /
    ``kwargs``)."""
    obj = env
    for name in path[:-1]:
        obj = getattr(obj, name)
    if op == "has":
        return hasattr(obj, path[-1])
    value = getattr(obj, path[-1])
    if op == "call" and (callable(value) or args or kwargs):
        return value(*args, **(kwargs or {}))
    return value  # calling a plain attribute without arguments reads it, as TorchRL's batched envs do


class EnvGroup:
    """Builds one env per factory (here, in this process) and steps them one after the other.

    ``families``: the env families it steps (``tdcollect.envs.libs.registered()``), tried in order.
    ``first_index`` is the global index of the group's first env (used in error messages and by :func:`env_index`).
    """

    def __init__(self, factories: Sequence[Callable[[], Any]], owner: str, families: Sequence[Family],
                 first_index: int = 0):
        self.steppers = []
        self.owner = owner
        self.families = tuple(families)
        self.first_index = first_index
        try:
            for i, fn in enumerate(factories):
                _BUILDING.append(first_index + i)
                try:
                    env = fn()
                finally:
                    _BUILDING.pop()
                self.steppers.append(make_stepper(env, self.families, owner))
            self.specs: EnvSpecs = self.steppers[0].specs
            check_same_specs({f"env {first_index + i}": stepper.specs for i, stepper in enumerate(self.steppers)},
                             "All envs of one batched env must share their specs.")
        except BaseException:
            self.close()
            raise
        self._seeds: list[int | None] = [None] * len(self.steppers)
        #: the seeds of envs seeded now whose next reset starts the seeded episode again (see set_seed's episodes)
        self._episode_seeds: list[int | None] = [None] * len(self.steppers)
        self._block = None
        #: whether its envs have non-tensor entries: then step() and reset() return them (see objects_of)
        self.has_objects = any(getattr(stepper, "has_objects", False) for stepper in self.steppers)
        #: the envs that post values (see take_posts): (index, their take_posts)
        self._posting = [(i, take) for i, stepper in enumerate(self.steppers)
                         if callable(take := getattr(getattr(stepper, "env", None), "take_posts", None))]

    @property
    def block(self):
        """The block stepper (``stepper.BlockStepper``) stepping all the envs at once, or None (one by one)."""
        return self._block

    def __len__(self) -> int:
        return len(self.steppers)

    def bind(self, buffers: TensorDictBase) -> None:
        """Point every stepper at its row of ``buffers`` (batch ``[len(self)]``, see ``shared.py``)."""
        views = BufferViews(buffers, self.first_index)
        for i, stepper in enumerate(self.steppers):
            stepper.bind(views, i)
        self._block = block_stepper(self.steppers, views, self.families)

    def set_seed(self, seed: int | None, static_seed: bool = False, episodes: bool = False) -> int | None:
        """Seed the envs one after the other as TorchRL's batched envs do: the first gets ``seed``, each next one
        the seed returned for the previous (``seed_generator(seed)``, or ``seed`` itself with ``static_seed``).
        An env whose stepper has ``set_seed`` (a TorchRL env) is seeded now; any other env at its next reset (then
        forgotten: later resets continue its RNG). Returns the seed for an env after these.

        ``episodes``: each env's next reset starts the episode its seed starts. That is what any reset after a
        seed does, except for an env whose seeding is itself a reset (TorchRL's ``GymEnv``): as TorchRL, its next
        reset would start the episode after the seeded one; with ``episodes`` it starts the seeded one again
        (``reset_into_seed``), the state TorchRL's ``Collector.set_seed`` leaves the env in and steps on from."""
        for i, stepper in enumerate(self.steppers):
            seed_now = getattr(stepper, "set_seed", None)
            if seed_now is not None:
                self._episode_seeds[i] = seed if episodes else None
                seed = seed_now(seed, static_seed)
                continue
            self._seeds[i] = seed
            if seed is not None and not static_seed:
                seed = seed_generator(seed)
        return seed

    def env_attribute(self, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """:func:`resolve_on_env` on every env: one result per env."""
        return [resolve_on_env(stepper.env, path, op, args, kwargs) for stepper in self.steppers]

    def reset(self, mask: np.ndarray | None = None) -> list | None:
        """Reset every env (``mask is None``) or the elements where ``mask`` (bool ``[k, prod(B)]``, one row per
        env; ``B`` is ``()`` unless the envs are batched TorchRL envs) is True: an env whose whole row is True is
        reset (seeded if a seed is pending), a batched env with only some elements True resets those."""
        for i, stepper in enumerate(self.steppers):
            if mask is None or mask[i].all():
                episode_seed = self._episode_seeds[i]
                if episode_seed is not None and hasattr(stepper, "reset_into_seed"):
                    stepper.reset_into_seed(episode_seed)
                else:
                    stepper.reset(self._seeds[i])
                self._seeds[i] = None
                self._episode_seeds[i] = None
            elif mask[i].any():
                stepper.reset_elements(mask[i])
        return self.objects_of(range(len(self)) if mask is None else np.flatnonzero(mask.any(1)).tolist())

    def objects_of(self, touched) -> list | None:
        """The non-tensor entries of the envs in ``touched`` (indices) after a step or reset:
        ``[(index, {"root": td, "next": td or None})]``; None when the envs have none."""
        if not self.has_objects:
            return None
        return [(i, self.steppers[i].objects) for i in touched]

    def take_posts(self) -> list | None:
        """What the envs posted since the last call: an env may define ``take_posts()``, which returns a dict of
        values for the main process (empty when it has none; the vector facades' infos travel so).
        ``[(index, dict)]`` of the non-empty ones; None when there are none (the common case: no env posts)."""
        if not self._posting:
            return None
        return [(i, posts) for i, take in self._posting if (posts := take())] or None

    def step(self, mask: np.ndarray | None = None) -> list | None:
        """Step every env (``mask is None``) or those where ``mask`` (bool ``[k]``) is True, with its row of the
        action buffer (auto-resetting the ones that end); all of them as one block when the envs allow it (see
        ``stepper.block_stepper``). The rows of envs not stepped are left as they are. Returns the stepped envs'
        non-tensor entries (see :meth:`objects_of`)."""
        if mask is None and self._block is not None:
            self._block.step()
            return None
        for i, stepper in enumerate(self.steppers):
            if mask is None or mask[i]:
                stepper.step()
        return self.objects_of(range(len(self)) if mask is None else np.flatnonzero(mask).tolist())

    def close(self) -> None:
        for stepper in self.steppers:
            try:
                stepper.close()
            except Exception:  # noqa: BLE001 - closing must go on for the other envs
                pass
        self.release()

    def release(self) -> None:
        """Let go of the envs without closing them (they stay whoever built them's); the group steps nothing more."""
        self.steppers = []
        self._block = None


def build_group(factories: Sequence[Callable[[], Any]], owner: str, families: Sequence[Family], first_index: int = 0):
    """The envs of ``factories`` built here as an :class:`EnvGroup`, or what the first family's ``regroup`` makes of
    that group (see :class:`~.stepper.Family`): what a worker and a ``SerialEnv`` step."""
    group = EnvGroup(factories, owner, families, first_index)
    try:
        for family in group.families:
            regrouped = family.regroup(group)
            if regrouped is not None:
                return regrouped
    except BaseException:
        group.close()
        raise
    return group
