"""The gymnasium family: ``gymnasium.Env`` envs, stepped one by one or as one block.

**Spaces -> TorchRL specs** (structural, unbatched):

=====================  ==================================================
gymnasium space        TorchRL spec
=====================  ==================================================
``Box``                ``Bounded`` if every bound is finite, else ``Unbounded``
``Discrete(n)``        ``Categorical(n)``, shape ``[]``, int64 (``start`` is removed)
``MultiDiscrete``      ``MultiCategorical(nvec)``, int64 (``start`` is removed)
``MultiBinary``        ``Binary``, the space's dtype
``Dict``               ``Composite`` with the same keys (nested)
``Tuple``              ``Composite`` with keys ``"0"``, ``"1"``, ...
=====================  ==================================================

Observations: Dict/Tuple entries become top-level keys, anything else is ``"observation"``; actions are under
``"action"``; rewards ``float32 [1]``; ``done`` / ``terminated`` / ``truncated`` ``bool [1]``.

**Values in and out of the buffers**: what an env returns is checked (shape, ``None``, values the buffer's dtype
cannot hold; see ``engine/values.py``) and written into numpy views of its buffer rows; actions are read in the
form ``env.step`` takes (numpy scalars of a ``Discrete`` space's dtype, as gymnasium's vector envs pass them).

**Steppers**: :class:`GymStepper` (one env) and :class:`GymBlockStepper` (a group's ``k`` envs with a ``Box``
observation as one block: one numpy write per key). A gymnasium env may define ``engine_autoreset()``, returning
``(observation, info)`` as ``reset()`` does: what the automatic reset after an episode's end runs instead of
``reset()`` (the vector faces' autoreset modes are written so, see ``vector/worker.py``); ``reset()`` is then only
called when the main process asks for a reset.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, TensorSpec, Unbounded

from ..engine.shared import BufferViews, EnvSpecs
from ..engine.specs import DONE_KEYS, done_spec, reward_spec, torch_dtype
from ..engine.stepper import Family
from ..engine.values import BadValue, Guard, broadcast_error, value_error


def space_to_spec(space: spaces.Space) -> TensorSpec:
    """Convert one gymnasium space into the matching unbatched TorchRL spec (see the module table)."""
    if isinstance(space, spaces.Box):
        dtype = torch_dtype(space.dtype)
        low = np.asarray(space.low)
        high = np.asarray(space.high)
        if np.isfinite(low).all() and np.isfinite(high).all():
            return Bounded(
                low=torch.as_tensor(low, dtype=dtype),
                high=torch.as_tensor(high, dtype=dtype),
                shape=space.shape,
                dtype=dtype,
            )
        return Unbounded(shape=space.shape, dtype=dtype)
    if isinstance(space, spaces.Discrete):
        return Categorical(int(space.n), shape=(), dtype=torch.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiCategorical(torch.as_tensor(space.nvec), shape=space.shape, dtype=torch.int64)
    if isinstance(space, spaces.MultiBinary):
        return Binary(shape=space.shape, dtype=torch_dtype(space.dtype))
    if isinstance(space, spaces.Dict):
        return Composite({key: space_to_spec(sub) for key, sub in space.spaces.items()}, shape=())
    if isinstance(space, spaces.Tuple):
        return Composite({str(i): space_to_spec(sub) for i, sub in enumerate(space.spaces)}, shape=())
    raise TypeError(
        f"gymnasium space {space!r} has no TorchRL counterpart here; supported spaces are "
        "Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple."
    )


def observation_spec_from_space(space: spaces.Space) -> Composite:
    """Full observation spec: Dict/Tuple entries become top-level keys, anything else is ``"observation"``."""
    spec = space_to_spec(space)
    if isinstance(spec, Composite):
        return spec
    return Composite(observation=spec, shape=())


def action_spec_from_space(space: spaces.Space) -> Composite:
    """Full action spec: always under the key ``"action"`` (a nested Composite for Dict/Tuple spaces)."""
    return Composite(action=space_to_spec(space), shape=())


#: types whose values are always scalars (shape ``()``): the per-step check of rewards and flags skips them.
SCALARS = frozenset({float, int, bool, np.float32, np.float64, np.bool_, np.int32, np.int64})


class Mismatch(Exception):
    """Raised by a writer: the value for ``key`` has shape ``received`` where ``expected`` is declared."""

    def __init__(self, key, expected: tuple, received):
        super().__init__(key, expected, received)
        self.key = key
        self.expected = expected
        self.received = received


def shape_of(value):
    """The shape of an env's value (``()`` for a Python or numpy scalar); None if it has none (a ragged
    list, an object numpy cannot read as an array)."""
    shape = getattr(value, "shape", None)
    if type(shape) is tuple:
        return shape
    if shape is not None:
        return tuple(shape)  # e.g. a torch.Size
    try:
        return np.shape(value)
    except ValueError:
        return None


def check_scalars(**values) -> None:
    """Raise :class:`Mismatch` for the first value that is not a scalar (shape ``()``), :class:`BadValue` (with
    its ``key``) for one that is not a number (None, a string)."""
    for key, value in values.items():
        SCALAR_GUARD(value, key)
        received = shape_of(value)
        if received != ():
            raise Mismatch(key, (), received)


#: rewards and done flags: any real number (a bool buffer's flags are truth values, as gymnasium reads them)
SCALAR_GUARD = Guard(np.float64)


def gym_value_hint(key) -> str:
    """How to fix a gymnasium env's value that :class:`~.values.Guard` refused."""
    if key in FLAGS:
        return f"return {key} as a Python or numpy number"
    return ("return values that the dtype of the env's observation_space holds, or declare a dtype that holds "
            "them")


