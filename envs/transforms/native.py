"""A worker's transform run natively: its envs step on their own road, and the transformed entries are written with
a few tensor operations per step (the ops of ``ops.py``), instead of TorchRL's ``TransformedEnv``.

A worker that runs a transform over its ``k`` envs (``worker_transform``, :func:`move_transforms_to_workers`) steps
them, by default, under TorchRL's ``TransformedEnv``: a TensorDict per step and each transform's per-call code, which
on a fast env costs more than the env. When every part of the transform has a native op (``ops.py`` lists them:
TorchRL's SAC four, its Atari pixel transforms, what its scripts put in their makers), the worker runs
:class:`NativeTransformedGroup` instead: its envs step into worker-local buffers laid out from the envs' specs, the ops
run in the transform's order over the ``[k]`` entries, and their outputs are copied into the shared buffers. The specs
are TorchRL's own (the ``TransformedEnv`` is built once for them), and so are the data, value for value
(``tests/test_native_transforms.py`` compares both roads):

* after a step, ``"next"`` holds the ops' step outputs; the root holds the same observation entries for the envs that
  go on, and for the envs whose episode ended (``"done"``, a ``StepCounter`` truncation included: such an env is
  reset in the worker, as TorchRL's ``step_and_maybe_reset`` resets it) the ops' reset outputs of their reset
  entries;
* after a reset (all envs, or some), the root holds the ops' reset outputs.

Anything else (another transform, nested keys, two ``StepCounter``, a reward whose dtype the transform changes,
nested or several done groups, an output whose shape is not the spec's) keeps TorchRL's ``TransformedEnv``
(:func:`why_not_native` says why). As with TorchRL's road in a worker, the transforms' state (frame stacks, step
counts, returns) is the worker's: a step continues from the root this env returned, not from a root the caller
edited.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import Transform

from ..engine.errors import ArgumentError
from ..engine.shared import BufferViews, EnvSpecs, allocate_buffers
from ..libs.envbase import transform_parts
from .ops import DONE_KEYS, CastOnCopy, CountSteps, Op, ToImage, op_for

__all__ = ["GroupUnderTransform", "NativeTransformedGroup", "native_ops_of", "transform_parts", "why_not_native"]


def native_ops_of(transform: Transform | list[Transform], base: EnvSpecs, transformed: EnvSpecs, k: int
                  ) -> list[Op] | str:
    """The ops that run ``transform`` (or the list of its parts) natively over ``k`` envs of specs ``base`` (giving
    ``transformed``), or why there are none (a few words)."""
    parts = transform if isinstance(transform, list) else transform_parts(transform)
    reward_dtype = base.reward["reward"].dtype if "reward" in base.reward.keys() else torch.float32
    ops = []
    for part in parts:
        op = op_for(part, k, reward_dtype)
        if isinstance(op, str):
            return op
        ops.append(op)
    if sum(isinstance(op, CountSteps) for op in ops) > 1:
        return "two StepCounter"
    if _reads_a_cast_entry(ops, base):
        return "a transform after DoubleToFloat reads an entry it casts"
    if set(base.done.keys(True, True)) != set(DONE_KEYS) or set(transformed.done.keys(True, True)) != set(DONE_KEYS):
        return "done flags other than one done / terminated / truncated group"
    rewards = [*transformed.reward.keys(True, True)]
    if [*base.reward.keys(True, True)] != ["reward"] or "reward" not in rewards or not all(
            isinstance(key, str) for key in rewards):
        return "a reward other than one 'reward' entry (and entries an op writes beside it)"
    if base.reward["reward"].dtype != transformed.reward["reward"].dtype:
        return "the transform changes the reward's dtype"
    if base.batch_shape or transformed.batch_shape:
        return "batched envs"
    if set(transformed.action.keys(True, True)) != set(base.action.keys(True, True)):
        return "the transform changes the action entries"
    if not all(isinstance(key, str) for key in base.observation.keys(True, True)):
        return "nested observation entries"
    return _dry_run(parts, base, transformed) or ops


def _reads_a_cast_entry(ops: list[Op], base: EnvSpecs) -> bool:
    """Whether an op after a ``DoubleToFloat`` (whose cast happens on the copy into the shared buffers, after all the
    ops) reads a float64 entry: one of the env's, or one an op made from such an entry (dtype kept)."""
    wide = {key for key, spec in base.observation.items(True, True) if spec.dtype == torch.float64}
    wide |= {key for key, spec in base.reward.items(True, True) if spec.dtype == torch.float64}
    cast = False
    for op in ops:
        if isinstance(op, CastOnCopy):
            cast = True
            continue
        if cast and op.reads() & wide and not op.reads_as_float32:
            return True
        for in_key, out_key in op.made_from():
            if in_key in wide and not isinstance(op, ToImage):
                wide.add(out_key)
            elif out_key in wide and in_key not in wide:
                wide.discard(out_key)
    return False


