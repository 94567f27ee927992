"""Numpy in and out of the step buffers for the vector facades: observations read in the structure of a gym
space, actions checked and written.

Spaces the buffers cannot hold travel pickled instead when the facade allows it (``shared_memory=False``):
:class:`PickledObservations` keeps each env's last posted observation, :class:`PickledActions` sends each env's
action with a call. Buffer keys (``vector_worker.engine_space`` decides them): a plain observation space lives under
``"observation"``; a ``Dict``/``Tuple`` one under ``("obs", ...)`` with the space's keys (``"0"``, ``"1"``, ... for a
``Tuple``). Actions live under ``"action"`` (``("action", key, ...)`` for ``Dict``/``Tuple`` spaces), with the
``start`` of ``Discrete``/``MultiDiscrete`` spaces removed (the workers add it back).
"""
from __future__ import annotations

import copy as copying
from collections.abc import Mapping

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from tensordict import TensorDictBase

from .shared import key_tuple, numpy_view


class Observations:
    """Batches ``[num_envs, ...]`` (and single rows) of observations, in the structure of ``space`` (the envs'
    own observation space): arrays of the space's dtypes, dicts of arrays, tuples of arrays, nested as the space
    is."""

    def __init__(self, space: spaces.Space, root: TensorDictBase, next_: TensorDictBase):
        key = ("obs",) if isinstance(space, (spaces.Dict, spaces.Tuple)) else ("observation",)
        self._trees = {"root": _tree(space, root, key), "next": _tree(space, next_, key)}

    def batch(self, which: str, copy: bool = True):
        """All envs' observations in buffer ``which`` (``"root"``: the state the next action is taken in;
        ``"next"``: what the last step returned); ``copy=False``: views, overwritten by the next step."""
        return _read(self._trees[which], slice(None), copy)

    def row(self, which: str, i: int):
        """Env ``i``'s observation in buffer ``which`` (a copy)."""
        return _read(self._trees[which], i, True)


class PickledObservations:
    """The same interface as :class:`Observations` for a space the buffers cannot hold: each env's last
    observation as its env posted it (pickled, ``vector_worker.NEXT_OBS`` / ``ROOT_OBS``), batched as gymnasium
    batches such a space (``concatenate``: a tuple with one entry per env)."""

    def __init__(self, space: spaces.Space, num_envs: int):
        self.space, self.num_envs = space, num_envs
        self._last = {"root": [None] * num_envs, "next": [None] * num_envs}

    def update(self, posts: list[dict] | None) -> None:
        """Take ``[{env: observation from a step}, {env: observation from a reset}]``: an env reset in a step
        (autoreset, or a restarted worker) has the reset one as ``"root"``; without a step, as ``"next"`` too."""
        if posts is None:
            return
        stepped, reset = posts
        for i, obs in stepped.items():
            self._last["next"][i] = self._last["root"][i] = obs
        for i, obs in reset.items():
            self._last["root"][i] = obs
            if i not in stepped:
                self._last["next"][i] = obs

    def batch(self, which: str, copy: bool = True):
        values = concatenate(self.space, self._last[which], create_empty_array(self.space, self.num_envs))
        return copying.deepcopy(values) if copy else values

    def row(self, which: str, i: int):
        return copying.deepcopy(self._last[which][i])


class PickledActions:
    """Actions of a space the buffers cannot hold (``space``: one env's): :meth:`write` splits a batch (of the
    batched space, e.g. a tuple with one action per env) into one action per env, as gymnasium does
    (``iterate``), and hands them to ``send`` (``send(actions)``: one call to every env)."""

    def __init__(self, space: spaces.Space, num_envs: int, send):
        self.batched, self.num_envs, self.send = batch_space(space, num_envs), num_envs, send

    def write(self, actions) -> None:
        per_env = list(iterate(self.batched, actions))
        if len(per_env) != self.num_envs:
            raise ValueError(f"actions hold {len(per_env)} actions, expected one per env ({self.num_envs}).")
        self.send(per_env)


def _tree(space: spaces.Space, td: TensorDictBase, key: tuple):
    if isinstance(space, spaces.Dict):
        return dict, [(name, _tree(sub, td, (*key, name))) for name, sub in space.spaces.items()]
    if isinstance(space, spaces.Tuple):
        return tuple, [(None, _tree(sub, td, (*key, str(j)))) for j, sub in enumerate(space.spaces)]
    view = numpy_view(td.get(key))
    return None, (view, None if view.dtype == space.dtype else np.dtype(space.dtype))