FLAGS = ("reward", "terminated", "truncated")


def shape_error(env: int | str, call: str, key, expected: tuple, received) -> ValueError:
    """The ``ValueError`` for a gymnasium env's value of the wrong shape (see :func:`~..engine.values.broadcast_error`).
    ``received``: a shape, or None for a value without one (a ragged list)."""
    if key in FLAGS:
        return broadcast_error(env, call, repr(key), received, "a gymnasium env must return a scalar, shape ()",
                               f"return {key} as a Python or numpy scalar")
    return broadcast_error(env, call, f"observation {key!r}", received,
                           f"the env's observation_space declares shape {tuple(expected)}",
                           "make reset() and step() return exactly the shape its observation_space declares (or "
                           "declare the shape they return in observation_space)")


def observation_writer(space: spaces.Space, check: bool = True):
    """``write(obs, tree, i)`` for a full observation (Dict/Tuple at the top level, else ``"observation"``).

    ``check``: raise :class:`Mismatch` (before writing that leaf) when a leaf's shape is not the one its
    space declares (which is its buffer row's shape)."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return leaf_writer(space, (), check)
    write_leaf = leaf_writer(space, ("observation",), check)

    def write(obs, tree, i):
        write_leaf(obs, tree["observation"], i)

    return write


def leaf_writer(space: spaces.Space, key: tuple, check: bool):
    if isinstance(space, spaces.Dict):
        writers = {name: leaf_writer(sub, (*key, name), check) for name, sub in space.spaces.items()}

        def write_dict(obs, node, i):
            for name, write in writers.items():
                write(obs[name], node[name], i)

        return write_dict
    if isinstance(space, spaces.Tuple):
        writers = [(str(j), leaf_writer(sub, (*key, str(j)), check)) for j, sub in enumerate(space.spaces)]

        def write_tuple(obs, node, i):
            for j, (name, write) in enumerate(writers):
                write(obs[j], node[name], i)

        return write_tuple
    name = key[0] if len(key) == 1 else key
    shape = tuple(space.shape)  # the leaf's row shape in the buffers (see space_to_spec)

    categorical = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete))
    guard = Guard(np.int64 if categorical else space.dtype)  # the leaf's buffer dtype (see space_to_spec)
    safe = guard.safe

    def check_value(value):
        """Mismatch for another shape; BadValue for None or a value the buffer's dtype cannot hold."""
        if value is not None and getattr(value, "shape", None) != shape and shape_of(value) != shape:
            raise Mismatch(name, shape, shape_of(value))
        guard(value, name)

    start = getattr(space, "start", None)
    if categorical and np.any(start != 0):

        def write_shifted(value, array, i):
            if check:
                check_value(value)
            array[i] = np.asarray(value) - start

        return write_shifted

    if not check:

        def write_unchecked(value, array, i):
            array[i] = value

        return write_unchecked

    def write(value, array, i):
        if getattr(value, "shape", None) != shape or getattr(value, "dtype", None) not in safe:
            check_value(value)
        array[i] = value

    return write


def action_reader(space: spaces.Space):
    """``read(node, i)`` -> the action for env ``i`` in the form ``env.step`` expects."""
    if isinstance(space, spaces.Dict):
        readers = {key: action_reader(sub) for key, sub in space.spaces.items()}
        return lambda node, i: {key: read(node[key], i) for key, read in readers.items()}
    if isinstance(space, spaces.Tuple):
        readers = [(str(j), action_reader(sub)) for j, sub in enumerate(space.spaces)]
        return lambda node, i: tuple(read(node[key], i) for key, read in readers)
    if isinstance(space, spaces.Discrete):  # a numpy scalar of the space's dtype, as gymnasium's vector envs pass
        start = space.start
        scalar = space.dtype.type
        return lambda array, i: scalar(array[i] + start)
    if isinstance(space, spaces.MultiDiscrete):
        start = space.start
        dtype = space.dtype
        return lambda array, i: (array[i] + start).astype(dtype)
    dtype = space.dtype
    return lambda array, i: np.array(array[i], dtype=dtype)


