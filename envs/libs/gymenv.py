"""TorchRL's ``GymEnv`` and ``GymWrapper``, stepped natively: the gymnasium env inside is stepped on the engine's
gymnasium road, and what TorchRL's ``GymEnv`` would have returned is written into the buffers (the same keys,
dtypes, shapes and values), without TorchRL's per-step code (a TensorDict per step, spec encoding, ``read_obs``).

**The native road** covers what TorchRL's scripts use:

- actions: ``Discrete`` spaces, one-hot (TorchRL's default) or categorical (``categorical_action_encoding=True``),
  passed to the env as a Python ``int`` as TorchRL passes them; ``Box`` spaces, passed as a numpy array of the
  spec's dtype and shape;
- observations: one ``Box`` (key ``"observation"``, or ``"pixels"`` for pixels: ``from_pixels=True`` with
  ``pixels_only=True``, or an env whose frames are its observation), or a ``Dict`` of ``Box`` entries (its own keys,
  ``"state"`` renamed ``"observation"`` as TorchRL does: ``from_pixels=True, pixels_only=False``);
- ``frame_skip``: when the env takes it (ALE) it is the env's own; else the gymnasium env is stepped ``frame_skip``
  times per step, rewards summed in the order they come, stopping at an episode's end, as TorchRL's loop does;
- ``terminated`` / ``truncated`` / ``done``; a reward ``float32 [1]``;
- seeding (TorchRL's own ``set_seed``, rare and kept as it is) and resets (the gymnasium env's ``reset()``).

Anything else keeps TorchRL's ``step`` (the TorchRL family, ``envbase.py``), so the data never differ: an info dict
reader, a batched (vectorised) env, a device other than the CPU, a reward space, a subclass of ``GymWrapper``
(which may step in its own way), the ``gym`` backend, other spaces (``MultiDiscrete``, ``MultiBinary``, ``Tuple``,
nested ``Dict``), a ``Box`` whose spec has another shape or dtype.

**Which road an env takes**: ``env.roads()`` on a ``ParallelEnv`` / ``SerialEnv`` (one line per env), or the
env's ``tdcollect_road`` attribute in its process; each env logs its road at debug level (logger
``tdcollect.envs``).

This module builds on two others, as the road it opens joins them: the gymnasium family (``gym.py``: its checks
of an env's values, its block stepper) and the TorchRL family (``envbase.py``: the specs of a TorchRL env).
"""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torchrl.data import Bounded, Categorical, OneHot, Unbounded
from torchrl.envs.libs.gym import GymEnv, GymWrapper

from ..engine.shared import BufferViews
from ..engine.specs import DONE_KEYS
from ..engine.stepper import ROAD_ATTRIBUTE, Family
from ..engine.values import BadValue
from .atari import native_env
from .envbase import marked_stepper, seeding_resets, specs_of
from .gym import (
    GymBlockStepper,
    GymRow,
    Mismatch,
    leaf_writer,
    skip_frames,
)

NATIVE = "native: the gymnasium env stepped by tdcollect, TorchRL's GymEnv data"


def why_not_native(env) -> str | None:
    """None when ``env`` (a TorchRL ``GymEnv`` / ``GymWrapper``) can take the native road; else why it cannot, in
    a few words (see the module docstring)."""
    if type(env) not in (GymEnv, GymWrapper):
        return f"{type(env).__name__} is a subclass of GymWrapper (it may step in its own way)"
    if env.batch_size:
        return "a batched (vectorised) env"
    inner = env._env
    if not isinstance(inner, gym.Env):
        return f"the wrapped env is a {type(inner).__name__}, not a gymnasium.Env"
    if env.device is not None and env.device.type != "cpu":
        return f"device={env.device}"
    if env.info_dict_reader:
        return "an info dict reader is set"
    if not getattr(env, "_convert_actions_to_numpy", True):
        return "actions are not converted to numpy"
    frame_skip = getattr(env, "wrapper_frame_skip", 1)
    if type(frame_skip) is not int or frame_skip < 1:
        return f"frame_skip={frame_skip!r}"
    if list(env.action_keys) != ["action"] or env.reward_key != "reward" or \
            sorted(env.done_keys) != sorted(DONE_KEYS):
        return "keys other than 'action', 'reward', 'done', 'terminated', 'truncated'"
    reward = env.full_reward_spec["reward"]
    if not isinstance(reward, Unbounded) or tuple(reward.shape) != (1,) or reward.dtype != torch.float32:
        return f"reward spec {type(reward).__name__} {tuple(reward.shape)} {reward.dtype}"
    if _action_kind(inner.action_space, env.full_action_spec["action"]) is None:
        return f"action space {inner.action_space}"
    if _observation_keys(inner.observation_space, env.full_observation_spec) is None:
        return f"observation space {inner.observation_space}"
    return None


