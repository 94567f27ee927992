"""Steppers: one small class per env family that writes a step's results straight into the buffers.

Every stepper owns one env and one index ``i`` in a group's buffer views (see ``shared.py``) and offers:

- ``specs``: :class:`~tdcollect.envs.shared.EnvSpecs` (unbatched);
- ``bind(views, i)``: remember where to read actions and write results;
- ``reset(seed)``: reset the env (seeding it when ``seed`` is not None) and write the observation into
  ``root[i]`` (done flags stay False);
- ``step()``: read ``action[i]``, step, write ``next[i]`` (observation, reward, done flags); then write the
  state for the next action into ``root[i]``: the reset observation if the env was done (auto-reset), else
  the next observation;
- ``close()``.

Every value an env returns is checked against the shape its space / spec declares before it is written: a
``(1,)`` observation where ``(4,)`` is declared raises a ``ValueError`` naming the env, the key and both
shapes (see :func:`shape_error`); nothing is broadcast. Dtypes are cast as numpy / torch cast them.

Families: :class:`GymStepper` (``gymnasium.Env``), :class:`TorchRLStepper` (unbatched TorchRL ``EnvBase``),
:class:`DmEnvStepper` (``dm_env.Environment``; its key layouts are in ``dm_specs.py`` and ``dm_players.py``); a
PettingZoo env (parallel or AEC) steps as TorchRL's ``PettingZooWrapper`` with its defaults (AEC:
``use_mask=True``). A TorchRL env may offer a faster stepper of its own through a ``native_stepper()`` method
(``DMLab2dEnv`` does); it must produce the same data as going through the env's ``EnvBase`` API.

A gymnasium env may define ``engine_autoreset()``, returning ``(observation, info)`` as ``reset()`` does: what the
automatic reset after an episode's end runs instead of ``reset()`` (the vector facades' autoreset modes are written
so, see ``vector_worker.EngineEnv``); ``reset()`` is then only called when the main process asks for a reset.
"""
from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from .gym_io import (
    SCALAR_GUARD,
    SCALARS,
    Mismatch,
    action_reader,
    check_scalars,
    gym_value_hint,
    observation_writer,
    shape_error,
    shape_of,
)
from .shared import BufferViews, EnvSpecs, key_tuple
from .specs import (
    DONE_KEYS,
    action_spec_from_space,
    done_spec,
    observation_spec_from_space,
    reward_spec,
)
from .user_warnings import warn_caller
from .values import BadValue, Guard, value_error


def make_stepper(env, owner: str = "ParallelEnv"):
    """The stepper for ``env``, chosen by its family."""
    if isinstance(env, gym.Env):
        return GymStepper(env)
    if isinstance(env, EnvBase):
        native = getattr(env, "native_stepper", None)
        return native() if callable(native) else TorchRLStepper(env)
    dm_env = sys.modules.get("dm_env")  # an env of that family means the module is already imported
    if dm_env is not None and isinstance(env, dm_env.Environment):
        return DmEnvStepper(env)
    pettingzoo = sys.modules.get("pettingzoo")
    if pettingzoo is not None and isinstance(env, (pettingzoo.ParallelEnv, pettingzoo.AECEnv)):
        from torchrl.envs.libs.pettingzoo import PettingZooWrapper

        # TorchRL's agent groups, keys and defaults; an AEC env takes turns, which TorchRL's wrapper only steps
        # with its agent masks (use_mask=True)
        return TorchRLStepper(PettingZooWrapper(env, use_mask=not isinstance(env, pettingzoo.ParallelEnv)))
    raise TypeError(
        f"{owner}'s factory returned {type(env).__module__}.{type(env).__name__}, which is not an env "
        "it can step: return a gymnasium.Env, a torchrl EnvBase, a dm_env.Environment or a PettingZoo env "
        "from the factory."
    )


def autoreset_of(env: gym.Env):
    """What resets ``env`` after an episode's end: its ``engine_autoreset`` if it has one, else its ``reset``."""
    autoreset = getattr(env, "engine_autoreset", None)
    return autoreset if callable(autoreset) else env.reset