def autoreset_of(env: gym.Env):
    """What resets ``env`` after an episode's end: its ``engine_autoreset`` if it has one, else its ``reset``."""
    autoreset = getattr(env, "engine_autoreset", None)
    return autoreset if callable(autoreset) else env.reset


class GymRow:
    """One gymnasium env's row of the buffers, for its stepper: numpy views of the root, "next", action, reward and
    done rows (:meth:`bind`), the step's reward and done flags checked and written (:meth:`_write_outcome`), and the
    ``ValueError`` naming the env for a value refused there (:meth:`_error`)."""

    def _write_outcome(self, reward, terminated, truncated) -> bool:
        """Check (values of an unusual type only) and write the env's reward and done flags into its ``[1]`` rows;
        returns whether its episode ended."""
        if type(reward) not in SCALARS or type(terminated) not in SCALARS or type(truncated) not in SCALARS:
            try:
                check_scalars(reward=reward, terminated=terminated, truncated=truncated)
            except (Mismatch, BadValue) as bad:
                raise self._error(bad, "step()") from None
        i = self._i
        done_flag, terminated_flag, truncated_flag = self._flags
        self._reward[i, 0] = reward
        terminated_flag[i, 0] = terminated
        truncated_flag[i, 0] = truncated
        done = terminated or truncated
        done_flag[i, 0] = done
        return done

    def bind(self, views: BufferViews, index: int) -> None:
        self._i = index
        self._env_index = views.first_index + index
        self._root = views.root_np
        self._next = views.next_np
        self._action = views.action_np["action"]
        self._reward = views.next_np["reward"]
        self._flags = [views.next_np[key] for key in DONE_KEYS]

    def _error(self, bad: Mismatch | BadValue, call: str) -> ValueError:
        if isinstance(bad, BadValue):
            return value_error(self._env_index, call, bad.key, bad, gym_value_hint(bad.key))
        return shape_error(self._env_index, call, bad.key, bad.expected, bad.received)


class GymStepper(GymRow):
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
        except (Mismatch, BadValue) as bad:
            raise self._error(bad, "step()") from None
        done = self._write_outcome(reward, terminated, truncated)
        if done:
            obs, _ = self.autoreset()
            try:
                self._write_obs(obs, self._root, i)
            except (Mismatch, BadValue) as bad:
                raise self._error(bad, "reset()") from None
        else:
            self._write_obs_unchecked(obs, self._root, i)  # checked above

    def close(self) -> None:
        self.env.close()


