"""The dm_env family: ``dm_env.Environment`` envs (single- or multi-player), their specs and their stepper.

**dm_env specs -> TorchRL specs**, and the slots that move dm_env values into buffers and back.

Leaf conversion (unbatched; ``s`` is the dm_env spec's shape):

===========================================  ==========================================  ====================
dm_env spec                                  TorchRL spec                                values in the buffer
===========================================  ==========================================  ====================
``BoundedArray`` (or ``DiscreteArray``),     ``Categorical(max - min + 1)`` if ``s == ()``,  ``value - minimum``
integer dtype                                else ``MultiCategorical(max - min + 1)``;
                                             int64
``BoundedArray``, float dtype                ``Bounded(minimum, maximum)``, same dtype   as is
``Array`` / ``BoundedArray``, bool dtype     ``Categorical(2)``, bool                    as is
``Array``, numeric dtype                     ``Unbounded``, same dtype                   as is
string / object dtype                        not supported (``TypeError``)
===========================================  ==========================================  ====================

Integer ranges lose their minimum the way gymnasium's ``Discrete(n, start)`` does in ``gym.py``: a
dm_env action ``turn`` in ``[-1, 1]`` is ``Categorical(3)`` here and ``0, 1, 2`` stand for ``-1, 0, 1``.

Nested dm_env specs (dicts; lists and tuples, whose items become keys ``"0"``, ``"1"``, ...) become nested
keys. A :class:`Slot` links one dm_env leaf (a path into the env's values) with one tensordict leaf; a
:class:`DmLayout` holds the four specs and the slots of one env. :func:`flat_layout` is the layout of any
``dm_env.Environment``:

- observations: the observation dict's entries as top-level keys (a single array: ``"observation"``);
- actions: under ``"action"`` (a nested Composite if the action spec is a dict);
- ``"reward"``: the timestep's reward, float32 ``[*s, 1]``;
- ``"done"`` / ``"terminated"`` / ``"truncated"``: bool ``[1]`` from the step type and discount
  (see :func:`done_flags`).

**Multi-player dm_env envs**: per-player spec sequences become one agent group.

A ``dm_env.Environment`` whose ``observation_spec()``, ``action_spec()`` and ``reward_spec()`` are sequences with
one item per player (a list of observation dicts, a tuple of ``DiscreteArray`` actions, a list of reward arrays, as
multi-player substrates declare them) gets the agent-group layout of TorchRL's multi-agent wrappers, so a factory
can switch between the two without touching the rest of a pipeline. For a 7-player substrate (batch size ``[]``)::

    ("agents", "observation", "RGB")                uint8    [7, 88, 88, 3]   per-player observations
    ("agents", "observation", "READY_TO_SHOOT")     float64  [7, 1]           (a scalar becomes [1])
    ("agents", "observation", "COLLECTIVE_REWARD")  float64  [7, 1]
    "RGB"                                           uint8    [144, 192, 3]    "WORLD.<NAME>" -> "<NAME>",
                                                                              read from player 0's dict
    ("agents", "action")                            int64    [7]              Categorical(8)
    ("agents", "reward")                            float64  [7, 1]
    "done", "terminated", "truncated"               bool     [1]              from the step type and discount

A per-player action dict gives ``("agents", "action", NAME)``. Value conversions follow the table above
(integer ranges start at 0). Every other dm_env env keeps :func:`flat_layout`.

**Stepper**: :class:`DmEnvStepper`. dm_env has no seeding call: a seed is ignored with a warning, unless a
subclass of the stepper knows how to seed its env.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torchrl.data import Bounded, Categorical, Composite, MultiCategorical, TensorSpec, Unbounded

from ..engine.shared import BufferViews, EnvSpecs
from ..engine.specs import DONE_KEYS, done_spec, torch_dtype
from ..engine.stepper import Family, of_package
from ..engine.user_warnings import warn_caller
from ..engine.values import BadValue, Guard, value_error

if TYPE_CHECKING:  # dm_env comes only with this family: imported when one of its envs is met (see _dm)
    import dm_env
    from dm_env import specs as dm


def _dm():
    """``dm_env.specs``, imported when an env of this family is met."""
    from dm_env import specs

    return specs

#: the root of every source path: ``("observation", ...)`` reads the timestep's observation,
#: ``("reward",)`` its reward.
OBSERVATION = "observation"
REWARD = "reward"


@dataclass
class Slot:
    """One dm_env leaf <-> one tensordict leaf.

    ``source``: path into ``{"observation": ts.observation, "reward": ts.reward}`` (observations, rewards)
    or into the action structure ``env.step`` takes (actions; ``()`` for a single array).
    ``key``: the tensordict key (a tuple). ``player``: an index along the leaf's first (agent) dimension, or
    None when the slot fills the whole leaf. ``offset``: subtracted on the way in, added on the way out
    (None: values pass as they are). ``dtype``: the engine's numpy dtype (actions are cast back to it).
    """

    source: tuple
    key: tuple
    offset: np.ndarray | None = None
    dtype: np.dtype | None = None
    player: int | None = None


@dataclass
class DmLayout:
    """The specs (each a ``Composite`` of shape ``[]``) and slots of one dm_env env."""

    observation: Composite
    action: Composite
    reward: Composite
    done: Composite = field(default_factory=done_spec)
    observation_slots: list[Slot] = field(default_factory=list)
    action_slots: list[Slot] = field(default_factory=list)
    reward_slots: list[Slot] = field(default_factory=list)


def leaf_to_spec(spec: dm.Array) -> tuple[TensorSpec, np.ndarray | None]:
    """``(TorchRL spec, offset)`` for one dm_env leaf spec (see the module table)."""
    dtype = np.dtype(spec.dtype)
    shape = tuple(spec.shape)
    if dtype.kind in "OSUV":
        raise TypeError(
            f"dm_env spec {spec!r} holds {dtype} values (text or objects), which have no tensor form."
        )
    if dtype == np.bool_:
        return Categorical(2, shape=shape, dtype=torch.bool), None
    if isinstance(spec, _dm().BoundedArray):
        low = np.broadcast_to(np.asarray(spec.minimum), shape)
        high = np.broadcast_to(np.asarray(spec.maximum), shape)
        if dtype.kind in "iu":
            nvec = (high.astype(np.int64) - low.astype(np.int64) + 1).astype(np.int64)
            offset = low.astype(np.int64).copy() if np.any(low != 0) else None
            if shape == ():
                return Categorical(int(nvec), shape=(), dtype=torch.int64), offset
            return MultiCategorical(torch.as_tensor(nvec), shape=shape, dtype=torch.int64), offset
        tdtype = torch_dtype(dtype)
        return (
            Bounded(
                low=torch.as_tensor(low.copy(), dtype=tdtype),
                high=torch.as_tensor(high.copy(), dtype=tdtype),
                shape=shape,
                dtype=tdtype,
            ),
            None,
        )
    return Unbounded(shape=shape, dtype=torch_dtype(dtype)), None


def stacked_leaf(per_player: list[dm.Array], what: str, scalar_as_one: bool = False
                 ) -> tuple[TensorSpec, np.ndarray | None]:
    """``(spec of shape [n, *s], offset)`` for a value each of ``n`` players has; a ``ValueError`` naming ``what``
    unless the players' specs agree (shape, dtype, bounds). ``scalar_as_one``: a scalar gets ``s = [1]``, as in
    TorchRL's multi-agent envs (values are written into it as they are: only dims of size 1 differ)."""
    first = per_player[0]
    for player, spec in enumerate(per_player):
        if spec.shape != first.shape or spec.dtype != first.dtype or _bounds(spec) != _bounds(first):
            raise ValueError(f"players disagree on the spec of {what!r}: player 0 has {first!r}, player {player} "
                             f"{spec!r}; an agent group needs one spec for all its players.")
    converted, offset = leaf_to_spec(first)
    if scalar_as_one and converted.shape == ():
        converted = converted.unsqueeze(-1)
        offset = None if offset is None else offset.reshape(1)
    return converted.expand(len(per_player), *converted.shape), offset