def _dry_run(parts: list[Transform], base: EnvSpecs, transformed: EnvSpecs) -> str | None:
    """Run fresh ops of ``parts`` once over zeros of ``base``'s specs (a reset, then a step): None when they give
    exactly the transformed specs' entries, shapes and dtypes (a ``DoubleToFloat`` cast aside); else what differs."""
    ops = [op_for(part, 1, base.reward["reward"].dtype).dry() for part in parts]
    buffers = allocate_buffers(base, 1, shared=False)
    target = allocate_buffers(transformed, 1, shared=False)
    root = {key: value for key, value in buffers.get("root").items() if key not in DONE_KEYS}
    nxt = dict(buffers.get("next").items())
    try:
        for op in ops:
            op.reset(root, torch.ones(1, 1, dtype=torch.bool))
        for op in ops:
            op.step(nxt)
    except Exception as error:  # noqa: BLE001 - an op that cannot run on these entries: TorchRL's road
        return f"the native ops fail on these entries ({type(error).__name__}: {error})"
    for tree, out in (("root", root), ("next", nxt)):
        expected = {key: value for key, value in target.get(tree).items() if not (tree == "root" and key in DONE_KEYS)}
        if set(out) != set(expected):
            return f"{tree} entries {sorted(out)} where the specs have {sorted(expected)}"
        for key, value in expected.items():
            got = out[key]
            cast = got.dtype == torch.float64 and value.dtype == torch.float32
            if got.shape != value.shape or not (got.dtype == value.dtype or cast):
                return (f"{tree} entry {key!r}: {tuple(got.shape)} {got.dtype} where the specs have "
                        f"{tuple(value.shape)} {value.dtype}")
    return None


def why_not_native(transform: Transform, base: EnvSpecs, transformed: EnvSpecs) -> str | None:
    """Why ``transform`` (over envs of specs ``base``, giving ``transformed``) cannot run natively; None if it can."""
    ops = native_ops_of(transform, base, transformed, 1)
    return ops if isinstance(ops, str) else None


