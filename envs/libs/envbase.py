"""The TorchRL family: ``EnvBase`` envs, unbatched or batched, stepped through their own ``step_and_maybe_reset``.

The env's full specs are its specs here (on the CPU); its tensordicts are copied into its rows of the buffers
(``[*env.batch_size, ...]`` per env), each leaf's shape checked first. An env may offer a faster stepper of its own
through a ``native_stepper()`` method; it must produce the same data as going through the
env's ``EnvBase`` API. An ``EnvBase`` is seeded at once through its own ``set_seed`` (:meth:`TorchRLStepper.set_seed`).
An env whose class keeps ``EnvBase``'s step takes a lean step with the same data (:meth:`TorchRLStepper._step_lean`),
TorchRL's ``step_mdp`` in it replayed from a recording of its own output (:class:`RecordedStepMdp`).
"""
from __future__ import annotations

import inspect
import logging

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import Compose, EnvBase, Transform, TransformedEnv

from ..engine.shared import BufferViews, EnvSpecs, entries_at, is_plain, key_tuple, plain_tensordict
from ..engine.stepper import ROAD_ATTRIBUTE, Family
from ..engine.values import BadValue, Guard, broadcast_error, value_error


def specs_of(env: EnvBase) -> EnvSpecs:
    """A TorchRL env's full specs, cloned, on the CPU (where the buffers live)."""
    return EnvSpecs(
        observation=env.full_observation_spec.clone().cpu(),
        action=env.full_action_spec.clone().cpu(),
        reward=env.full_reward_spec.clone().cpu(),
        done=env.full_done_spec.clone().cpu(),
    )


def transform_parts(transform: Transform) -> list[Transform]:
    """``transform`` and, for a ``Compose``, its transforms (recursively), in order."""
    if isinstance(transform, Compose):
        return [part for inner in transform.transforms for part in transform_parts(inner)]
    return [transform]


def stepper_of(env):
    """The stepper of a TorchRL env: its ``native_stepper()`` when it has one, else a :class:`TorchRLStepper`."""
    native = getattr(env, "native_stepper", None)
    return native() if callable(native) else TorchRLStepper(env)


def seeding_resets(env) -> bool:
    """Whether seeding ``env`` (a TorchRL env, under any ``TransformedEnv``) is a reset of a gym-like env inside
    it (TorchRL's ``GymEnv``: ``set_seed`` calls the gymnasium env's ``reset(seed=...)``), so that its next reset
    starts the episode after the seeded one."""
    while isinstance(env, TransformedEnv):
        env = env.base_env
    return getattr(env, "_seed_calls_reset", None) is True