def _bounds(spec) -> tuple:
    low = getattr(spec, "minimum", None)
    high = getattr(spec, "maximum", None)
    return (None if low is None else np.asarray(low).tolist(), None if high is None else np.asarray(high).tolist())


def iter_leaves(spec, path: tuple = ()):
    """``(path, leaf spec)`` for every leaf of a (nested) dm_env spec; list items get keys ``"0"``, ..."""
    if isinstance(spec, Mapping):
        for key, sub in spec.items():
            yield from iter_leaves(sub, (*path, key))
    elif isinstance(spec, (list, tuple)):
        for j, sub in enumerate(spec):
            yield from iter_leaves(sub, (*path, j))
    else:
        yield path, spec


def key_of(path: tuple) -> tuple:
    """The tensordict key of a dm_env path (list indices become strings)."""
    return tuple(str(p) for p in path)


def flat_layout(env: dm_env.Environment) -> DmLayout:
    """The layout of any ``dm_env.Environment`` (see the module docstring)."""
    obs_spec = env.observation_spec()
    observation = Composite(shape=())
    obs_slots = []
    single_obs = not isinstance(obs_spec, (Mapping, list, tuple))
    for path, leaf in iter_leaves(obs_spec):
        key = ("observation",) if single_obs else key_of(path)
        try:
            spec, offset = leaf_to_spec(leaf)
        except TypeError as exc:
            raise TypeError(f"observation {'.'.join(key)}: {exc}") from None
        observation[key] = spec
        obs_slots.append(Slot((OBSERVATION, *path), key, offset))

    action = Composite(shape=())
    act_slots = []
    for path, leaf in iter_leaves(env.action_spec()):
        key = ("action", *key_of(path))
        try:
            spec, offset = leaf_to_spec(leaf)
        except TypeError as exc:
            raise TypeError(f"action {'.'.join(key)}: {exc}") from None
        action[key] = spec
        act_slots.append(Slot(path, key, offset, np.dtype(leaf.dtype)))

    reward_dm = env.reward_spec()
    if not isinstance(reward_dm, _dm().Array):
        raise TypeError(
            f"this dm_env env's reward spec is {type(reward_dm).__name__}; only a single array reward is "
            "supported (it becomes \"reward\" of shape [*shape, 1])."
        )
    reward = Composite(reward=Unbounded(shape=(*reward_dm.shape, 1), dtype=torch.float32), shape=())
    return DmLayout(observation, action, reward, observation_slots=obs_slots, action_slots=act_slots,
                    reward_slots=[Slot((REWARD,), ("reward",))])