class GymBlockStepper:
    """``k`` gymnasium envs with one ``Box`` observation stepped as a block: results are gathered in lists and
    written with one numpy assignment per key (per env, a list append instead of a numpy write). Every result's
    shape is checked before the lists are written (a mismatch is the same ``ValueError`` as for a ``GymStepper``,
    naming the first env at fault): numpy would broadcast a list of ``(1,)`` observations into the ``[k, 4]`` rows.

    Writes the same data as stepping each ``GymStepper``; :func:`block_stepper` decides when it applies. TorchRL's
    ``GymEnv`` road (``gymenv.py``) steps its envs with the same block, with its own action reader, observation key
    and frame skip.

    Args:
        envs: the ``k`` gymnasium envs.
        autoresets: for each env, what resets it after an episode's end (``() -> (observation, info)``).
        views: the group's buffer views (``[k]`` rows).
        read_actions: ``() -> list`` of the ``k`` actions in the form ``env.step`` takes, read from the action rows.
        observation_key: the observation's key in the buffers (``"observation"``, or ``"pixels"`` for TorchRL's
            ``GymEnv(from_pixels=True)``).
        frame_skip: env steps per step, rewards summed, stopping at an episode's end (as TorchRL's ``GymEnv``).
    """

    def __init__(self, envs: list, autoresets: list, views: BufferViews, read_actions,
                 observation_key: str = "observation", frame_skip: int = 1):
        self.envs = envs
        self._autoresets = autoresets
        self._read_actions = read_actions
        self._frame_skip = frame_skip
        #: the observation's key in the buffers (the worker's rollout recording writes it into a rollout's columns)
        self.observation_key = observation_key
        #: the observation rows of the buffers ("next", root); see write_observations_to
        self.buffer_observations = (views.next_np[observation_key], views.root_np[observation_key])
        self._next_obs, self._root_obs = self.buffer_observations
        self._obs_shape = self._next_obs.shape[1:]
        self._obs_guard = Guard(self._next_obs.dtype)
        self._reward = views.next_np["reward"][:, 0]
        self._done, self._terminated, self._truncated = (views.next_np[key][:, 0] for key in DONE_KEYS)
        self._first = views.first_index

    def step(self) -> None:
        observations = []
        rewards = []
        terminated = []
        truncated = []
        shape = self._obs_shape
        scalars = SCALARS
        exact = True
        safe = self._obs_guard.safe
        frame_skip = self._frame_skip
        for env, action in zip(self.envs, self._read_actions()):
            if frame_skip == 1:
                obs, reward, term, trunc, _ = env.step(action)
            else:
                obs, reward, term, trunc = skip_frames(env, action, frame_skip)
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
                    raise shape_error(self._first + i, "reset()", self.observation_key, self._obs_shape, shape_of(obs))
                self._guarded(self._obs_guard, obs, i, "reset()", self.observation_key)
                self._root_obs[i] = obs

    def write_observations_to(self, next_obs: np.ndarray, root_obs: np.ndarray) -> None:
        """Where the next steps write their observations (``[k, *shape]`` each): the buffers' rows
        (:attr:`buffer_observations`), or a rollout's columns (``env_worker.Recording``: no copy from the buffers)."""
        self._next_obs = next_obs
        self._root_obs = root_obs

    def _check(self, observations: list, rewards: list, terminated: list, truncated: list) -> None:
        """The error for the first env whose step() result is None, has a shape other than its buffer row's, or
        holds a value its buffer's dtype cannot hold."""
        obs_key = self.observation_key
        for key, values, expected in ((obs_key, observations, self._obs_shape), ("reward", rewards, ()),
                                      ("terminated", terminated, ()), ("truncated", truncated, ())):
            for j, value in enumerate(values):
                if value is None:
                    self._guarded(SCALAR_GUARD, value, j, "step()", key)
                received = shape_of(value)
                if received != expected:
                    raise shape_error(self._first + j, "step()", key, expected, received)
                self._guarded(self._obs_guard if key == obs_key else SCALAR_GUARD, value, j, "step()", key)

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
    read_actions = _block_action_reader(env.action_space, views.action_np["action"])
    return GymBlockStepper([s.env for s in steppers], [s.autoreset for s in steppers], views, read_actions)


def skip_frames(env: gym.Env, action, frame_skip: int) -> tuple:
    """``frame_skip`` steps of ``env`` with ``action``, as TorchRL's ``GymEnv`` takes them: rewards summed from
    ``0`` in the order they come, stopping after the step that ends the episode. Returns ``(observation, reward,
    terminated, truncated)`` of the last step taken (the reward summed)."""
    reward = 0
    for _ in range(frame_skip):
        obs, step_reward, terminated, truncated, _ = env.step(action)
        if type(step_reward) not in SCALARS:
            try:
                check_scalars(reward=step_reward)
            except (Mismatch, BadValue):
                return obs, step_reward, terminated, truncated  # not a number: the caller's check refuses it
        reward = reward + step_reward
        if terminated or truncated:
            break
    return obs, reward, terminated, truncated


def _block_action_reader(space: spaces.Space, array: np.ndarray):
    """``read()`` -> the ``k`` actions of the block (rows of ``array``) in the form ``env.step`` expects."""
    if isinstance(space, spaces.Discrete):
        # numpy scalars of the space's dtype, as gymnasium's vector envs pass them (an int costs a Discrete space's
        # contains(), which envs such as CartPole assert, ~3 µs more per step)
        start = space.start
        dtype = space.dtype
        if start == 0:
            return lambda: list(array.astype(dtype, copy=False))
        return lambda: list((array + start).astype(dtype, copy=False))
    dtype = space.dtype
    return lambda: list(np.array(array, dtype=dtype))  # a copy: an env may keep its action


def _remake(env) -> str | None:
    """``gymnasium.make('<id>')`` for an env made by ``gymnasium.make`` (its type is the outermost wrapper's)."""
    if not isinstance(env, gym.Env):
        return None
    env_id = getattr(getattr(env, "spec", None), "id", None)
    return f"gymnasium.make({env_id!r})" if isinstance(env_id, str) and env_id else None


def _stepper(env) -> GymStepper | None:
    return GymStepper(env) if isinstance(env, gym.Env) else None


def _is_env(obj) -> bool:
    return isinstance(obj, gym.Env)


FAMILY = Family(name="gymnasium", priority=10, stepper=_stepper, block=block_stepper, is_instance=_is_env,
                remake=_remake)