def _action_kind(space: spaces.Space, spec) -> str | None:
    """``"onehot"``, ``"categorical"`` or ``"box"``: how the action in the buffers becomes the env's; None for
    a space or spec the native road does not cover."""
    if isinstance(space, spaces.Discrete):
        if isinstance(spec, OneHot) and not spec.use_register and tuple(spec.shape) == (int(space.n),):
            return "onehot"
        if isinstance(spec, Categorical) and tuple(spec.shape) == ():
            return "categorical"
        return None
    if isinstance(space, spaces.Box) and isinstance(spec, (Bounded, Unbounded)):
        if tuple(spec.shape) == (tuple(space.shape) or (1,)) and spec.dtype == _torch_dtype(space.dtype):
            return "box"
    return None


def _observation_keys(space: spaces.Space, spec) -> list[tuple] | None:
    """``[(the env's key or None, the key in TorchRL's data, the leaf's space)]``; None when the native road does
    not cover the space, or the spec is not the one it makes from it."""
    if isinstance(space, spaces.Box):
        keys = list(spec.keys(True, True))
        if len(keys) != 1 or not isinstance(keys[0], str):
            return None
        entries = [(None, keys[0], space)]
    elif isinstance(space, spaces.Dict) and all(isinstance(sub, spaces.Box) for sub in space.spaces.values()):
        rename = "state" in space.spaces and "observation" not in space.spaces
        entries = [(name, "observation" if rename and name == "state" else name, sub)
                   for name, sub in space.spaces.items()]
        if sorted(key for _, key, _ in entries) != sorted(spec.keys(True, True)):
            return None
    else:
        return None
    for _, key, sub in entries:
        leaf = spec[key]
        if tuple(leaf.shape) != (tuple(sub.shape) or (1,)) or leaf.dtype != _torch_dtype(sub.dtype):
            return None
    return entries


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