class TorchRLStepper:
    """A TorchRL ``EnvBase``, unbatched or batched (its rows in the buffers are then ``[*env.batch_size, ...]``):
    its tensordicts are copied into the buffer views (each leaf's shape checked first: ``update_`` would
    broadcast). Steps go through the env's ``step_and_maybe_reset``, so a batched env resets the elements that
    ended as TorchRL does. Non-tensor entries (strings, objects) have no place in the buffers: after each reset
    and step they are left in ``objects`` (``{"root": td, "next": td}`` holding only them) for the group to
    send."""

    def __init__(self, env: EnvBase):
        self.env = env
        self.specs = specs_of(env)
        root_objects, next_objects = self.specs.non_tensor_keys()
        self._root_keys = [key for key in self.specs.root_spec().keys(True, True) if key not in root_objects]
        self._next_keys = [key for key in self.specs.next_spec().keys(True, True) if key not in next_objects]
        self._root_objects = root_objects
        self._next_objects = next_objects
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
        #: the buffer leaves each output is copied into, in the order of the keys (None: entries of other shapes per
        #: agent, lazily stacked, which have no one leaf: written by key)
        self._root_leaves = _leaves(self._root, self._root_keys)
        self._next_leaves = _leaves(self._next, self._next_keys)
        self._action_keys = list(self._action.keys(True, True))
        self._action_leaves = _leaves(self._action, self._action_keys)
        done_keys = {key_tuple(key) for key in self.env.done_keys}
        #: whether the env is stepped through :meth:`_step_lean` (its class keeps EnvBase's step, every output has
        #: one leaf); then the done flags of its next row (numpy views), the "_reset" entries maybe_reset looks at,
        #: and where each root entry is among the step's outputs (None: a root entry that is not one)
        done_indices = [index for index, key in enumerate(self._next_keys) if key_tuple(key) in done_keys]
        self._reset_keys = list(self.env.reset_keys)
        self._lean = (keeps_envbase_step(self.env) and self._next_leaves is not None
                      and self._root_leaves is not None and len(done_indices) == len(done_keys))
        if self._lean:
            self._done_flags = [self._next_leaves[index].numpy() for index in done_indices]
            self._root_in_next = (_positions(self._root_keys, self._root_shapes, self._next_keys, self._next_shapes)
                                  if _moved_by_step_mdp(self.env, self._root_keys) else None)
            self._step_mdp = RecordedStepMdp(self.env)  # (TorchRL's step_mdp, replayed where it can be)

    def set_seed(self, seed: int | None, static_seed: bool = False) -> int | None:
        """Seed the env now (TorchRL's ``set_seed``); returns the seed for the next env."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.env.set_seed(seed)
        self._take_reset(self.env.reset())

    def reset_into_seed(self, seed: int) -> None:
        """Reset into the episode ``seed`` starts, the env just seeded with it: where its seeding is itself a reset
        (:func:`seeding_resets`), that reset again (``reset(seed=seed)``, which TorchRL hands to the gymnasium env),
        else a plain reset (the next one after a seed starts the seeded episode)."""
        self._take_reset(self.env.reset(seed=seed) if seeding_resets(self.env) else self.env.reset())

    def _take_reset(self, state: TensorDictBase) -> None:
        """A reset's output (all elements, or some with the others as they were): checked, written into the root
        row, its non-tensor entries kept."""
        self._state = state
        self._take(state, self._root, self._root_keys, self._root_shapes, self._root_leaves, "reset()")
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
        self._take_reset(self.env.reset(state))

    def step(self) -> None:
        if self._state is None:  # stepped before any reset: the env starts from what the root buffer holds
            self._state = self._root.clone()
        state = self._state
        if self._action_leaves is None:
            state.update(self._action.clone())
        else:  # (the actions the env keeps are its own: the buffers change at the next step)
            for key, leaf in zip(self._action_keys, self._action_leaves):
                state.set(key, leaf.clone())
        if self._lean and self._lean_now(state):
            self._step_lean(state)
            return
        stepped, self._state = self.env.step_and_maybe_reset(state)
        stepped_next = stepped.get("next")
        self._take(stepped_next, self._next, self._next_keys, self._next_shapes, self._next_leaves, "step()")
        self._take(self._state, self._root, self._root_keys, self._root_shapes, self._root_leaves, "reset()")
        self._keep_objects(stepped_next)

    def _lean_now(self, state: TensorDictBase) -> bool:
        """Whether :meth:`_step_lean` does what the env's ``step_and_maybe_reset`` would with ``state`` now: none of
        ``EnvBase``'s rarer roads (a compiled step, native autoreset, post-step-MDP hooks, a device move, a partial
        step, preset next values) is taken."""
        env = self.env
        return (env.__dict__.get("_compiled_step_and_maybe_reset") is None
                and not env.__dict__.get("_torchrl_native_autoreset", False)
                and env._post_step_mdp_hooks is None
                and state.device == env.device
                and "_step" not in state.keys()
                and "next" not in state.keys())

    def _step_lean(self, state: TensorDictBase) -> None:
        """The env's ``step_and_maybe_reset(state)`` for a class that keeps ``EnvBase``'s (:func:`keeps_envbase_step`),
        its outputs written into the buffers, without the work that changes nothing on outputs as complete as the
        specs: ``_step_proc_data`` (reward reshaping, missing done flags, type checks) runs only when an output is
        missing or of another shape, or type checks are on; ``maybe_reset`` only when a done flag is set or the
        next root holds a ``"_reset"`` entry (``any_done`` is otherwise False and leaves the root as it was). Where
        no env was reset, the next root's entries are the step's (``step_mdp`` moves them): they are copied from
        the step's outputs, checked once. TorchRL's ``step_mdp`` is replayed from a recording of its own output
        (:class:`RecordedStepMdp`)."""
        env = self.env
        env._assert_tensordict_shape(state)
        stepped_next = env._step(state)
        values = entries_at(stepped_next, self._next_keys)
        if env.run_type_checks or not _as_specs_say(values, self._next_shapes):
            stepped_next = env._step_proc_data(stepped_next)
            values = entries_at(stepped_next, self._next_keys)
        self._copy(values, stepped_next, self._next, self._next_keys, self._next_shapes, self._next_leaves, "step()")
        state.set("next", stepped_next)
        following = self._step_mdp(state)
        resets = (any(flags.any() for flags in self._done_flags)
                  or any(value is not None for value in entries_at(following, self._reset_keys)))
        if resets:
            following = env.maybe_reset(following)
        if resets or self._root_in_next is None:
            self._take(following, self._root, self._root_keys, self._root_shapes, self._root_leaves, "reset()")
        else:
            with torch.no_grad():
                torch._foreach_copy_(self._root_leaves, [values[index] for index in self._root_in_next])
        self._state = following
        self._keep_objects(stepped_next)

    def _take(self, td: TensorDictBase, buffers: TensorDictBase, keys: list, shapes: list, leaves: list | None,
              call: str) -> None:
        """:meth:`_copy` of ``td``'s entries ``keys``."""
        self._copy(entries_at(td, keys), td, buffers, keys, shapes, leaves, call)

    def _copy(self, values: list, td: TensorDictBase, buffers: TensorDictBase, keys: list, shapes: list,
              leaves: list | None, call: str) -> None:
        """Check ``values`` (``td``'s entries ``keys``: shapes, and values the buffers' dtypes can hold) and copy
        them into ``buffers`` (their ``leaves``, in the order of ``keys``: one copy call; by key when an entry has
        no one leaf or is missing, which ``select`` reports)."""
        check_values(values, shapes, self._env_index, call)
        if leaves is None or any(value is None for value in values):
            _write(buffers, td.select(*keys))
            return
        with torch.no_grad():
            torch._foreach_copy_(leaves, values)

    def _keep_objects(self, stepped_next) -> None:
        if self.has_objects:
            self.objects = {"root": self._state.select(*self._root_objects, strict=False),
                            "next": None if stepped_next is None else stepped_next.select(*self._next_objects,
                                                                                          strict=False)}

    def close(self) -> None:
        # always called: a plain EnvBase subclass reports is_closed=True from its construction on
        self.env.close(raise_if_closed=False)