class GroupUnderTransform:
    """What a worker's ``k`` envs under a transform (``inner``, an :class:`~.engine.group.EnvGroup`) offer the worker
    alike, natively or through TorchRL's ``TransformedEnv``: its length, the envs' posts and attributes, and the
    refusal of a partial step. ``owner`` names the batched env in errors."""

    block = None  # its envs never step as one block of raw frames: the transforms come between
    inner = None
    owner = "ParallelEnv"
    _k = 0

    def __len__(self) -> int:
        return self._k

    def refuse_partial_step(self, mask: np.ndarray | None) -> None:
        """An :class:`~tdcollect.envs.errors.ArgumentError` unless ``mask`` (bool ``[k]``) is None or all True: the
        transform steps the worker's envs together."""
        if mask is not None and not mask.all():
            raise ArgumentError(
                f"{self.owner}: with worker_transform, a worker's {self._k} envs step together; a step of some of "
                "them (a \"_step\" entry) is not possible. Apply the transform in this process (TransformedEnv) to "
                "step envs apart.")

    def take_posts(self) -> list | None:
        return self.inner.take_posts()

    def env_attribute(self, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """Attributes of the envs under the transform (one result per env)."""
        return self.inner.env_attribute(path, op, args, kwargs)


class NativeTransformedGroup(GroupUnderTransform):
    """A worker's ``k`` envs under transforms that :func:`why_not_native` accepts, with an
    :class:`~.engine.group.EnvGroup`'s interface for the worker (as :class:`~.worker_transforms.TransformedGroup`).

    ``group``: the envs; ``env``: TorchRL's ``TransformedEnv`` over them (its specs are this group's; closing it
    closes the envs); ``specs``: one env's transformed specs; ``ops``: from :func:`native_ops_of`. The envs write
    into ``[k]`` local buffers of their own specs (``base``); each step and reset then writes the transformed ``[k]``
    rows of the shared buffers (see the module docstring).
    """

    def __init__(self, group, env, specs: EnvSpecs, ops: list[Op], owner: str = "ParallelEnv"):
        self.inner = group
        self.owner = owner
        self.env = env
        self.specs = specs
        self.has_objects = False
        self._k = len(group)
        self._ops = ops
        self._base = allocate_buffers(group.specs, self._k, shared=False)
        group.bind(self._base)
        base_root, base_next = self._base.get("root"), self._base.get("next")
        #: the envs' own entries, views of the local buffers: what the ops start from
        self._reset_entries = {key: value for key, value in base_root.items() if key not in DONE_KEYS}
        self._step_entries = dict(base_next.items())
        self._base_done = base_next.get("done")
        self._all = torch.ones(self._k, 1, dtype=torch.bool)

    def bind(self, buffers: TensorDictBase) -> None:
        """Take the worker's ``[k]`` rows of the shared buffers: the transformed outputs go there."""
        views = BufferViews(buffers)
        shared_root, shared_next = views.root, views.next
        #: (key, shared buffer) of every entry written after a step, after a reset
        self._next_targets = [(key, shared_next.get(key)) for key in shared_next.keys()]
        self._root_targets = [(key, shared_root.get(key)) for key in shared_root.keys() if key not in DONE_KEYS]
        base_action = self._base.get("action")
        # (base buffer, shared buffer) of each action entry: cast on copy where the transform casts it
        self._action_copies = [(base_action.get(key), views.action.get(key)) for key in base_action.keys(True, True)]

    def set_seed(self, seed: int | None, static_seed: bool = False, episodes: bool = False) -> int | None:
        return self.inner.set_seed(seed, static_seed, episodes)

    def reset(self, mask: np.ndarray | None = None) -> list | None:
        """Reset every env (``mask is None`` or all True) or the envs whose row of ``mask`` (bool ``[k, 1]``) is
        True; the root rows of all ``k`` envs are written, as TorchRL's partial reset returns them."""
        if mask is None or mask.all():
            self.inner.reset()
            self._write_reset(self._all)
        elif mask.any():
            self.inner.reset(mask)
            self._write_reset(torch.from_numpy(mask.reshape(self._k, 1).copy()))
        return None

    def _write_reset(self, mask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """The ops' reset outputs (``mask``: the rows reset, bool ``[k, 1]``) into the shared root rows: all of them,
        or those of ``rows`` (bool ``[k]``: the rows a partial step stepped)."""
        data = dict(self._reset_entries)
        for op in self._ops:
            op.reset(data, mask)
        for key, shared in self._root_targets:
            if rows is None:
                shared.copy_(data[key])
            else:
                shared[rows] = data[key][rows]

    #: whether a step of some of the envs is taken (per-env transforms: each env's own transform steps with it) or
    #: refused (a worker transform: it steps the worker's envs together)
    partial_steps = False

    def step(self, mask: np.ndarray | None = None) -> list | None:
        """Step every env, or, with :attr:`partial_steps`, the envs where ``mask`` (bool ``[k]``) is True (else a
        ``mask`` must hold all of them, as with TorchRL's road in a worker)."""
        if mask is not None and not mask.all():
            if self.partial_steps:
                return self._step_some(torch.from_numpy(mask.reshape(self._k, 1).copy()))
            self.refuse_partial_step(mask)
        for base, shared in self._action_copies:
            base.copy_(shared)
        self.inner.step()
        data = dict(self._step_entries)
        for op in self._ops:
            op.step(data)
        for key, shared in self._next_targets:
            shared.copy_(data[key])
        ended = data["done"]
        if not ended.any():
            for key, shared in self._root_targets:
                shared.copy_(data[key])
            return None
        self._reset_ended(ended.clone())
        return None

    def _reset_ended(self, ended: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """After a step whose envs ``ended`` (bool ``[k, 1]``): reset those a ``StepCounter`` truncated (their env's
        own road did not), and write the reset outputs into the root rows (all, or those of ``rows``)."""
        cut = ended & ~self._base_done
        if cut.any():
            self.inner.reset(cut.numpy())
        self._write_reset(ended, rows)

    def _step_some(self, rows: torch.Tensor) -> None:
        """Step the envs of ``rows`` (bool ``[k, 1]``): the ops update those rows' state only, and only those rows of
        the shared buffers are written (the others are left as they are, as a partial step leaves them)."""
        stepped = rows.reshape(-1)
        for base, shared in self._action_copies:
            base[stepped] = shared[stepped]
        self.inner.step(stepped.numpy())
        data = dict(self._step_entries)
        for op in self._ops:
            op.step(data, rows)
        for key, shared in self._next_targets:
            shared[stepped] = data[key][stepped]
        ended = data["done"] & rows
        going_on = (rows & ~ended).reshape(-1)
        for key, shared in self._root_targets:
            shared[going_on] = data[key][going_on]
        if ended.any():
            self._reset_ended(ended, stepped)
        return None

    def objects_of(self, touched) -> None:
        return None

    def close(self) -> None:
        self.env.close(raise_if_closed=False)  # closes the SerialEnv, which closes the group