class GymEnvStepper(GymRow):
    """A TorchRL ``GymEnv`` / ``GymWrapper`` on the native road (see the module docstring): its gymnasium env is
    stepped here and TorchRL's data written into the env's rows of the buffers, checked as the gymnasium family
    checks every value. ``env`` is the TorchRL env (forwarded attributes reach it); ``gym_env`` the gymnasium env
    it wraps, or the Atari road's stand-in for it (gymnasium's Atari preprocessing stepped natively,
    ``atari.py``)."""

    road = NATIVE

    def __init__(self, env):
        self.env = env
        stand_in = native_env(env._env)
        self.gym_env = env._env if stand_in is None else stand_in
        self.specs = specs_of(env)
        self.frame_skip = env.wrapper_frame_skip
        self.action_kind = _action_kind(self.gym_env.action_space, env.full_action_spec["action"])
        #: [(the env's key or None, the key in the buffers, the leaf's space)]
        self.observation_entries = _observation_keys(self.gym_env.observation_space, env.full_observation_spec)
        self.autoreset = self.gym_env.reset  # what TorchRL's reset of an ended episode calls (no arguments)
        self._writers = [(name, key, leaf_writer(sub, (key,), True)) for name, key, sub in self.observation_entries]
        self._read_action = _ACTION_READERS[self.action_kind]

    @property
    def observation_key(self) -> str | None:
        """The key of the env's one observation (a ``Box`` space), None for a ``Dict`` space."""
        name, key, _ = self.observation_entries[0]
        return key if name is None else None

    def set_seed(self, seed: int | None, static_seed: bool = False) -> int | None:
        """Seed the env now, with TorchRL's own ``set_seed`` (it resets the gymnasium env with the seed); returns
        the seed for the next env."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.env.set_seed(seed)
        self._reset_env(self.gym_env.reset, "reset()")

    def reset_into_seed(self, seed: int) -> None:
        """Reset into the episode ``seed`` starts, the env just seeded with it (TorchRL's ``set_seed`` was the
        gymnasium env's ``reset(seed=seed)``: the same reset again, see ``EnvGroup.set_seed``)."""
        if not seeding_resets(self.env):
            self.reset()
            return
        self._reset_env(functools.partial(self.gym_env.reset, seed=seed), "reset()")

    def _reset_env(self, reset, call: str) -> None:
        """Reset the env with ``reset`` (no arguments, ``-> (observation, info)``) and write the root (a subclass
        adds what its transforms do after a reset)."""
        obs, _ = reset()
        self._write_observation(obs, self._root, call)

    def step(self) -> None:
        obs, reward, terminated, truncated = self._advance(self._read_action(self._action, self._i))
        self._write_observation(obs, self._next, "step()")
        done = self._write_outcome(reward, terminated, truncated)
        if done:
            obs, _ = self.autoreset()
        self._write_observation(obs, self._root, "reset()" if done else "step()")

    def _advance(self, action) -> tuple:
        """One step of TorchRL's ``GymEnv``: ``frame_skip`` env steps (see :func:`~.gym.skip_frames`); returns
        ``(observation, reward, terminated, truncated)``."""
        if self.frame_skip == 1:
            obs, reward, terminated, truncated, _ = self.gym_env.step(action)
            return obs, reward, terminated, truncated
        return skip_frames(self.gym_env, action, self.frame_skip)

    def _write_observation(self, obs, tree: dict, call: str) -> None:
        try:
            for name, key, write in self._writers:
                write(obs if name is None else obs[name], tree[key], self._i)
        except (Mismatch, BadValue) as bad:
            raise self._error(bad, call) from None

    def close(self) -> None:
        self.env.close(raise_if_closed=False)


def _onehot_action(array: np.ndarray, i: int) -> int:
    return int(array[i].argmax())


def _categorical_action(array: np.ndarray, i: int) -> int:
    return int(array[i])


def _box_action(array: np.ndarray, i: int) -> np.ndarray:
    return np.array(array[i])  # a copy: an env may keep its action


_ACTION_READERS = {"onehot": _onehot_action, "categorical": _categorical_action, "box": _box_action}


def _block_action_reader(kind: str, array: np.ndarray):
    """``read()`` -> the ``k`` actions of a block (rows of ``array``), as TorchRL's ``GymEnv`` passes them."""
    if kind == "onehot":
        return lambda: array.argmax(-1).tolist()
    if kind == "categorical":
        return lambda: array.tolist()
    return lambda: list(np.array(array))


def block_stepper(steppers: list, views: BufferViews) -> GymBlockStepper | None:
    """The gymnasium family's block stepper over ``steppers`` when they are all :class:`GymEnvStepper` envs with
    one ``Box`` observation whose rows have its shape, the same action kind and the same frame skip; else None."""
    if not steppers or not all(type(s) is GymEnvStepper for s in steppers):
        return None
    first = steppers[0]
    key = first.observation_key
    if key is None or tuple(first.gym_env.observation_space.shape) != tuple(views.next_np[key].shape[1:]):
        return None
    if any(s.action_kind != first.action_kind or s.frame_skip != first.frame_skip for s in steppers):
        return None
    read_actions = _block_action_reader(first.action_kind, views.action_np["action"])
    return GymBlockStepper([s.gym_env for s in steppers], [s.autoreset for s in steppers], views, read_actions,
                           observation_key=key, frame_skip=first.frame_skip)


def _stepper(env) -> GymEnvStepper | None:
    """The native stepper of a TorchRL ``GymEnv`` / ``GymWrapper`` that can take the native road; None for any
    other env (a ``GymEnv`` that cannot is marked with the reason, and stepped by the TorchRL family)."""
    if not isinstance(env, GymWrapper):
        return None
    stepper = marked_stepper(env, why_not_native(env), NATIVE, GymEnvStepper)
    inner_road = getattr(env._env, ROAD_ATTRIBUTE, None)
    if stepper is not None and stepper.gym_env is not env._env and inner_road is not None:
        object.__setattr__(env, ROAD_ATTRIBUTE, f"{NATIVE}; the gymnasium env inside: {inner_road}")
    return stepper


FAMILY = Family(name="TorchRL GymEnv", priority=15, stepper=_stepper, block=block_stepper)