#: the methods of a TorchRL env's step and reset-when-done (with its output processing)
_ENVBASE_STEP = ("step_and_maybe_reset", "_step_and_maybe_reset", "step", "_step_proc_data", "_complete_done",
                 "maybe_reset", "any_done", "_step_mdp")


def keeps_envbase_step(env: EnvBase) -> bool:
    """Whether ``env``'s class steps and resets-when-done as ``EnvBase`` does (none of those methods redefined, no
    post-step-MDP hooks: TorchRL's ``TransformedEnv`` has its transforms'), so that
    :meth:`TorchRLStepper._step_lean` is its ``step_and_maybe_reset``."""
    cls = type(env)
    if any(inspect.getattr_static(cls, name) is not inspect.getattr_static(EnvBase, name) for name in _ENVBASE_STEP):
        return False
    return inspect.getattr_static(cls, "_post_step_mdp_hooks", None) is None


def _positions(keys: list, shapes: list, among: list, among_shapes: list) -> list[int] | None:
    """Where each of ``keys`` is in ``among``, when all are there with the same shape and dtype (``shapes``: see
    :func:`expected_entries`); else None."""
    found = {key: (index, shape[1:3]) for index, (key, shape) in enumerate(zip(among, among_shapes))}
    positions = []
    for key, shape in zip(keys, shapes):
        index, form = found.get(key, (None, None))
        if index is None or form != shape[1:3]:
            return None
        positions.append(index)
    return positions


def _moved_by_step_mdp(env: EnvBase, keys: list) -> bool:
    """Whether TorchRL's ``step_mdp`` takes every one of ``keys`` from the step's outputs (the observation and done
    entries it copies as they are), so that the next root holds the step's values there."""
    moved = [*getattr(env, "_observation_keys_step_mdp", ()), *getattr(env, "_done_keys_step_mdp", ())]
    moved = {key_tuple(key) for key in moved}
    return all(key_tuple(key) in moved for key in keys)


def _as_specs_say(values: list, shapes: list) -> bool:
    """Whether every output is there (no None) with the shape its spec declares (``shapes``: see
    :func:`expected_entries`)."""
    return all(value is not None and value.shape == expected
               for value, (_, expected, _, _) in zip(values, shapes))