class GymStepper:
    """A ``gymnasium.Env``: numpy results are written into numpy views of the buffers, one env at a time."""

    def __init__(self, env: gym.Env):
        self.env = env
        self.specs = EnvSpecs(
            observation=observation_spec_from_space(env.observation_space),
            action=action_spec_from_space(env.action_space),
            reward=reward_spec(),
            done=done_spec(),
        )
        self._write_obs = observation_writer(env.observation_space)
        self._write_obs_unchecked = observation_writer(env.observation_space, check=False)
        self._read_action = action_reader(env.action_space)
        self.autoreset = autoreset_of(env)

    def bind(self, views: BufferViews, index: int) -> None:
        self._i = index
        self._env_index = views.first_index + index
        self._root = views.root_np
        self._next = views.next_np
        self._action = views.action_np["action"]
        self._reward = views.next_np["reward"]
        self._flags = [views.next_np[key] for key in DONE_KEYS]

    def reset(self, seed: int | None = None) -> None:
        obs, _ = self.env.reset(seed=seed)
        try:
            self._write_obs(obs, self._root, self._i)
        except (Mismatch, BadValue) as bad:
            raise self._error(bad, "reset()") from None

    def step(self) -> None:
        i = self._i
        obs, reward, terminated, truncated, _ = self.env.step(self._read_action(self._action, i))
        try:
            self._write_obs(obs, self._next, i)
            if type(reward) not in SCALARS or type(terminated) not in SCALARS or type(truncated) not in SCALARS:
                check_scalars(reward=reward, terminated=terminated, truncated=truncated)
        except (Mismatch, BadValue) as bad:
            raise self._error(bad, "step()") from None
        done_flag, terminated_flag, truncated_flag = self._flags
        self._reward[i, 0] = reward
        terminated_flag[i, 0] = terminated
        truncated_flag[i, 0] = truncated
        done = terminated or truncated
        done_flag[i, 0] = done
        if done:
            obs, _ = self.autoreset()
            try:
                self._write_obs(obs, self._root, i)
            except (Mismatch, BadValue) as bad:
                raise self._error(bad, "reset()") from None
        else:
            self._write_obs_unchecked(obs, self._root, i)  # checked above

    def _error(self, bad: Mismatch | BadValue, call: str) -> ValueError:
        if isinstance(bad, BadValue):
            return value_error(self._env_index, call, bad.key, bad, gym_value_hint(bad.key))
        return shape_error(self._env_index, call, bad.key, bad.expected, bad.received, family="gym")

    def close(self) -> None:
        self.env.close()


