"""Actions on their way into the buffers: the check of their shape, dtype and values against the action spec
(``check_actions``), and the cast to the spec's dtype, for every batched env (``BatchedEnv.write_actions``,
``AsyncParallelEnv.send``).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data import OneHot


def checked_actions(tensordict: TensorDictBase, n: int, slots: list[tuple], value_checks: dict, check: bool | str,
                    owner: str) -> list[torch.Tensor]:
    """The action entries of ``tensordict`` for ``n`` envs, in the order of ``slots`` (``(key, buffer [N, ...],
    spec)`` per action key), after checking their shape, dtype and (when ``check``) values with
    ``value_checks[key]``; ``check="finite"`` checks floating-point actions for NaN and infinities only (not the
    bounds of a continuous spec, which TorchRL's collectors do not enforce), integer ones against their spec.

    An entry whose shape lacks only the spec's last dim, of size one (categorical actions ``[n]`` for a ``[n, 1]``
    spec, which TorchRL's envs take), is given it; any other shape than the expected one is refused.
    Raises ``KeyError`` for a missing entry and ``ValueError`` naming the key and what was expected.
    """
    values = []
    for key, buffer, spec in slots:
        expected = (n, *buffer.shape[1:])
        value = tensordict.get(key, None)
        if value is None:
            raise KeyError(
                f"the input tensordict has no {key!r} entry; {owner} expects one of "
                f"shape {expected} and dtype {buffer.dtype}."
            )
        value = in_spec_shape(value, expected)
        if tuple(value.shape) != expected:
            raise ValueError(
                f"{key!r} has shape {tuple(value.shape)}, but {owner} expects shape {expected} ({n} envs x "
                f"{tuple(buffer.shape[1:])}) and dtype {buffer.dtype}; action spec: {type(spec).__name__}."
            )
        if value.dtype != buffer.dtype:
            value = cast_action(key, value, buffer.dtype, check)
        if check == "finite" and value.dtype.is_floating_point:
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"{key!r} holds NaN or infinite values; nothing was sent to the envs. A policy that "
                                 "diverged?")
        elif check and not value_checks[key](value):
            raise ValueError(
                f"{key!r} holds values outside its spec ({bounds(spec)}"
                f"{', NaN and infinities excluded' if value.dtype.is_floating_point else ''}); nothing was "
                "sent to the envs. A policy that diverged, or actions on another scale than the spec's?"
            )
        values.append(value)
    return values


def in_spec_shape(value: torch.Tensor, expected: tuple) -> torch.Tensor:
    """``value`` with the last dim of ``expected`` added when that dim is one and ``value`` lacks only it (a view:
    the same values, none repeated; categorical actions ``[n]`` for a ``[n, 1]`` spec, which TorchRL's envs take),
    else ``value`` as it is."""
    if expected and expected[-1] == 1 and tuple(value.shape) == tuple(expected[:-1]):
        return value.unsqueeze(-1)
    return value


def cast_action(key, value: torch.Tensor, dtype: torch.dtype, check: bool) -> torch.Tensor:
    """``value`` cast to the action spec's ``dtype`` (as TorchRL's envs do). When ``check``, a cast from
    floating point to integers or bools must keep every value (``1.0`` -> ``1``; ``0.7`` raises
    ``ValueError``): truncating a policy's output would send other actions than it chose."""
    cast = value.to(dtype)
    if check and value.dtype.is_floating_point and not dtype.is_floating_point:
        if not torch.equal(cast.to(value.dtype), value):
            raise ValueError(
                f"{key!r} has dtype {value.dtype} with non-integral values, but the action spec's dtype is "
                f"{dtype}: casting would change the actions. Round or sample them as {dtype} (e.g. "
                "action_spec.rand()), or pass check_actions=False to cast as torch does."
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
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is not None:
        return f"values in [{low.min().item():g}, {high.max().item():g}]"
    return type(spec).__name__
