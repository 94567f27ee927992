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

Families: :class:`GymStepper` (``gymnasium.Env``), :class:`TorchRLStepper` (unbatched TorchRL ``EnvBase``),
:class:`DmEnvStepper` (``dm_env.Environment``; its key layout is in ``dm_specs.py``). A TorchRL env may offer
a faster stepper of its own through a ``native_stepper()`` method (``DMLab2dEnv`` does); it must produce the
same data as going through the env's ``EnvBase`` API.
"""
from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from torchrl.envs import EnvBase

from .shared import BufferViews, EnvSpecs
from .specs import (
    DONE_KEYS,
    action_spec_from_space,
    done_spec,
    observation_spec_from_space,
    reward_spec,
)


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
    raise TypeError(
        f"{owner}'s factory returned {type(env).__module__}.{type(env).__name__}, which is not an env "
        "it can step: return a gymnasium.Env, a torchrl EnvBase or a dm_env.Environment from the factory."
    )


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
        self._write_obs = _observation_writer(env.observation_space)
        self._read_action = _action_reader(env.action_space)

    def bind(self, views: BufferViews, index: int) -> None:
        self._i = index
        self._root = views.root_np
        self._next = views.next_np
        self._action = views.action_np["action"]
        self._reward = views.next_np["reward"]
        self._flags = [views.next_np[key] for key in DONE_KEYS]

    def reset(self, seed: int | None = None) -> None:
        obs, _ = self.env.reset(seed=seed)
        self._write_obs(obs, self._root, self._i)

    def step(self) -> None:
        i = self._i
        obs, reward, terminated, truncated, _ = self.env.step(self._read_action(self._action, i))
        self._write_obs(obs, self._next, i)
        done_flag, terminated_flag, truncated_flag = self._flags
        self._reward[i, 0] = reward
        terminated_flag[i, 0] = terminated
        truncated_flag[i, 0] = truncated
        done = terminated or truncated
        done_flag[i, 0] = done
        if done:
            obs, _ = self.env.reset()
        self._write_obs(obs, self._root, i)

    def close(self) -> None:
        self.env.close()


class GymBlockStepper:
    """``k`` ``GymStepper`` envs with one ``Box`` observation stepped as a block: results are gathered in
    lists and written with one numpy assignment per key (per env, a list append instead of a numpy write).

    Writes the same data as stepping each ``GymStepper``; :func:`block_stepper` decides when it applies.
    """

    def __init__(self, steppers: list[GymStepper], views: BufferViews):
        self.envs = [stepper.env for stepper in steppers]
        self._read_actions = _block_action_reader(steppers[0].env.action_space, views.action_np["action"])
        self._next_obs = views.next_np["observation"]
        self._root_obs = views.root_np["observation"]
        self._reward = views.next_np["reward"][:, 0]
        self._done, self._terminated, self._truncated = (views.next_np[key][:, 0] for key in DONE_KEYS)

    def step(self) -> None:
        observations, rewards, terminated, truncated = [], [], [], []
        for env, action in zip(self.envs, self._read_actions()):
            obs, reward, term, trunc, _ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
        self._next_obs[...] = observations
        self._reward[...] = rewards
        self._terminated[...] = terminated
        self._truncated[...] = truncated
        np.logical_or(self._terminated, self._truncated, out=self._done)
        self._root_obs[...] = self._next_obs
        if self._done.any():
            for i in np.flatnonzero(self._done).tolist():
                self._root_obs[i], _ = self.envs[i].reset()


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
        start = int(space.start)
        if start == 0:
            return array.tolist
        return lambda: [int(a) + start for a in array.tolist()]
    dtype = space.dtype
    return lambda: list(np.array(array, dtype=dtype))  # a copy: an env may keep its action


def _observation_writer(space: spaces.Space):
    """``write(obs, tree, i)`` for a full observation (Dict/Tuple at the top level, else ``"observation"``)."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return _leaf_writer(space)
    write_leaf = _leaf_writer(space)

    def write(obs, tree, i):
        write_leaf(obs, tree["observation"], i)

    return write


