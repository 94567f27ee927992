"""gymnasium values in and out of the step buffers: the checks of what an env returns (shape, ``None``, values
the buffer's dtype cannot hold; see ``values.py``), the writers of observations into buffer rows, and the
readers of actions in the form ``env.step`` takes. Used by the gymnasium steppers (``adapters.py``).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from .values import Guard

#: types whose values are always scalars (shape ``()``): the per-step check of rewards and flags skips them.
SCALARS = frozenset({float, int, bool, np.float32, np.float64, np.bool_, np.int32, np.int64})


class Mismatch(Exception):
    """Raised by a writer: the value for ``key`` has shape ``received`` where ``expected`` is declared."""

    def __init__(self, key, expected: tuple, received):
        super().__init__(key, expected, received)
        self.key, self.expected, self.received = key, expected, received


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


def shape_error(env: int | str, call: str, key, expected: tuple, received, family: str) -> ValueError:
    """The ``ValueError`` for a value of the wrong shape, naming the env index, the key, both shapes and the
    fix. ``family``: ``"gym"`` or ``"torchrl"``; ``received``: a shape, or None for a value without one (a
    ragged list)."""
    got = "a value with no single shape" if received is None else f"shape {tuple(received)}"
    if family == "gym" and key in FLAGS:
        what, declared = repr(key), "a gymnasium env must return a scalar, shape ()"
        hint = f"return {key} as a Python or numpy scalar"
    elif family == "gym":
        what, declared = f"observation {key!r}", f"the env's observation_space declares shape {tuple(expected)}"
        hint = ("make reset() and step() return exactly the shape its observation_space declares (or declare "
                "the shape they return in observation_space)")
    else:
        what, declared = repr(key), f"the env's specs declare shape {tuple(expected)}"
        hint = ("make _reset() and _step() return tensors of exactly the shapes its specs declare "
                "(full_observation_spec, full_reward_spec, full_done_spec), or declare the shapes they return")
    return ValueError(
        f"env {env}: {call} returned {what} with {got}, but {declared}. Values are never broadcast into the "
        f"batched env's buffers: {hint}."
    )


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
    shape = tuple(space.shape)  # the leaf's row shape in the buffers (see specs.space_to_spec)

    categorical = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete))
    guard = Guard(np.int64 if categorical else space.dtype)  # the leaf's buffer dtype (see specs.space_to_spec)
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
        start, scalar = space.start, space.dtype.type
        return lambda array, i: scalar(array[i] + start)
    if isinstance(space, spaces.MultiDiscrete):
        start, dtype = space.start, space.dtype
        return lambda array, i: (array[i] + start).astype(dtype)
    dtype = space.dtype
    return lambda array, i: np.array(array[i], dtype=dtype)