class GymBlockStepper:
    """``k`` ``GymStepper`` envs with one ``Box`` observation stepped as a block: results are gathered in
    lists and written with one numpy assignment per key (per env, a list append instead of a numpy write).
    Every result's shape is checked before the lists are written (a mismatch is the same ``ValueError`` as
    for a ``GymStepper``, naming the first env at fault): numpy would broadcast a list of ``(1,)``
    observations into the ``[k, 4]`` rows.

    Writes the same data as stepping each ``GymStepper``; :func:`block_stepper` decides when it applies.
    """

    def __init__(self, steppers: list[GymStepper], views: BufferViews):
        self.envs = [stepper.env for stepper in steppers]
        self._autoresets = [stepper.autoreset for stepper in steppers]
        self._read_actions = _block_action_reader(steppers[0].env.action_space, views.action_np["action"])
        #: the observation rows of the buffers ("next", root); see write_observations_to
        self.buffer_observations = (views.next_np["observation"], views.root_np["observation"])
        self._next_obs, self._root_obs = self.buffer_observations
        self._obs_shape = self._next_obs.shape[1:]
        self._obs_guard = Guard(self._next_obs.dtype)
        self._reward = views.next_np["reward"][:, 0]
        self._done, self._terminated, self._truncated = (views.next_np[key][:, 0] for key in DONE_KEYS)
        self._first = views.first_index

    def step(self) -> None:
        observations, rewards, terminated, truncated = [], [], [], []
        shape, scalars, exact, safe = self._obs_shape, SCALARS, True, self._obs_guard.safe
        for env, action in zip(self.envs, self._read_actions()):
            obs, reward, term, trunc, _ = env.step(action)
            if exact and (getattr(obs, "shape", None) != shape or type(reward) not in scalars
                          or type(term) not in scalars or type(trunc) not in scalars or obs.dtype not in safe):
                exact = False
            observations.append(obs)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
        if not exact:  # some value is not a numpy array / scalar of the usual kind: check each one
            self._check(observations, rewards, terminated, truncated)
        self._next_obs[...] = observations
        self._reward[...] = rewards
        self._terminated[...] = terminated
        self._truncated[...] = truncated
        np.logical_or(self._terminated, self._truncated, out=self._done)
        self._root_obs[...] = self._next_obs
        if self._done.any():
            for i in np.flatnonzero(self._done).tolist():
                obs, _ = self._autoresets[i]()
                if shape_of(obs) != self._obs_shape:
                    raise shape_error(self._first + i, "reset()", "observation", self._obs_shape,
                                      shape_of(obs), family="gym")
                self._guarded(self._obs_guard, obs, i, "reset()", "observation")
                self._root_obs[i] = obs

    def write_observations_to(self, next_obs: np.ndarray, root_obs: np.ndarray) -> None:
        """Where the next steps write their observations (``[k, *shape]`` each): the buffers' rows
        (:attr:`buffer_observations`), or a rollout's columns (``env_worker.Recording``: no copy from the buffers)."""
        self._next_obs, self._root_obs = next_obs, root_obs

    def _check(self, observations: list, rewards: list, terminated: list, truncated: list) -> None:
        """The error for the first env whose step() result is None, has a shape other than its buffer row's, or
        holds a value its buffer's dtype cannot hold."""
        for key, values, expected in (("observation", observations, self._obs_shape), ("reward", rewards, ()),
                                      ("terminated", terminated, ()), ("truncated", truncated, ())):
            for j, value in enumerate(values):
                if value is None:
                    self._guarded(SCALAR_GUARD, value, j, "step()", key)
                received = shape_of(value)
                if received != expected:
                    raise shape_error(self._first + j, "step()", key, expected, received, family="gym")
                self._guarded(self._obs_guard if key == "observation" else SCALAR_GUARD, value, j, "step()", key)

    def _guarded(self, guard: Guard, value, j: int, call: str, key: str) -> None:
        try:
            guard(value)
        except BadValue as bad:
            raise value_error(self._first + j, call, key, bad, gym_value_hint(key)) from None


def block_stepper(steppers: list, views: BufferViews) -> GymBlockStepper | None:
    """A :class:`GymBlockStepper` over ``steppers`` when they are all ``GymStepper`` envs with a ``Box``
    observation and a ``Discrete`` or ``Box`` action; else None (step them one by one)."""
    if not steppers or not all(type(s) is GymStepper for s in steppers):
        return None
    env = steppers[0].env
    if not isinstance(env.observation_space, spaces.Box):
        return None
    if not isinstance(env.action_space, (spaces.Discrete, spaces.Box)):
        return None
    return GymBlockStepper(steppers, views)


def _block_action_reader(space: spaces.Space, array: np.ndarray):
    """``read()`` -> the ``k`` actions of the block (rows of ``array``) in the form ``env.step`` expects."""
    if isinstance(space, spaces.Discrete):
        # numpy scalars of the space's dtype, as gymnasium's vector envs pass them (an int costs a Discrete space's
        # contains(), which envs such as CartPole assert, ~3 µs more per step)
        start, dtype = space.start, space.dtype
        if start == 0:
            return lambda: list(array.astype(dtype, copy=False))
        return lambda: list((array + start).astype(dtype, copy=False))
    dtype = space.dtype
    return lambda: list(np.array(array, dtype=dtype))  # a copy: an env may keep its action