def _leaf_writer(space: spaces.Space):
    if isinstance(space, spaces.Dict):
        writers = {key: _leaf_writer(sub) for key, sub in space.spaces.items()}

        def write_dict(obs, node, i):
            for key, write in writers.items():
                write(obs[key], node[key], i)

        return write_dict
    if isinstance(space, spaces.Tuple):
        writers = [(str(j), _leaf_writer(sub)) for j, sub in enumerate(space.spaces)]

        def write_tuple(obs, node, i):
            for j, (key, write) in enumerate(writers):
                write(obs[j], node[key], i)

        return write_tuple
    start = getattr(space, "start", None)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) and np.any(start != 0):

        def write_shifted(value, array, i):
            array[i] = np.asarray(value) - start

        return write_shifted

    def write(value, array, i):
        array[i] = value

    return write


def _action_reader(space: spaces.Space):
    """``read(node, i)`` -> the action for env ``i`` in the form ``env.step`` expects."""
    if isinstance(space, spaces.Dict):
        readers = {key: _action_reader(sub) for key, sub in space.spaces.items()}
        return lambda node, i: {key: read(node[key], i) for key, read in readers.items()}
    if isinstance(space, spaces.Tuple):
        readers = [(str(j), _action_reader(sub)) for j, sub in enumerate(space.spaces)]
        return lambda node, i: tuple(read(node[key], i) for key, read in readers)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return lambda array, i: int(array[i]) + start
    if isinstance(space, spaces.MultiDiscrete):
        start, dtype = space.start, space.dtype
        return lambda array, i: (array[i] + start).astype(dtype)
    dtype = space.dtype
    return lambda array, i: np.array(array[i], dtype=dtype)


class TorchRLStepper:
    """An unbatched TorchRL ``EnvBase``: its tensordicts are copied into the buffer views."""

    def __init__(self, env: EnvBase):
        if env.batch_size != ():
            raise ValueError(
                f"the factory returned a TorchRL env with batch_size {tuple(env.batch_size)}; "
                "return an unbatched env (batch_size []) and let envs_per_worker do the batching."
            )
        self.env = env
        self.specs = EnvSpecs(
            observation=env.full_observation_spec.clone().cpu(),
            action=env.full_action_spec.clone().cpu(),
            reward=env.full_reward_spec.clone().cpu(),
            done=env.full_done_spec.clone().cpu(),
        )
        self._root_keys = [*self.specs.root_spec().keys(True, True)]
        self._next_keys = [*self.specs.next_spec().keys(True, True)]
        self._state = None

    def bind(self, views: BufferViews, index: int) -> None:
        self._root = views.root[index]
        self._next = views.next[index]
        self._action = views.action[index]

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.env.set_seed(seed)
        self._state = self.env.reset()
        self._root.update_(self._state.select(*self._root_keys))

    def step(self) -> None:
        state = self._state.update(self._action.clone())
        stepped, self._state = self.env.step_and_maybe_reset(state)
        self._next.update_(stepped.get("next").select(*self._next_keys))
        self._root.update_(self._state.select(*self._root_keys))

    def close(self) -> None:
        if not self.env.is_closed:
            self.env.close()


class DmEnvStepper:
    """A ``dm_env.Environment``: timestep values are written into numpy views of the buffers.

    ``layout``: a :class:`~tdcollect.envs.dm_specs.DmLayout` (default: :func:`~tdcollect.envs.dm_specs.flat_layout`, i.e. the
    observation dict's entries as top-level keys, actions under ``"action"``, ``"reward"`` ``[1]``).
    dm_env has no seeding call, so a seed passed to ``reset`` is ignored (with a warning, once); subclasses
    that know how to seed their env override :meth:`seed`.
    """

    def __init__(self, env, layout=None):
        from . import dm_specs  # needs dm_env, which only this family brings

        self._dm = dm_specs
        self.env = env
        self.layout = layout if layout is not None else dm_specs.flat_layout(env)
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

    def seed(self, seed: int) -> None:
        """Seed the env before its next reset: not possible for a plain dm_env env (warns once)."""
        if not self._warned_seed:
            self._warned_seed = True
            warnings.warn(
                f"{type(self.env).__name__} is a dm_env.Environment, which has no seeding call: the seed "
                "is ignored.",
                stacklevel=3,
            )

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.seed(seed)
        self._write_root(self.env.reset())

    def step(self) -> None:
        timestep = self.env.step(self._read_action())
        self._write_next(timestep)
        flags = self._dm.done_flags(timestep)
        for array, flag in zip(self._flags, flags):
            array[...] = flag
        if flags[0]:
            timestep = self.env.reset()
        self._write_root(timestep)

    def close(self) -> None:
        self.env.close()