def _read(node, index, copy: bool):
    kind, content = node
    if kind is None:
        view, dtype = content
        value = view[index]
        if dtype is not None:  # held in a wider type (vector_worker.WIDENED)
            return np.asarray(value).astype(dtype)[()] if np.ndim(value) == 0 else value.astype(dtype)
        return value.copy() if copy else value
    if kind is dict:
        return {name: _read(child, index, copy) for name, child in content}
    return tuple(_read(child, index, copy) for _, child in content)


class Actions:
    """Writes a batch of actions (the structure of the batched action space: an array ``[num_envs, ...]``, or a
    dict / tuple of them; for Dict / Tuple spaces also a list of one action per env) into the action buffers,
    after checking shapes and integer dtypes. Values are not checked against the space: as in gymnasium's own
    vector envs, that is the env's business (and the env's error names it).

    Raises ``TypeError`` for a scalar where a batch is expected or a non-integer value for a discrete space,
    ``ValueError`` for a wrong shape."""

    def __init__(self, space: spaces.Space, action_buffers: list[tuple], num_envs: int):
        buffers = {key_tuple(key): numpy_view(tensor) for key, tensor in action_buffers}
        self.num_envs = num_envs
        self._root = _action_tree(space, buffers, ("action",))

    def write(self, actions) -> None:
        _write(self._root, actions, "actions")


def _action_tree(space: spaces.Space, buffers: dict, key: tuple):
    if isinstance(space, spaces.Dict):
        return dict, [(name, _action_tree(sub, buffers, (*key, name))) for name, sub in space.spaces.items()]
    if isinstance(space, spaces.Tuple):
        return tuple, [(j, _action_tree(sub, buffers, (*key, str(j)))) for j, sub in enumerate(space.spaces)]
    discrete = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))
    start = getattr(space, "start", None) if not isinstance(space, spaces.MultiBinary) else None
    shift = start if start is not None and np.any(start != 0) else None  # the workers add it back
    return None, (space, buffers[key], discrete, shift)


def _write(node, value, where: str) -> None:
    kind, content = node
    if kind is dict:
        if _per_env(value, Mapping):  # one dict per env (a list of samples of the single action space)
            value = {name: [action[name] for action in value] for name, _ in content}
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be a dict of batches (Dict action space), got {type(value).__name__}.")
        for name, child in content:
            if name not in value:
                raise KeyError(f"{where} has no entry {name!r}; the action space has keys {[n for n, _ in content]}.")
            _write(child, value[name], f"{where}[{name!r}]")
        return
    if kind is tuple:
        if isinstance(value, list) and _per_env(value, (tuple, list)) and all(len(v) == len(content) for v in value):
            value = tuple([action[j] for action in value] for j, _ in content)  # one tuple per env
        if not isinstance(value, (tuple, list)) or len(value) != len(content):
            raise TypeError(f"{where} must be a tuple of {len(content)} batches (Tuple action space), got "
                            f"{type(value).__name__}.")
        for j, child in content:
            _write(child, value[j], f"{where}[{j}]")
        return
    space, buffer, discrete, shift = content
    array = np.asarray(value)
    if array.shape != buffer.shape:
        n = buffer.shape[0]
        if array.ndim == 0:
            raise TypeError(f"{where} must hold one action per env ({n} envs, shape {buffer.shape}), got a scalar.")
        raise ValueError(f"{where} has shape {array.shape}, expected {buffer.shape} ({n} envs x "
                         f"{tuple(space.shape)}, {space}).")
    if discrete and array.dtype.kind not in "iub":
        _check_integers(space, array, where)
    buffer[...] = array if shift is None else array - shift


def _per_env(value, kind) -> bool:
    """Whether ``value`` is a list/tuple of per-env actions of type ``kind`` (not a batch)."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, kind) for v in value)


def _check_integers(space, array: np.ndarray, where: str) -> None:
    """Raise ``TypeError`` unless ``array`` (not of an integer dtype) holds whole numbers."""
    if array.dtype.kind != "f":
        raise TypeError(f"{where} has dtype {array.dtype}; a {type(space).__name__} action space takes integers.")
    if not np.all(np.floor(array) == array):
        raise TypeError(f"{where} holds non-integer values for a {type(space).__name__} action space.")