class TorchRLStepper:
    """A TorchRL ``EnvBase``, unbatched or batched (its rows in the buffers are then ``[*env.batch_size, ...]``):
    its tensordicts are copied into the buffer views (each leaf's shape checked first: ``update_`` would
    broadcast). Steps go through the env's ``step_and_maybe_reset``, so a batched env resets the elements that
    ended as TorchRL does. Non-tensor entries (strings, objects) have no place in the buffers: after each reset
    and step they are left in ``objects`` (``{"root": td, "next": td}`` holding only them) for the group to
    send."""

    def __init__(self, env: EnvBase):
        self.env = env
        self.specs = EnvSpecs(
            observation=env.full_observation_spec.clone().cpu(),
            action=env.full_action_spec.clone().cpu(),
            reward=env.full_reward_spec.clone().cpu(),
            done=env.full_done_spec.clone().cpu(),
        )
        root_objects, next_objects = self.specs.non_tensor_keys()
        self._root_keys = [key for key in self.specs.root_spec().keys(True, True) if key not in root_objects]
        self._next_keys = [key for key in self.specs.next_spec().keys(True, True) if key not in next_objects]
        self._root_objects, self._next_objects = root_objects, next_objects
        self.has_objects = bool(root_objects or next_objects)
        self.objects: dict | None = None
        self._state = None

    def bind(self, views: BufferViews, index: int) -> None:
        self._root = views.root[index]
        self._next = views.next[index]
        self._action = views.action[index]
        self._env_index = views.first_index + index
        self._root_shapes = [_expected(self._root.get(key), key) for key in self._root_keys]
        self._next_shapes = [_expected(self._next.get(key), key) for key in self._next_keys]

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.env.set_seed(seed)
        self._state = self.env.reset()
        self._check(self._state, self._root_shapes, "reset()")
        _write(self._root, self._state.select(*self._root_keys))
        self._keep_objects(None)

    def reset_elements(self, mask: np.ndarray) -> None:
        """Reset the elements of a batched env where ``mask`` (bool, ``prod(batch_size)`` flags) is True, through
        the env's ``"_reset"`` entries; the other elements keep their state."""
        state = self._root.clone() if self._state is None else self._state.clone()
        flags = torch.from_numpy(mask.reshape(self.env.batch_size))
        for key in self.env.reset_keys:  # each "_reset" has the shape of the done flags beside it
            group = key_tuple(key)[:-1]
            shape = next(self.env.full_done_spec[done].shape for done in self.env.done_keys
                         if key_tuple(done)[:-1] == group)
            view = flags.reshape(*flags.shape, *([1] * (len(shape) - flags.dim())))
            state.set(key, view.expand(shape).clone())
        self._state = self.env.reset(state)
        self._check(self._state, self._root_shapes, "reset()")
        _write(self._root, self._state.select(*self._root_keys))
        self._keep_objects(None)

    def step(self) -> None:
        if self._state is None:  # stepped before any reset: the env starts from what the root buffer holds
            self._state = self._root.clone()
        state = self._state.update(self._action.clone())
        stepped, self._state = self.env.step_and_maybe_reset(state)
        stepped_next = stepped.get("next")
        self._check(stepped_next, self._next_shapes, "step()")
        self._check(self._state, self._root_shapes, "reset()")
        _write(self._next, stepped_next.select(*self._next_keys))
        _write(self._root, self._state.select(*self._root_keys))
        self._keep_objects(stepped_next)

    def _keep_objects(self, stepped_next) -> None:
        if self.has_objects:
            self.objects = {"root": self._state.select(*self._root_objects, strict=False),
                            "next": None if stepped_next is None else stepped_next.select(*self._next_objects,
                                                                                          strict=False)}

    def _check(self, td, shapes: list, call: str) -> None:
        for key, expected, dtype, guard in shapes:
            value = td.get(key, None)
            if value is None:
                continue
            if value.shape != expected:
                raise shape_error(self._env_index, call, key, expected, tuple(value.shape), family="torchrl")
            if value.dtype is not dtype:
                try:
                    guard.check(value)
                except BadValue as bad:
                    raise value_error(self._env_index, call, key, bad, _TORCHRL_VALUE_HINT) from None

    def close(self) -> None:
        # always called: a plain EnvBase subclass reports is_closed=True from its construction on
        self.env.close(raise_if_closed=False)