def check_entries(td: TensorDictBase, shapes: list, env_index: int, call: str) -> None:
    """A ``ValueError`` naming the env, the call and the key when an entry of ``td`` (a TorchRL env's output) has
    another shape than ``shapes`` say (``(key, shape, dtype, guard)`` each, see :func:`expected_entries`), or a value
    their dtype cannot hold; entries absent from ``td`` are skipped."""
    check_values([td.get(key, None) for key, *_ in shapes], shapes, env_index, call)


def check_values(values: list, shapes: list, env_index: int, call: str) -> None:
    """:func:`check_entries` on the entries already taken from an output (``values``, in the order of ``shapes``;
    None: absent, skipped)."""
    for value, (key, expected, dtype, guard) in zip(values, shapes):
        if value is None:
            continue
        if value.shape != expected:
            raise broadcast_error(env_index, call, repr(key), tuple(value.shape),
                                  f"the env's specs declare shape {tuple(expected)}", _TORCHRL_SHAPE_HINT)
        if value.dtype is not dtype:
            try:
                guard.check(value)
            except BadValue as bad:
                raise value_error(env_index, call, key, bad, _TORCHRL_VALUE_HINT) from None


def expected_entries(template: TensorDictBase, keys) -> list[tuple]:
    """``(key, shape, dtype, guard)`` of each of ``keys`` in ``template`` (zeros shaped as the outputs to check);
    an entry of different shapes per agent (a lazy stack) is left out (it has no one shape to check)."""
    expected = []
    for key in keys:
        try:
            value = template.get(key)
        except RuntimeError:  # (heterogeneous: no one tensor)
            continue
        expected.append(_expected(value, key))
    return expected


def _expected(buffer: torch.Tensor, key) -> tuple:
    """``(key, shape, dtype, guard)`` of a TorchRL env's entry, from its buffer row."""
    return key, tuple(buffer.shape), buffer.dtype, Guard(buffer.dtype)


_TORCHRL_SHAPE_HINT = ("make _reset() and _step() return tensors of exactly the shapes its specs declare "
                       "(full_observation_spec, full_reward_spec, full_done_spec), or declare the shapes they return")
_TORCHRL_VALUE_HINT = ("make _reset() and _step() return tensors of the dtypes its specs declare, or values that "
                       "fit them")


def _leaves(buffers: TensorDictBase, keys: list) -> list[torch.Tensor] | None:
    """The leaves of ``buffers`` at ``keys``, in order; None when one of them has no one leaf (entries of other
    shapes per agent, lazily stacked)."""
    try:
        return [buffers.get(key) for key in keys]
    except RuntimeError:
        return None


def _write(buffers: TensorDictBase, values: TensorDictBase) -> None:
    """Copy an env's outputs into its buffers, outside autograd (an env whose outputs carry a graph, e.g. stepped
    with actions that require grad, must not tie the shared buffers to it)."""
    with torch.no_grad():
        buffers.update_(values)


#: the road of a TorchRL env stepped through its own ``step_and_maybe_reset`` (see ``stepper.ROAD_ATTRIBUTE``)
TORCHRL_STEP = "TorchRL's step"

_LOG = logging.getLogger("tdcollect.envs")


def marked_stepper(env, reason: str | None, native: str, build):
    """Mark ``env`` with its road (``native``, or TorchRL's step with ``reason``; ``env.roads()`` reads it), log it,
    and return ``build(env)`` when ``reason`` is None, else None (the TorchRL family steps it)."""
    road = native if reason is None else f"{TORCHRL_STEP}: {reason}"
    object.__setattr__(env, ROAD_ATTRIBUTE, road)
    _LOG.debug("%r takes the road %s", env, road)
    return build(env) if reason is None else None


def _stepper(env):
    if not isinstance(env, EnvBase):
        return None
    if ROAD_ATTRIBUTE not in env.__dict__:
        object.__setattr__(env, ROAD_ATTRIBUTE, TORCHRL_STEP)
    return stepper_of(env)


def _is_env(obj) -> bool:
    return isinstance(obj, EnvBase)


FAMILY = Family(name="TorchRL EnvBase", priority=20, stepper=_stepper, is_instance=_is_env)