def done_flags(timestep: dm_env.TimeStep) -> tuple[bool, bool, bool]:
    """``(done, terminated, truncated)``: LAST with discount 0 (or None) ends the episode for good
    (terminated); LAST with a discount > 0 is a cut (truncated); FIRST and MID are neither."""
    if not timestep.last():
        return False, False, False
    discount = timestep.discount
    terminated = discount is None or not np.any(np.asarray(discount) != 0)
    return True, terminated, not terminated


def leaf_array(tree, key: tuple):
    """The item at ``key`` in a nested structure: a numpy array in a nested dict of arrays, a leaf spec in a
    nested dm_env spec."""
    for part in key:
        tree = tree[part]
    return tree


class TimestepWriter:
    """Writes a timestep's values, through ``slots``, into numpy arrays that live in ``tree``.

    ``tree``: nested dict of numpy arrays (e.g. ``BufferViews.next_np``); ``index``: the leading indices of
    the row to fill (``(i,)`` for env ``i`` of a buffer, ``()`` for an unbatched tensordict).

    The slots of one agent-group leaf (players ``0 .. n-1`` of ``("observation", p, NAME)`` or ``("reward", p)``, no
    offset) are written as one :class:`PlayerStack`: the players' values checked and copied together (small values
    as one array), about a third of the per-slot cost on a 7-player substrate. A stack whose values are not all of
    its one shape goes through the per-slot path, which names the key in its error.
    """

    def __init__(self, slots: list[Slot], tree: dict, index: tuple = ()):
        groups: dict[tuple, list[Slot]] = {}
        single = []
        for slot in slots:
            per_player = slot.player is not None and slot.offset is None and len(slot.source) >= 2 \
                and slot.source[1] == slot.player
            if per_player:
                groups.setdefault((slot.key, slot.source[0], slot.source[2:]), []).append(slot)
            else:
                single.append(slot)
        self._stacks = []
        for (key, root, tail), group in groups.items():
            leaf = leaf_array(tree, key)[(*index, Ellipsis)]
            if [slot.player for slot in group] == list(range(leaf.shape[0])):
                self._stacks.append(PlayerStack(root, tail, leaf, key, [self._target(s, tree, index) for s in group]))
            else:
                single += group
        self._targets = [self._target(slot, tree, index) for slot in single]

    @staticmethod
    def _target(slot: Slot, tree: dict, index: tuple) -> tuple:
        where = index if slot.player is None else (*index, slot.player)
        target = leaf_array(tree, slot.key)[(*where, Ellipsis)]
        squeezed = tuple(n for n in target.shape if n != 1)
        return slot.source, target, slot.offset, slot.key, squeezed, Guard(target.dtype)

    def __call__(self, timestep: dm_env.TimeStep) -> None:
        """Write ``timestep``'s values; :class:`~.values.BadValue` (its ``key`` set) for a value of another shape
        than its slot (only dims of size 1 may differ: a scalar reward fills a ``[1]`` slot) or one its
        buffer's dtype cannot hold; ``None`` is 0 only as the reward of a FIRST timestep."""
        values = {OBSERVATION: timestep.observation, REWARD: timestep.reward}
        for stack in self._stacks:
            if not stack.write(values):
                for target in stack.slots:
                    _write_slot(values, timestep, *target)
        for target in self._targets:
            _write_slot(values, timestep, *target)


