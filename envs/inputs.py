"""What the caller's tensordict brings into a batched env, on its way to the buffers, and what it gets back.

In: the actions (their shape, dtype and values checked against the action spec when ``check_actions``, then cast
to the spec's dtype; for every batched env: ``BatchedEnv.write_actions``, ``AsyncParallelEnv.send``, the
collectors' loop) and TorchRL's masks (the ``"_step"`` entry, partial steps, one flag per env; the ``"_reset"``
entries, one flag per element or per agent group) as numpy masks for a batched env's hooks.

Back: copies of the buffers (``copier``, ``leaf_copier``: the caller's own tensors), in plain TensorDicts
(``plain_tensordict``, from ``engine/shared.py``).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, OneHot, TensorSpec

from .engine.recycle import Recycler, numpy_of
from .engine.shared import is_plain, key_tuple, plain_tensordict
from .engine.user_warnings import warn_caller

#: ``check_actions`` -> (the values checked, whether one outside the spec raises). ``"spec"``: every spec's
#: bounds; ``"finite"``: integer and one-hot ranges, floats finite (continuous bounds unchecked, as in TorchRL's
#: collectors). Not raising, an action outside its spec goes to the envs unchanged, as TorchRL sends it, with a
#: ``UserWarning``.
ENV_ACTION_CHECKS = {False: (None, False), True: ("spec", False), "raise": ("spec", True)}
COLLECTOR_ACTION_CHECKS = {False: (None, False), True: ("finite", False), "raise": ("finite", True),
                           "bounds": ("spec", True)}


def action_check(check_actions, modes: dict = ENV_ACTION_CHECKS) -> tuple[str | None, bool]:
    """``modes[check_actions]``, or a ``ValueError`` listing the modes."""
    try:
        return modes[check_actions]
    except (KeyError, TypeError):
        raise ValueError(f"check_actions must be one of {', '.join(map(repr, modes))}; got {check_actions!r}."
                         ) from None


def checked_actions(tensordict: TensorDictBase, n: int, slots: list[tuple], value_checks: dict,
                    check: tuple[str | None, bool], owner: str) -> list[torch.Tensor]:
    """The action entries of ``tensordict`` for ``n`` envs, in the order of ``slots`` (``(key, buffer [N, ...],
    spec)`` per action key), after checking their shape and dtype, and their values as ``check`` (see
    :data:`ENV_ACTION_CHECKS`) says: ``value_checks[key]`` for ``"spec"``; for ``"finite"``, floating-point actions
    for NaN and infinities only, integer ones against their spec.

    An entry whose shape lacks only the spec's last dim, of size one (categorical actions ``[n]`` for a ``[n, 1]``
    spec, which TorchRL's envs take), is given it; any other shape than the expected one is refused.
    Raises ``KeyError`` for a missing entry and ``ValueError`` naming the key and what was expected; values outside
    the spec raise only when ``check[1]``, else they are kept, with a ``UserWarning``.
    """
    extent, strict = check
    values = []
    for key, buffer, spec in slots:
        expected = (n, *buffer.shape[1:])
        value = entry(tensordict, key)
        if value is None:
            raise KeyError(
                f"the input tensordict has no {key!r} entry; {owner} expects one of "
                f"shape {expected} and dtype {buffer.dtype}."
            )
        if not value.is_cpu:  # (a policy on a GPU): checked here, on its way to the CPU buffer
            value = value.cpu()
        if value.shape != expected:
            value = in_spec_shape(value, expected)
        if value.shape != expected:
            raise ValueError(
                f"{key!r} has shape {tuple(value.shape)}, but {owner} expects shape {expected} ({n} envs x "
                f"{tuple(buffer.shape[1:])}) and dtype {buffer.dtype}; action spec: {type(spec).__name__}."
            )
        if value.dtype != buffer.dtype:
            value = cast_action(key, value, buffer.dtype, extent is not None)
        if extent == "finite" and value.dtype.is_floating_point:
            if not bool(torch.isfinite(value).all()):
                outside_spec(f"{key!r} holds NaN or infinite values", strict, "A policy that diverged?")
        elif extent and not value_checks[key](value):
            outside_spec(f"{key!r} holds values outside its spec ({bounds(spec)}"
                         f"{', NaN and infinities excluded' if value.dtype.is_floating_point else ''})", strict,
                         "A policy that diverged, or actions on another scale than the spec's?")
        values.append(value)
    return values


def outside_spec(what: str, strict: bool, hint: str) -> None:
    """Actions outside their spec: a ``ValueError`` when ``strict`` (nothing is sent), else a ``UserWarning`` at the
    caller's line (shown once per message and line) and the actions go to the envs as they are, as TorchRL sends
    them."""
    if strict:
        raise ValueError(f"{what}; nothing was sent to the envs. {hint}")
    warn_caller(f"{what}; they were sent to the envs unchanged, as TorchRL sends them. {hint} Pass "
                "check_actions='raise' to refuse them (nothing is sent), or check_actions=False to skip this check.")


def entry(tensordict: TensorDictBase, key) -> torch.Tensor | None:
    """``tensordict.get(key, None)``; for a top-level key of a TensorDict, straight from its entries (measured:
    0.1 µs against 1.8 µs through ``get``'s generic key handling)."""
    if type(key) is str and type(tensordict) is TensorDict:
        return tensordict._tensordict.get(key)
    return tensordict.get(key, None)


def key_tree(keys) -> dict:
    """Nested keys as a tree of dicts, in the keys' order: ``["done", ("agent", "reward")]`` ->
    ``{"done": None, "agent": {"reward": None}}`` (None: a leaf)."""
    tree = {}
    for key in keys:
        path = key_tuple(key)
        level = tree
        for name in path[:-1]:
            level = level.setdefault(name, {})
        level[path[-1]] = None
    return tree


def root_merger(root_keys: list, dropped_keys: list):
    """``merge(tensordict, root) -> TensorDict | None``: the next root of a step as TensorDict's
    ``tensordict.exclude(*dropped_keys)``, its nested tensordicts new (``clone(recurse=False)``), then
    ``.update(root.select(*root_keys))`` build it, level by level without their generic paths: the input's entries
    in their order, ``root``'s at ``root_keys`` (shared, not copied: the input's there replaced), ``dropped_keys``
    left out, ``root``'s entries the input lacks appended (in ``root_keys``' order). None from ``merge`` when
    ``tensordict`` or a nested entry is anything but a plain TensorDict (no dim names) of tensors and plain
    TensorDicts, or holds a tensor where ``root`` has a tensordict: the caller takes TensorDict's own path. None
    instead of the merger when a dropped key and a root key overlap (one is the other or holds it)."""
    taken = [key_tuple(key) for key in root_keys]
    dropped = [key_tuple(key) for key in dropped_keys]
    if any(a[:len(b)] == b or b[:len(a)] == a for a in taken for b in dropped):
        return None
    return functools.partial(_merged_root, take=key_tree(taken), drop=key_tree(dropped))


_ABSENT = object()


def _merged_root(tensordict: TensorDictBase, root: TensorDictBase, take: dict, drop: dict) -> TensorDict | None:
    """One level of :func:`root_merger`'s ``merge``."""
    if not is_plain(tensordict) or type(root) is not TensorDict:
        return None
    entries = root._tensordict
    out = {}
    for key, value in tensordict._tensordict.items():
        dropped = drop.get(key, _ABSENT)
        if dropped is None:
            continue
        taken = take.get(key, _ABSENT)
        if taken is None:
            out[key] = entries[key]
            continue
        if type(value) is torch.Tensor:
            if taken is not _ABSENT or dropped is not _ABSENT:  # (a tensor where keys below it are named)
                return None
            out[key] = value
            continue
        if taken is _ABSENT:  # a tensordict the root does not touch: a new one, the same leaves
            nested = _merged_root(value, _EMPTY, {}, {} if dropped is _ABSENT else dropped)
        else:
            nested = _merged_root(value, entries[key], taken, {} if dropped is _ABSENT else dropped)
        if nested is None:
            return None
        out[key] = nested
    for key, taken in take.items():
        if key not in out:
            value = entries[key]
            out[key] = value if taken is None else _selected(value, taken)
    return plain_tensordict(out, tensordict.batch_size, tensordict.device)


def _selected(td: TensorDict, take: dict) -> TensorDict:
    """``td.select(*keys)`` for the keys of the tree ``take`` (all in ``td``), plain TensorDicts built directly."""
    entries = td._tensordict
    out = {key: entries[key] if taken is None else _selected(entries[key], taken) for key, taken in take.items()}
    return plain_tensordict(out, td.batch_size, td.device)


_EMPTY = TensorDict()


def copier(td: TensorDictBase, recycler: Recycler, device: torch.device | None = None):
    """``copy() -> TensorDict``: a new TensorDict holding copies of ``td``'s leaves (the caller's own tensors, never
    views of the buffers; big ones in ``recycler``'s memory). With only top-level leaves it is built directly, at
    about half the cost of ``td.clone()``; with nested plain TensorDicts too (e.g. one per agent group), level by
    level. ``device`` (not the CPU): the copies are made there, straight from ``td`` (not recycled)."""
    if device is not None:
        return functools.partial(_unlocked_on, td, device)
    copy_leaves = leaf_copier(td, recycler)
    if copy_leaves is not None:
        batch_size = td.batch_size
        return lambda: plain_tensordict(copy_leaves(), batch_size)
    copy_tree = _tree_copier(td, recycler)
    return td.clone if copy_tree is None else copy_tree


def _tree_copier(td: TensorDictBase, recycler: Recycler):
    """:func:`copier`'s ``copy()`` for a plain TensorDict of tensors and plain TensorDicts (no dim names), each
    level built directly as ``clone()`` builds it (same keys in the same order, batch size and device); None for
    anything else."""
    if not is_plain(td):
        return None
    tensors = []
    nested = []
    for key, value in td.items():
        if type(value) is torch.Tensor:
            tensors.append((key, value))
            continue
        copy_nested = _tree_copier(value, recycler)
        if copy_nested is None:
            return None
        nested.append((key, copy_nested))
    copy_leaves = _leaves_copier(tensors, recycler)
    order = list(td.keys())
    batch_size = td.batch_size
    device = td.device

    def copy_tree() -> TensorDict:
        out = copy_leaves()
        for key, copy_nested in nested:
            out[key] = copy_nested()
        return plain_tensordict({key: out[key] for key in order}, batch_size, device)

    return copy_tree


def leaf_copier(td: TensorDictBase, recycler: Recycler, device: torch.device | None = None):
    """``copy_leaves() -> {key: tensor}``: copies of ``td``'s top-level leaves, as :func:`copier` makes them (on
    ``device`` if given); None when ``td`` holds anything but top-level tensors."""
    leaves = list(td.items())
    if not all(isinstance(value, torch.Tensor) for _, value in leaves):
        return None
    if device is not None:
        return lambda: {key: value.to(device) for key, value in leaves}
    return _leaves_copier(leaves, recycler)


def _leaves_copier(leaves: list, recycler: Recycler):
    """``copy_leaves() -> {key: tensor}``: copies of ``leaves`` (``(key, tensor)`` pairs), in their order."""
    big = {key for key, value in leaves if value.numel() * value.element_size() >= recycler.min_bytes}
    # the small leaves, copied through numpy: about half the cost of clone() per tensor (bfloat16: cloned below)
    arrays = {key: array for key, value in leaves if key not in big and (array := numpy_of(value)) is not None}
    rest = [(key, value) for key, value in leaves if key not in arrays]
    order = [key for key, _ in leaves]
    from_numpy = torch.from_numpy

    def copy_leaves() -> dict:
        out = {key: from_numpy(array.copy()) for key, array in arrays.items()}
        if rest:  # big leaves into recycled memory, the others cloned; then in the leaves' order
            out.update({key: recycler.empty(value.shape, value.dtype).copy_(value) if key in big else value.clone()
                        for key, value in rest})
            out = {key: out[key] for key in order}
        return out

    return copy_leaves


def _unlocked_on(td: TensorDictBase, device: torch.device) -> TensorDictBase:
    """A copy of ``td`` on ``device``, unlocked (``to`` keeps the lock of a locked ``td``, e.g. shared buffers)."""
    out = td.to(device)
    return out.unlock_() if out.is_locked else out


def in_spec_shape(value: torch.Tensor, expected: tuple) -> torch.Tensor:
    """``value`` with the last dim of ``expected`` added when that dim is one and ``value`` lacks only it (a view:
    the same values, none repeated; categorical actions ``[n]`` for a ``[n, 1]`` spec, which TorchRL's envs take),
    else ``value`` as it is."""
    if expected and expected[-1] == 1 and tuple(value.shape) == tuple(expected[:-1]):
        return value.unsqueeze(-1)
    return value


def cast_action(key, value: torch.Tensor, dtype: torch.dtype, check: bool) -> torch.Tensor:
    """``value`` cast to the action spec's ``dtype`` (as TorchRL's envs do). When ``check``, a cast to integers
    or bools must keep every value (``1.0`` -> ``1``; ``0.7``, ``300`` into ``uint8`` or ``2`` into ``bool``
    raise ``ValueError``): truncating or wrapping a policy's output would send other actions than it chose."""
    cast = value.to(dtype)
    if check and not dtype.is_floating_point and not torch.equal(cast.to(value.dtype), value):
        what = "non-integral values" if value.dtype.is_floating_point else f"values that {dtype} cannot hold"
        raise ValueError(
            f"{key!r} has dtype {value.dtype} with {what}, but the action spec's dtype is {dtype}: casting would "
            f"change the actions. Round or sample them as {dtype} (e.g. action_spec.rand()), or pass "
            "check_actions=False to cast as torch does."
        )
    return cast


def bounds(spec) -> str:
    """The values ``spec`` admits, in words (for messages)."""
    if isinstance(spec, OneHot):
        return f"one-hot rows of {spec.shape[-1]} zeros and ones, at most one 1 per row"
    space = getattr(spec, "space", None)
    n = getattr(space, "n", None)
    if n is not None:
        return f"integers in [0, {n - 1}]"
    low = getattr(space, "low", None)
    high = getattr(space, "high", None)
    if low is not None:
        return f"values in [{low.min().item():g}, {high.max().item():g}]"
    return type(spec).__name__


_NUMPY_DTYPES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint8}


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: Up to this many integer actions are checked in Python (measured: 0.9 µs for 8 against 2.7 µs for numpy's max)
_FEW = 64


def value_checker(spec: TensorSpec):
    """``check(value) -> bool``: are all of ``value``'s entries inside ``spec`` (shape and dtype are the
    caller's to check; ``value`` is a CPU tensor, as :func:`checked_actions` hands it over)? ``OneHot`` rows must be
    0/1 with at most one 1; ``Categorical`` (integers) and ``Bounded`` specs are checked with numpy reductions (NaN
    is outside any bounds); any other spec goes through ``spec.is_in``, and floating-point values must also be
    finite."""
    if type(spec) is Categorical and not spec.dtype.is_floating_point and spec.dtype is not torch.bool:
        n = int(spec.space.n)

        def check_categorical(value: torch.Tensor) -> bool:
            if value.ndim == 1 and value.shape[0] <= _FEW:  # (a vector's tolist() is cheaper than numpy's)
                flat = value.tolist()
                return not flat or (min(flat) >= 0 and max(flat) < n)
            array = value.numpy()  # (integers: never part of a graph)
            if array.size <= _FEW:  # (a numpy reduction costs more than Python's max over a short list)
                flat = array.ravel().tolist()
                return not flat or (min(flat) >= 0 and max(flat) < n)
            # one reduction: viewed as unsigned, negative values are larger than any valid one
            return bool(array.view(_UNSIGNED[array.itemsize]).max() < n)

        return check_categorical
    if type(spec) is OneHot:

        def check_one_hot(value: torch.Tensor) -> bool:
            # rows of 0/1 with at most one 1: an all-zero row is "no action", as TorchRL's own envs accept
            flags = value.detach()
            return bool(((flags == 0) | (flags == 1)).all()) and bool((flags.sum(-1) <= 1).all())

        return check_one_hot
    if isinstance(spec, Bounded) and spec.dtype in _NUMPY_DTYPES:  # BoundedContinuous / BoundedDiscrete too
        low = spec.space.low.cpu().numpy()
        high = spec.space.high.cpu().numpy()

        def check_bounded(value: torch.Tensor) -> bool:
            array = value.detach().numpy()
            return bool(((array >= low) & (array <= high)).all())

        return check_bounded
    if spec.dtype.is_floating_point:
        return lambda value: bool(spec.is_in(value)) and bool(torch.isfinite(value).all())
    return lambda value: bool(spec.is_in(value))


def step_mask(tensordict: TensorDictBase, num_envs: int, elements: int, owner: str) -> np.ndarray | None:
    """The ``"_step"`` entry of ``tensordict`` as bool ``[num_envs]``, or None when it is absent or selects
    every env. ``elements``: the envs' elements in all (``num_envs * prod(B)`` for batched envs); a mask per
    element must select whole envs. Raises ``ValueError`` naming ``owner`` for another size or a split env."""
    if "_step" not in tensordict.keys():  # (cheaper than get() with a default, which raises inside)
        return None
    step = tensordict.get("_step")
    flags = step.cpu().numpy().astype(bool)
    if flags.size not in (num_envs, elements):
        raise ValueError(f'"_step" has {flags.size} entries but {owner} has {num_envs} envs '
                         f"of {elements // num_envs} elements each.")
    rows = flags.reshape(num_envs, -1)
    if not (rows == rows[:, :1]).all():
        raise ValueError(f'{owner}: a "_step" mask must select whole envs (all elements of a batched '
                         "env, or none).")
    mask = rows[:, 0]
    return None if mask.all() else mask


def fill_not_stepped(out: TensorDictBase, tensordict: TensorDictBase, mask: np.ndarray) -> None:
    """After a partial step (``mask``: bool ``[num_envs]``, the envs stepped), the envs not stepped get in ``out``
    (the step's ``"next"``) what TorchRL gives them: the input's values for the keys it holds (observation, done
    flags), zeros for the others (reward)."""
    idle = torch.from_numpy(~mask).to(out.device)
    for key in out.keys(True, True):
        value = tensordict.get(key, None)
        out.get(key)[idle] = 0 if value is None else value[idle].to(out.get(key).dtype)


def reset_mask(tensordict: TensorDictBase, reset_keys, elements: int) -> np.ndarray | None:
    """bool ``[elements]``: the elements the ``"_reset"`` entries (``reset_keys``) of ``tensordict`` ask to reset
    (any of them, when there are several, e.g. one per agent group: the element is reset as a whole), or None
    without any."""
    mask = None
    for key in reset_keys:
        reset = tensordict.get(key, None)
        if reset is not None:
            wanted = reset.reshape(elements, -1).any(1).cpu().numpy()
            mask = wanted if mask is None else mask | wanted
    return mask