# ----------------------------------------------------------------- TorchRL's step_mdp, replayed
# What TorchRL's ``_StepMDP`` builds (the state an env is stepped from next: the step's observations and done flags,
# the input's other entries) depends only on the keys it is given, in their order, and on the env's specs: which
# entries come from the input ("root"), which from the step's "next", in which order, and each level's batch size
# and device. Walking its key trees through TensorDict's generic paths costs ~20 µs per env and step (an env of 3
# agents in a group); replaying a recording of its own output costs a few.
#: layouts kept per env (after a reset, after a step: two in practice)
KEPT_LAYOUTS = 4
#: recordings that found no layout (an output TorchRL builds otherwise than by sharing tensors) before giving up
FAILED_RECORDINGS = 4


class RecordedStepMdp:
    """``__call__(state) -> next state``: ``env._step_mdp(state)`` (``state`` holding the step's ``"next"``), the
    same keys in the same order at every level, the same tensors (shared, as TorchRL shares them), new
    tensordicts, the same batch sizes and devices.

    It records TorchRL's own output (each leaf found, as the very same tensor, in the input or in ``"next"`` at the
    same key) and replays it while the inputs have the recorded keys, in the recorded order, at every level it
    reads, their leaves tensors, and the env's ``_step_mdp`` is the recorded one (specs changed: new rules).
    Anything else goes through TorchRL's call, which is recorded in turn (the last few layouts are kept: an env's
    state after a reset has its keys in another order than after a step)."""

    def __init__(self, env):
        self.env = env
        self._mdp = None
        self._layouts: list = []
        self._failures = 0

    def __call__(self, state: TensorDictBase) -> TensorDictBase:
        mdp = self.env._step_mdp
        if mdp is not self._mdp:  # (new specs, new rules)
            self._mdp = mdp
            self._layouts = []
        if type(state) is TensorDict:
            next_td = state._tensordict.get("next")
            for layout in self._layouts:
                out = _replayed(layout, state, next_td)
                if out is not None:
                    return out
        out = mdp(state)
        if self._failures < FAILED_RECORDINGS:
            layout = _recorded(out, state, state.get("next", None))
            if layout is None:
                self._failures += 1
            else:
                self._layouts = [layout, *self._layouts][:KEPT_LAYOUTS]
        return out


def _keys(td) -> tuple | None:
    """The keys of a plain TensorDict level, in order; None where there is no such level."""
    return None if td is None else tuple(td._tensordict)


def _recorded(out, state, next_td):
    """The layout of one level of ``out``: ``(state keys, next keys, entries, batch size, device)`` with
    ``entries`` ``[(key, "root" | "next" | nested layout)]``; None where ``out`` is built otherwise than from
    ``state``'s and ``next_td``'s tensors at the same keys, a tensor is in both (no telling where TorchRL took it
    from), or a level is not a plain TensorDict."""
    if not all(is_plain(level) for level in (out, state, next_td) if level is not None):
        return None
    entries = []
    for key, value in out._tensordict.items():
        in_state = None if state is None else state._tensordict.get(key)
        in_next = None if next_td is None else next_td._tensordict.get(key)
        if type(value) is torch.Tensor:
            if value is in_state and value is in_next:  # (the env hands back a tensor of its input: which one?)
                return None
            if value is in_state:
                entries.append((key, "root"))
            elif value is in_next:
                entries.append((key, "next"))
            else:
                return None
            continue
        if value is in_state or value is in_next:  # (a tensordict shared as it is: not TorchRL's way, not replayed)
            return None
        nested = _recorded(value, in_state if isinstance(in_state, TensorDictBase) else None,
                           in_next if isinstance(in_next, TensorDictBase) else None)
        if nested is None:
            return None
        entries.append((key, nested))
    return _keys(state), _keys(next_td), entries, out.batch_size, out.device


def _replayed(layout, state, next_td) -> TensorDict | None:
    """One level built from ``layout``; None where ``state`` or ``next_td`` have other keys, another order, or
    anything but tensors where the layout takes them."""
    state_keys, next_keys, entries, batch_size, device = layout
    if state_keys is not None and (not is_plain(state) or tuple(state._tensordict) != state_keys):
        return None
    if next_keys is not None and (not is_plain(next_td) or tuple(next_td._tensordict) != next_keys):
        return None
    out = {}
    for key, source in entries:
        if source == "root":
            value = state._tensordict[key]
        elif source == "next":
            value = next_td._tensordict[key]
        else:
            value = _replayed(source, None if source[0] is None else state._tensordict[key],
                              None if source[1] is None else next_td._tensordict[key])
            if value is None:
                return None
            out[key] = value
            continue
        if type(value) is not torch.Tensor:
            return None
        out[key] = value
    return plain_tensordict(out, batch_size, device)
