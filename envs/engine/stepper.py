"""The contract between the engine and the env families: a :class:`Stepper` per env, a :class:`Family` per kind of
env, and the dispatch from an env to its stepper.

The engine steps envs only through steppers. A stepper owns one env and one index ``i`` in a group's buffer views
(:class:`~.shared.BufferViews`); it writes each step's results straight into its row of the shared buffers:

- ``specs``: the env's :class:`~.shared.EnvSpecs` (unbatched);
- ``bind(views, i)``: remember where to read actions and write results;
- ``reset(seed)``: reset the env (seeding it when ``seed`` is not None) and write the observation into ``root[i]``;
- ``step()``: read ``action[i]``, step, write ``next[i]`` (observation, reward, done flags), then the state for the
  next action into ``root[i]``: the reset observation if the env was done (auto-reset), else the next observation;
- ``close()``.

A stepper may also offer ``set_seed(seed, static_seed)`` (seed now, return the seed for the next env; without it
a seed waits for the env's next reset), ``reset_elements(mask)`` (a batched env's partial reset), ``has_objects``
/ ``objects`` (non-tensor entries), and ``env`` (the env object, for forwarded attributes and posts).

Every value an env returns is checked against the shape its spec declares before it is written; nothing is
broadcast (see :func:`~.values.shape_error`).

A :class:`Family` says how to recognise one kind of env and how to step it. The families live in
``tdcollect.envs.libs`` (one module each, each with a ``FAMILY``); the faces hand the engine their tuple
(:func:`tdcollect.envs.libs.registered`), so the engine itself knows none of them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .shared import BufferViews, EnvSpecs


@runtime_checkable
class Stepper(Protocol):
    """What the engine calls on one env (see the module docstring)."""

    specs: EnvSpecs

    def bind(self, views: BufferViews, index: int) -> None: ...

    def reset(self, seed: int | None = None) -> None: ...

    def step(self) -> None: ...

    def close(self) -> None: ...


class BlockStepper(Protocol):
    """The ``k`` envs of a group stepped as one block (``step()`` writes the same data as stepping each of them).
    Its envs have one observation, ``observation_key``, whose rows it writes where ``write_observations_to`` says
    (the buffers' rows, ``buffer_observations``, or a rollout's columns: see ``worker.py``)."""

    envs: list
    observation_key: str
    buffer_observations: tuple

    def write_observations_to(self, next_obs, root_obs) -> None: ...

    def step(self) -> None: ...


#: the attribute an env object may carry (set by its family when it is built) to say how it is stepped: its "road",
#: e.g. a TorchRL ``GymEnv`` stepped natively or through TorchRL's ``step`` (read by ``BatchedEnv.roads()``)
ROAD_ATTRIBUTE = "tdcollect_road"
#: the road of an env whose family sets none: its family's own stepper
FAMILY_STEPPER = "its family's stepper"


def _never(obj: Any) -> Any:
    return None


def _no_block(steppers: list, views: BufferViews) -> None:
    return None


def _not_mine(obj: Any) -> bool:
    return False


@dataclass(frozen=True)
class Family:
    """One kind of env, as the engine and the faces need to know it.

    Its functions are module-level functions (no lambdas): a family travels to the workers by pickle, by reference.

    Attributes:
        name: how messages name the family (``"gymnasium"``, ``"TorchRL EnvBase"``, ...).
        priority: families are tried in increasing ``priority`` order (the first one that claims an env steps it).
        stepper: ``env -> Stepper`` for an env of this family; None for any other env.
        translate: ``env -> env`` of another family that steps in its place (e.g. a wrapper); None when it does not
            apply. Tried after every family's ``stepper``.
        block: ``(steppers, views) -> BlockStepper`` when all the group's steppers can step as one block; else None.
        regroup: ``group -> group`` (an :class:`~.group.EnvGroup` just built, before it is bound): an object with
            the group's interface that steps its envs in another way (e.g. their per-env transforms as one batched
            op over the group's rows), or None when it does not apply. Tried in ``priority`` order; the first
            answer is stepped.
        is_instance: ``obj -> bool``: whether ``obj`` is an env object of this family (the faces refuse instances
            where they take constructors).
        remake: ``env -> str``: an expression that builds an env like ``env`` (shown in the error that refuses
            it); None when the family has none for it.
        costly_imports: ``{module prefix a constructor may refer to: module worth importing once before workers
            start}`` (see ``preload.py``).
        native_env: ``env -> object`` with the env's ``step`` and ``reset``, giving what the env's own give, faster
            (for the faces that call an env's own ``step``: the vector faces' worker side); None when it has none.
    """

    name: str
    priority: int = 50
    stepper: Callable[[Any], Stepper | None] = _never
    translate: Callable[[Any], Any] = _never
    block: Callable[[list, BufferViews], BlockStepper | None] = _no_block
    regroup: Callable[[Any], Any] = _never
    is_instance: Callable[[Any], bool] = _not_mine
    remake: Callable[[Any], str | None] = _never
    costly_imports: dict[str, str] = field(default_factory=dict)
    native_env: Callable[[Any], Any] = _never


def of_package(obj: Any, package: str) -> bool:
    """Whether ``obj``'s type comes from ``package`` (its top-level module): how a family whose package is optional
    recognises its objects without importing it."""
    return (type(obj).__module__ or "").split(".")[0] == package


def make_stepper(env: Any, families: Sequence[Family], owner: str = "ParallelEnv") -> Stepper:
    """The stepper for ``env``: the first family's (in ``families`` order) that claims it, else the first
    translation's; a ``TypeError`` naming the families when none does."""
    for _ in range(4):  # a translation leads to another family's env; a few hops at most
        for family in families:
            stepper = family.stepper(env)
            if stepper is not None:
                return stepper
        translated = next((out for family in families if (out := family.translate(env)) is not None), None)
        if translated is None:
            break
        env = translated
    names = ", ".join(family.name for family in families)
    raise TypeError(
        f"{owner}'s factory returned {type(env).__module__}.{type(env).__name__}, which is not an env it can step: "
        f"return an env of one of the families it steps ({names}) from the factory."
    )


def block_stepper(steppers: list, views: BufferViews, families: Sequence[Family]) -> BlockStepper | None:
    """The first block stepper a family offers for ``steppers`` (all of a group's envs), or None."""
    for family in families:
        block = family.block(steppers, views)
        if block is not None:
            return block
    return None