def _expected(buffer: torch.Tensor, key) -> tuple:
    """``(key, shape, dtype, guard)`` of a TorchRL env's entry, from its buffer row."""
    return key, tuple(buffer.shape), buffer.dtype, Guard(buffer.dtype)


_TORCHRL_VALUE_HINT = ("make _reset() and _step() return tensors of the dtypes its specs declare, or values that "
                       "fit them")


class DmEnvStepper:
    """A ``dm_env.Environment``: timestep values are written into numpy views of the buffers.

    ``layout``: a :class:`~tdcollect.envs.dm_specs.DmLayout` (default:
    :func:`~tdcollect.envs.dm_players.layout_of`: an agent group for per-player spec sequences such as
    MeltingPot's, else the observation dict's entries as top-level keys, actions under ``"action"``, ``"reward"``
    ``[1]``).
    dm_env has no seeding call, so a seed passed to ``reset`` is ignored (with a warning, once); subclasses
    that know how to seed their env override :meth:`seed`.
    """

    def __init__(self, env, layout=None):
        from . import dm_players, dm_specs  # need dm_env, which only this family brings

        self._dm = dm_specs
        self.env = env
        self.layout = layout if layout is not None else dm_players.layout_of(env)
        self.specs = EnvSpecs(
            observation=self.layout.observation,
            action=self.layout.action,
            reward=self.layout.reward,
            done=self.layout.done,
        )
        self._warned_seed = False

    def bind(self, views: BufferViews, index: int) -> None:
        dm, layout, at = self._dm, self.layout, (index,)
        self._write_root = dm.TimestepWriter(layout.observation_slots, views.root_np, at)
        self._write_next = dm.TimestepWriter(
            layout.observation_slots + layout.reward_slots, views.next_np, at
        )
        self._read_action = dm.ActionReader(layout.action_slots, views.action_np, at)
        self._flags = [views.next_np[key][index, ...] for key in DONE_KEYS]
        self._env_index = views.first_index + index
        keys = dict.fromkeys(slot.key for slot in layout.observation_slots)  # the next observation, root's next
        self._carry = [(dm.leaf_array(views.root_np, key)[index, ...], dm.leaf_array(views.next_np, key)[index, ...])
                       for key in keys]  # [index, ...]: a view even where a leaf is one value per env

    def seed(self, seed: int) -> None:
        """Seed the env before its next reset: not possible for a plain dm_env env (warns once)."""
        if not self._warned_seed:
            self._warned_seed = True
            warn_caller(f"{type(self.env).__name__} is a dm_env.Environment, which has no seeding call: the seed "
                        "is ignored.")

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.seed(seed)
        self._write(self._write_root, self.env.reset(), "reset()")

    def step(self) -> None:
        timestep = self.env.step(self._read_action())
        self._write(self._write_next, timestep, "step()")
        flags = self._dm.done_flags(timestep)
        for array, flag in zip(self._flags, flags):
            array[...] = flag
        if flags[0]:
            self._write(self._write_root, self.env.reset(), "reset()")
        else:
            for root, written in self._carry:  # already checked and converted: one copy per leaf
                np.copyto(root, written)

    def _write(self, writer, timestep, call: str) -> None:
        try:
            writer(timestep)
        except BadValue as bad:
            raise value_error(self._env_index, call, bad.key, bad, "return timesteps whose values have the shapes "
                              "and fit the dtypes of the env's observation_spec() and reward_spec()") from None

    def close(self) -> None:
        self.env.close()


def _write(buffers: TensorDictBase, values: TensorDictBase) -> None:
    """Copy an env's outputs into its buffers, outside autograd (an env whose outputs carry a graph, e.g. stepped
    with actions that require grad, must not tie the shared buffers to it)."""
    with torch.no_grad():
        buffers.update_(values)