class PlayerStack:
    """The slots of one agent-group leaf ``[n, *s]`` (see :class:`TimestepWriter`): player ``p``'s value is
    ``values[root][p][*tail]``."""

    def __init__(self, root: str, tail: tuple, leaf: np.ndarray, key: tuple, slots: list[tuple]):
        self.root = root
        self.tail = tail
        self.leaf = leaf
        self.key = key
        self.slots = slots
        self.rows = [target for _, target, *_ in slots]
        self.row_shape = leaf.shape[1:]
        self.guard = Guard(leaf.dtype)
        self.big = leaf[0].nbytes >= STACK_COPY_BYTES  # copied player by player; smaller ones as one array

    def write(self, values: dict) -> bool:
        """Write every player's value; False (nothing written) when a value is None or not of the leaf's row
        shape: the per-slot path then writes them or says what is wrong."""
        per_player = values[self.root]
        if per_player is None:
            return False
        items = list(per_player)
        for part in self.tail:
            items = [item[part] for item in items]
        guard = self.guard
        key = self.key
        for value in items:
            if value is None:
                return False
            guard(value, key)
        if self.big:
            shape = self.row_shape
            if any(np.shape(value) != shape for value in items):
                return False
            for row, value in zip(self.rows, items):
                row[...] = value
            return True
        try:
            stacked = np.asarray(items)
        except ValueError:  # (ragged values)
            return False
        if stacked.size != self.leaf.size or stacked.ndim < 1 or stacked.shape[0] != len(self.rows):
            return False
        if tuple(n for n in stacked.shape[1:] if n != 1) != tuple(n for n in self.row_shape if n != 1):
            return False
        self.leaf[...] = stacked.reshape(self.leaf.shape)
        return True


#: a player's value of at least this many bytes is copied on its own (see :class:`PlayerStack`)
STACK_COPY_BYTES = 1024


def _write_slot(values: dict, timestep, source, target, offset, key, squeezed, guard) -> None:
    """One slot of :class:`TimestepWriter`."""
    value = values
    for part in source:
        if value is None:  # a FIRST timestep's reward may be None as a whole
            break
        value = value[part]
    if value is None and source[0] == REWARD and timestep.first():
        target[...] = 0
        return
    guard(value, key)
    shape = np.shape(value)
    if shape != target.shape:
        if tuple(n for n in shape if n != 1) != squeezed:
            raise BadValue(f"an array of shape {shape}, where the env's spec declares {target.shape} (values "
                           "are never reshaped into another shape)", key)
        value = np.reshape(value, target.shape)
    if offset is None:
        target[...] = value
    else:
        target[...] = value - offset


