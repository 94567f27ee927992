"""TorchRL's own way to write an env, ``make_env()`` returning ``TransformedEnv(GymEnv(...), transforms)``, stepped
natively: the envs inside on their own road, the per-env transforms as tdcollect's ops over the group's rows.

TorchRL's docs and training scripts put the transforms inside the constructor (one ``TransformedEnv`` per env).
Through TorchRL's ``TransformedEnv`` each step of each env costs TorchRL's per-step code (a TensorDict, each
transform's ``_step``) on top of the env's. Here, when every env of a group (a worker's ``k`` envs, or a
``SerialEnv``'s) is a ``TransformedEnv`` whose transforms all have native ops (``ops.py``) with the same
settings, and the env inside each steps on a native road (a TorchRL ``GymEnv``: ``gymenv.py``; the leading
``NoopResetEnv`` / ``EndOfLifeTransform`` of TorchRL's Atari makers stay with it, on ``gymenv_transforms.py``'s
road), the group is regrouped (:func:`regroup`, the family's ``regroup``): the envs inside step into local ``[k]``
buffers and the ops run once over the ``k`` rows (:class:`PerEnvTransformedGroup`, a
:class:`~tdcollect.envs.transforms.native.NativeTransformedGroup`). Each env keeps its own transform state, as each
of TorchRL's instances keeps its own: the ops' state is per row (a step count, a return, a frame stack per env), and
a step of some of the envs (a ``"_step"`` entry) steps those rows only. A per-env ``VecNorm`` keeps per-env
statistics, as TorchRL's per-env instances do (never pooled over the group's rows).

The data are TorchRL's, key by key (``tests/test_transformed_envs.py`` compares them with TorchRL's own
``SerialEnv`` of the same constructors). Anything else keeps each env's own road, with the reason in
``env.roads()``: a subclass of ``TransformedEnv``, a transform without a native op (or with other settings in
different envs), an env inside that takes TorchRL's step.
"""
from __future__ import annotations

from torchrl.envs import Compose, Transform, TransformedEnv

from ..engine.group import EnvGroup, resolve_on_env
from ..engine.stepper import ROAD_ATTRIBUTE, Family
from ..libs.envbase import TORCHRL_STEP, TorchRLStepper, specs_of, transform_parts
from ..libs.gymenv_transforms import COVERED
from .native import NativeTransformedGroup, native_ops_of
from .ops import Op

NATIVE = ("native: the env inside stepped on its own road, the per-env transforms as tdcollect's ops over the "
          "group's rows, TorchRL's data")


class PerEnvTransformedGroup(NativeTransformedGroup):
    """A group of ``TransformedEnv`` envs, stepped as the group of the envs inside (``inner``) under one op per
    transform over its rows (see the module docstring). ``envs``: the ``TransformedEnv`` objects (forwarded
    attributes and closing reach them)."""

    partial_steps = True

    def __init__(self, inner: EnvGroup, envs: list[TransformedEnv], specs, ops: list[Op], owner: str):
        super().__init__(inner, None, specs, ops, owner)
        self.envs = envs

    def env_attribute(self, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """Attributes of the ``TransformedEnv`` envs (one result per env), as on their own road."""
        return [resolve_on_env(env, path, op, args, kwargs) for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close(raise_if_closed=False)  # (closes the env inside)
            except Exception:  # noqa: BLE001 - closing must go on for the other envs
                pass
        self.envs = []


class _Built:
    """A constructor that returns an env built already (the env inside a ``TransformedEnv``)."""

    def __init__(self, env):
        self.env = env

    def __call__(self):
        return self.env


def _split(env: TransformedEnv) -> tuple[list[Transform], list[Transform]]:
    """``(head, tail)`` of the env's transforms: the leading ones its env's own road steps with it (TorchRL's Atari
    ``NoopResetEnv`` / ``EndOfLifeTransform``, see ``gymenv_transforms.py``), and the rest, for the ops."""
    parts = transform_parts(env.transform)
    for size in (2, 1):
        if [type(part) for part in parts[:size]] in COVERED:
            return parts[:size], parts[size:]
    return [], parts


def _inside(env: TransformedEnv, head: list[Transform]):
    """The env the ops run over: the env inside, under copies of the ``head`` transforms when there are some."""
    if not head:
        return env.base_env
    return TransformedEnv(env.base_env, Compose(*[part.clone() for part in head]))


def _ops_or_reason(envs: list[TransformedEnv], insides: list, tails: list[list[Transform]], specs) -> list[Op] | str:
    """The ops that run the envs' transforms (the ``tails``) over their ``k`` rows, or why there are none (a few
    words). ``insides``: the envs they run over."""
    base = specs_of(insides[0])
    ops = native_ops_of(tails[0], base, specs, len(envs))
    if isinstance(ops, str):
        return f"per-env transforms: {ops}"
    signatures = [op.signature() for op in ops]
    for inside, tail in zip(insides[1:], tails[1:]):
        if specs_of(inside) != base:
            return "the envs inside differ in their specs"
        own = native_ops_of(tail, base, specs, 1)
        if isinstance(own, str) or [op.signature() for op in own] != signatures:
            return "per-env transforms with other settings in different envs"
    return ops


def regroup(group: EnvGroup) -> PerEnvTransformedGroup | None:
    """:class:`PerEnvTransformedGroup` for a group whose envs are all ``TransformedEnv`` envs that can take this road
    (each marked with its road); None for any other group (envs of this kind that cannot are marked with why)."""
    steppers = group.steppers
    if not steppers or not all(type(stepper) is TorchRLStepper for stepper in steppers):
        return None
    envs = [stepper.env for stepper in steppers]
    if not all(isinstance(env, TransformedEnv) for env in envs):
        return None
    if not all(type(env) is TransformedEnv for env in envs):
        _mark(envs, f"{TORCHRL_STEP}: a subclass of TransformedEnv")
        return None
    if any(env.base_env.batch_size for env in envs):
        _mark(envs, f"{TORCHRL_STEP}: a batched env inside")
        return None
    heads, tails = zip(*[_split(env) for env in envs])
    insides = [_inside(env, head) for env, head in zip(envs, heads)]
    ops = _ops_or_reason(envs, insides, list(tails), group.specs)
    if isinstance(ops, str):
        _mark(envs, f"{TORCHRL_STEP}: {ops}")
        return None
    inner = EnvGroup([_Built(inside) for inside in insides], group.owner, group.families, group.first_index)
    if any(type(stepper) is TorchRLStepper for stepper in inner.steppers):
        inner.release()  # (the envs are the TransformedEnv envs' own)
        _mark(envs, f"{TORCHRL_STEP}: the env inside takes TorchRL's step")
        return None
    for position, op in enumerate(ops):
        adopt = getattr(op, "adopt", None)
        if adopt is not None:  # (its state kept in each env's own transform, where scripts read it)
            adopt([tail[position] for tail in tails])
    _mark(envs, NATIVE)
    return PerEnvTransformedGroup(inner, envs, group.specs, ops, group.owner)


def _mark(envs: list, road: str) -> None:
    for env in envs:
        object.__setattr__(env, ROAD_ATTRIBUTE, road)


FAMILY = Family(name="TorchRL TransformedEnv per env", priority=13, regroup=regroup)
