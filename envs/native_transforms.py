"""Engine-native versions of the TorchRL transforms that TorchRL's scripts run per env, for a worker's transform.

A worker that runs a transform over its ``k`` envs (``worker_transform``, :func:`move_transforms_to_workers`) steps
them, by default, under TorchRL's ``TransformedEnv``: a TensorDict per step and each transform's per-call code, which
on a fast env costs more than the env. When every part of the transform is one listed here, with the options listed,
the worker runs :class:`NativeTransformedGroup` instead: its envs step on their own road into worker-local buffers
laid out from the envs' specs, and the transformed outputs are written into the shared buffers with a few tensor
operations per step. The specs are TorchRL's own (the ``TransformedEnv`` is built once for them), and so are the
data, value for value (``tests/test_native_transforms.py`` compares both roads):

* ``InitTracker()``: ``"is_init"``, True in the root after a reset (on a partial reset: the reset envs' flags), False
  in ``"next"`` and in a root carried on from a step.
* ``StepCounter(max_steps=None, update_done=True)``: ``"step_count"`` (int64), 0 after a reset, one more in each
  ``"next"``; with ``max_steps``, an env whose count reaches it is truncated (``"truncated"``, and ``"done"`` with
  ``update_done``) and reset in the worker, as TorchRL's ``step_and_maybe_reset`` resets it.
* ``RewardSum()``: ``"episode_reward"``, 0 after a reset, the root's plus the step's reward in each ``"next"``.
* ``DoubleToFloat(...)``: each entry whose dtype the transform changes is cast as TorchRL casts it
  (``copy_`` rounds to nearest, as ``Tensor.to``); an action declared float32 reaches a float64 env as ``to`` would.

Anything else (another transform, other keys, two ``StepCounter``, a reward whose dtype the transform changes, nested
or several done groups) keeps TorchRL's ``TransformedEnv``
(:func:`why_not_native` says why). As with TorchRL's road in a worker, the transforms' state (step counts, returns)
is the worker's: a step continues from the root this env returned, not from a root the caller edited.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import Compose, DoubleToFloat, Transform
from torchrl.envs.transforms import InitTracker, RewardSum, StepCounter

from .engine.shared import BufferViews, EnvSpecs, allocate_buffers

DONE_KEYS = {"done", "terminated", "truncated"}


def transform_parts(transform: Transform) -> list[Transform]:
    """``transform`` and, for a ``Compose``, its transforms (recursively), in order."""
    if isinstance(transform, Compose):
        return [part for inner in transform.transforms for part in transform_parts(inner)]
    return [transform]


def why_not_native(transform: Transform, base: EnvSpecs, transformed: EnvSpecs) -> str | None:
    """Why ``transform`` (over envs of specs ``base``, giving ``transformed``) cannot run natively; None if it can."""
    parts = transform_parts(transform)
    for part in parts:
        kind = type(part)
        if kind is InitTracker:
            if part.init_key != "is_init":
                return "InitTracker with another init_key"
        elif kind is StepCounter:
            if part.step_count_key != "step_count" or part.truncated_key != "truncated":
                return "StepCounter with another step_count_key or truncated_key"
        elif kind is RewardSum:
            if [*part.in_keys] != ["reward"] or [*part.out_keys] != ["episode_reward"]:
                return "RewardSum with other keys"
        elif kind is not DoubleToFloat:
            return f"{kind.__name__} has no native version"
    if sum(type(part) is StepCounter for part in parts) > 1:
        return "two StepCounter"
    if set(base.done.keys(True, True)) != DONE_KEYS or set(transformed.done.keys(True, True)) != DONE_KEYS:
        return "done flags other than one done / terminated / truncated group"
    if [*base.reward.keys(True, True)] != ["reward"] or [*transformed.reward.keys(True, True)] != ["reward"]:
        return "a reward other than one 'reward' entry"
    if base.reward["reward"].dtype != transformed.reward["reward"].dtype:
        return "the transform changes the reward's dtype"
    if base.batch_shape or transformed.batch_shape:
        return "batched envs"
    added = set(transformed.observation.keys(True, True)) - set(base.observation.keys(True, True))
    expected = {name for name, kind in (("is_init", InitTracker), ("step_count", StepCounter),
                                        ("episode_reward", RewardSum))
                if any(type(part) is kind for part in parts)}
    if added != expected:
        return f"observation entries {sorted(map(str, added))} where {sorted(expected)} were expected"
    if set(transformed.action.keys(True, True)) != set(base.action.keys(True, True)):
        return "the transform changes the action entries"
    return None


class NativeTransformedGroup:
    """A worker's ``k`` envs under transforms that :func:`why_not_native` accepts, with an
    :class:`~.engine.group.EnvGroup`'s interface for the worker (as :class:`~.worker_transforms.TransformedGroup`).

    ``group``: the envs; ``env``: TorchRL's ``TransformedEnv`` over them (its specs are this group's; closing it
    closes the envs); ``specs``: one env's transformed specs. The envs write into ``[k]`` local buffers of their
    own specs (``base``); each step and reset then writes the transformed ``[k]`` rows of the shared buffers.
    """

    block = None

    def __init__(self, group, env, specs: EnvSpecs, transform: Transform):
        self.inner = group
        self.env = env
        self.specs = specs
        self.has_objects = False
        self._k = len(group)
        parts = transform_parts(transform)
        self._parts = {type(part) for part in parts}
        counter = next((part for part in parts if type(part) is StepCounter), None)
        self._max_steps = None if counter is None else counter.max_steps
        self._update_done = counter is not None and counter.update_done
        self._base = allocate_buffers(group.specs, self._k, shared=False)
        group.bind(self._base)
        # state carried from root to next: [k, 1] each, as TorchRL's entries
        self._step_count = torch.zeros(self._k, 1, dtype=torch.int64)
        self._episode_reward = torch.zeros(self._k, 1, dtype=specs.reward["reward"].dtype)

    def __len__(self) -> int:
        return self._k

    def bind(self, buffers: TensorDictBase) -> None:
        """Take the worker's ``[k]`` rows of the shared buffers: the transformed outputs go there."""
        views = BufferViews(buffers)
        self._root, self._next, self._action = views.root, views.next, views.action
        base_root, base_next = self._base.get("root"), self._base.get("next")
        # (shared buffer, base buffer) of every entry the envs give, cast on copy where the transform casts it
        self._root_copies = [(self._root.get(key), base_root.get(key)) for key in base_root.keys(True, True)]
        self._next_copies = [(self._next.get(key), base_next.get(key)) for key in base_next.keys(True, True)]
        base_action = self._base.get("action")
        self._action_copies = [(base_action.get(key), self._action.get(key)) for key in base_action.keys(True, True)]
        self._reward = base_next.get("reward")
        self._done = base_next.get("done")
        self._truncated = base_next.get("truncated")

    def set_seed(self, seed: int | None, static_seed: bool = False) -> int | None:
        return self.inner.set_seed(seed, static_seed)

    def reset(self, mask: np.ndarray | None = None) -> list | None:
        """Reset every env (``mask is None`` or all True) or the envs whose row of ``mask`` (bool ``[k, 1]``) is
        True; the root rows of all ``k`` envs are written, as TorchRL's partial reset returns them."""
        if mask is None or mask.all():
            self.inner.reset()
            reset = torch.ones(self._k, 1, dtype=torch.bool)
        elif mask.any():
            self.inner.reset(mask)
            reset = torch.from_numpy(mask.reshape(self._k, 1).copy())
        else:
            return None
        for shared, base in self._root_copies:
            shared.copy_(base)
        if InitTracker in self._parts:
            self._root.get("is_init").copy_(reset)
        if StepCounter in self._parts:
            self._step_count.masked_fill_(reset, 0)
            self._root.get("step_count").copy_(self._step_count)
        if RewardSum in self._parts:
            self._episode_reward.masked_fill_(reset, 0)
            self._root.get("episode_reward").copy_(self._episode_reward)
        return None

    def step(self, mask: np.ndarray | None = None) -> list | None:
        """Step every env (a ``mask`` must hold all of them, as with TorchRL's road in a worker)."""
        if mask is not None and not mask.all():
            from .engine.errors import ArgumentError

            raise ArgumentError(
                f"with worker_transform, a worker's {self._k} envs step together; a step of some of them (a "
                "\"_step\" entry) is not possible. Apply the transform in this process (TransformedEnv) to step envs "
                "apart.")
        for base, shared in self._action_copies:
            base.copy_(shared)
        self.inner.step()
        ended = self._done
        if self._max_steps is not None:
            ended = self._count_out()
        for shared, base in self._next_copies:
            shared.copy_(base)
        for shared, base in self._root_copies:
            shared.copy_(base)
        if InitTracker in self._parts:
            self._next.get("is_init").zero_()
            self._root.get("is_init").copy_(ended)
        if StepCounter in self._parts:
            self._step_count.add_(1)
            self._next.get("step_count").copy_(self._step_count)
            self._step_count.masked_fill_(ended, 0)
            self._root.get("step_count").copy_(self._step_count)
        if RewardSum in self._parts:
            self._episode_reward.add_(self._reward)
            self._next.get("episode_reward").copy_(self._episode_reward)
            self._episode_reward.masked_fill_(ended, 0)
            self._root.get("episode_reward").copy_(self._episode_reward)
        return None

    def _count_out(self) -> torch.Tensor:
        """``StepCounter(max_steps)``: truncate (in the base buffers' ``"next"``) the envs whose count reaches
        ``max_steps``, reset those that had not ended (their reset state in the base root), and return the done
        flags ``[k, 1]`` that end episodes, as TorchRL's ``_step`` and ``step_and_maybe_reset`` give them."""
        reached = self._step_count + 1 >= self._max_steps
        truncated = reached | self._truncated
        ended = truncated | self._done if self._update_done else self._done
        cut = reached & ~self._done
        self._truncated.copy_(truncated)
        self._done.copy_(ended)
        if self._update_done and cut.any():
            self.inner.reset(cut.numpy())
        return ended

    def objects_of(self, touched) -> None:
        return None

    def take_posts(self) -> list | None:
        return self.inner.take_posts()

    def env_attribute(self, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None) -> list:
        return self.inner.env_attribute(path, op, args, kwargs)

    def close(self) -> None:
        self.env.close(raise_if_closed=False)  # closes the SerialEnv, which closes the group