class ActionReader:
    """Reads the action for ``env.step`` from numpy arrays in ``tree`` (see :class:`TimestepWriter`)."""

    def __init__(self, slots: list[Slot], tree: dict, index: tuple = ()):
        self._sources = []
        for slot in slots:
            where = index if slot.player is None else (*index, slot.player)
            source = leaf_array(tree, slot.key)[(*where, Ellipsis)]
            self._sources.append((slot.source, source, slot.offset, slot.dtype))
        self._single = len(slots) == 1 and slots[0].source == ()

    def __call__(self):
        if self._single:
            _, array, offset, dtype = self._sources[0]
            return _engine_value(array, offset, dtype)
        action: dict = {}
        for path, array, offset, dtype in self._sources:
            node = action
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = _engine_value(array, offset, dtype)
        return _lists_from_int_keys(action)


def _engine_value(array: np.ndarray, offset, dtype) -> np.ndarray:
    value = array if offset is None else array + offset
    return np.array(value, dtype=dtype)


def _lists_from_int_keys(node):
    """Dict levels whose keys are the ints 0..n-1 (from list specs) become lists again."""
    if not isinstance(node, dict):
        return node
    out = {key: _lists_from_int_keys(value) for key, value in node.items()}
    if out and all(isinstance(k, int) for k in out) and sorted(out) == list(range(len(out))):
        return [out[j] for j in range(len(out))]
    return out


# ----------------------------------------------------------------- multi-player layouts
GROUP = "agents"
WORLD = "WORLD."


def layout_of(env) -> DmLayout:
    """The layout of a ``dm_env.Environment``: the agent-group layout (module docstring) when its specs are
    per-player sequences, else :func:`flat_layout`."""
    return player_list_layout(env) if is_player_list(env) else flat_layout(env)


def is_player_list(env) -> bool:
    """Whether ``env``'s observation spec is a non-empty sequence of per-player dicts and its action and reward
    specs are sequences of the same length."""
    obs = env.observation_spec()
    act = env.action_spec()
    rew = env.reward_spec()
    return (
        _is_sequence(obs) and len(obs) > 0 and all(isinstance(o, Mapping) for o in obs)
        and _is_sequence(act) and _is_sequence(rew) and len(act) == len(rew) == len(obs)
    )


def player_list_layout(env) -> DmLayout:
    """The agent-group layout of a dm_env env with per-player spec sequences (see the module docstring)."""
    obs_specs = list(env.observation_spec())
    act_specs = list(env.action_spec())
    rew_specs = list(env.reward_spec())
    n = len(obs_specs)
    names = list(obs_specs[0])
    for player, spec in enumerate(obs_specs):
        if list(spec) != names:
            raise ValueError(f"players' observations differ: player 0 has {names}, player {player} {list(spec)}; "
                             "an agent group needs the same observations for all its players.")

    observation = Composite({GROUP: Composite(observation=Composite(shape=(n,)), shape=(n,))}, shape=())
    obs_slots = []
    for name in names:
        if name.startswith(WORLD):
            key = (name[len(WORLD):],)
            if key[0] in (GROUP, *DONE_KEYS) or key in observation.keys():
                raise ValueError(f"global observation {name!r} would be stored as {key[0]!r}, a key already taken.")
            stacked, offset = _converted([obs_specs[0][name]], name, scalar_as_one=True)
            observation[key] = stacked[0]
            obs_slots.append(Slot((OBSERVATION, 0, name), key, offset))
        else:
            key = (GROUP, "observation", name)
            stacked, offset = _converted([spec[name] for spec in obs_specs], name, scalar_as_one=True)
            observation[key] = stacked
            obs_slots += [Slot((OBSERVATION, p, name), key, offset, player=p) for p in range(n)]

    action = Composite({GROUP: Composite(shape=(n,))}, shape=())
    act_slots = []
    single = not isinstance(act_specs[0], (Mapping, list, tuple))
    for path, _ in iter_leaves(act_specs[0]):
        per_player = [leaf_array(spec, path) for spec in act_specs]
        key = (GROUP, "action") if single else (GROUP, "action", *key_of(path))
        stacked, offset = _converted(per_player, ".".join(key), scalar_as_one=False)
        action[key] = stacked
        act_slots += [Slot((p, *path), key, offset, np.dtype(per_player[p].dtype), p) for p in range(n)]

    if not all(isinstance(r, type(rew_specs[0])) and not isinstance(r, (Mapping, list, tuple)) for r in rew_specs):
        raise TypeError(f"each player's reward spec must be a single array, got {rew_specs[0]!r}.")
    reward_spec, _ = stacked_leaf(rew_specs, "reward", scalar_as_one=True)
    reward = Composite({GROUP: Composite(reward=reward_spec, shape=(n,))}, shape=())
    reward_slots = [Slot((REWARD, p), (GROUP, "reward"), player=p) for p in range(n)]
    return DmLayout(observation, action, reward, observation_slots=obs_slots, action_slots=act_slots,
                    reward_slots=reward_slots)


def _converted(per_player: list, what: str, scalar_as_one: bool):
    try:
        return stacked_leaf(per_player, what, scalar_as_one)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def _is_sequence(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


# ----------------------------------------------------------------- the stepper
class DmEnvStepper:
    """A ``dm_env.Environment``: timestep values are written into numpy views of the buffers.

    ``layout``: a :class:`DmLayout` (default:
    :func:`layout_of`: an agent group for per-player spec sequences, else the observation dict's entries as
    top-level keys, actions under ``"action"``, ``"reward"``
    ``[1]``). ``source``: the ``dm_env.Environment`` stepped, when ``env`` (the object forwarded attributes reach)
    is a wrapper around it; default ``env`` itself. The done keys written are the layout's (``layout.done``), each
    step's flags from :meth:`ended` (default :func:`done_flags`, in ``DONE_KEYS`` order).
    dm_env has no seeding call, so a seed passed to ``reset`` is ignored (with a warning, once); subclasses
    that know how to seed their env override :meth:`seed`.
    """

    def __init__(self, env, layout=None, source=None):
        self.env = env
        self.source = env if source is None else source
        self.layout = layout if layout is not None else layout_of(self.source)
        self.specs = EnvSpecs(
            observation=self.layout.observation,
            action=self.layout.action,
            reward=self.layout.reward,
            done=self.layout.done,
        )
        self.done_keys = list(self.layout.done.keys())
        self._warned_seed = False

    def bind(self, views: BufferViews, index: int) -> None:
        layout = self.layout
        at = (index,)
        self._write_root = TimestepWriter(layout.observation_slots, views.root_np, at)
        self._write_next = TimestepWriter(layout.observation_slots + layout.reward_slots, views.next_np, at)
        self._read_action = ActionReader(layout.action_slots, views.action_np, at)
        self._flags = [views.next_np[key][index, ...] for key in self.done_keys]
        self._env_index = views.first_index + index
        keys = dict.fromkeys(slot.key for slot in layout.observation_slots)  # the next observation, root's next
        self._carry = [(leaf_array(views.root_np, key)[index, ...], leaf_array(views.next_np, key)[index, ...])
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
        self._write(self._write_root, self.source.reset(), "reset()")

    def ended(self, timestep: dm_env.TimeStep) -> tuple[bool, ...]:
        """The step's flags, one per done key (``done``, ``terminated``, ``truncated``): :func:`done_flags`."""
        return done_flags(timestep)

    def step(self) -> None:
        timestep = self.source.step(self._read_action())
        self._write(self._write_next, timestep, "step()")
        flags = self.ended(timestep)
        for array, flag in zip(self._flags, flags):
            array[...] = flag
        if flags[0]:
            self.reset()
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


def _is_dm_env(obj) -> bool:
    dm_env = sys.modules.get("dm_env")  # an env of this family means the module is already imported
    return dm_env is not None and isinstance(obj, dm_env.Environment)


def _stepper(env) -> DmEnvStepper | None:
    return DmEnvStepper(env) if _is_dm_env(env) else None


def _is_instance(obj) -> bool:
    return _is_dm_env(obj) or of_package(obj, "dm_env")


FAMILY = Family(name="dm_env", priority=30, stepper=_stepper, is_instance=_is_instance)
