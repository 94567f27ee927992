"""Gymnasium spaces -> TorchRL specs, and the fixed specs every env shares.

The conversion is structural:

=====================  ==================================================
gymnasium space        TorchRL spec (unbatched)
=====================  ==================================================
``Box``                ``Bounded`` if every bound is finite, else ``Unbounded``
``Discrete(n)``        ``Categorical(n)``, shape ``[]``, int64 (``start`` is removed)
``MultiDiscrete``      ``MultiCategorical(nvec)``, int64 (``start`` is removed)
``MultiBinary``        ``Binary``, the space's dtype
``Dict``               ``Composite`` with the same keys (nested)
``Tuple``              ``Composite`` with keys ``"0"``, ``"1"``, ...
=====================  ==================================================

Rewards are ``float32`` of shape ``[1]``; ``done`` / ``terminated`` / ``truncated`` are ``bool`` of shape ``[1]``.
"""
from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    NonTensor,
    TensorSpec,
    Unbounded,
)

from .errors import SpecMismatchError

DONE_KEYS = ("done", "terminated", "truncated")


def torch_dtype(np_dtype) -> torch.dtype:
    """The torch dtype that holds values of a numpy dtype."""
    return torch.from_numpy(np.zeros((), dtype=np_dtype)).dtype


def space_to_spec(space: spaces.Space) -> TensorSpec:
    """Convert one gymnasium space into the matching unbatched TorchRL spec (see the module table)."""
    if isinstance(space, spaces.Box):
        dtype = torch_dtype(space.dtype)
        low, high = np.asarray(space.low), np.asarray(space.high)
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


def reward_spec() -> Composite:
    """``{"reward": float32 [1]}``."""
    return Composite(reward=Unbounded(shape=(1,), dtype=torch.float32), shape=())


def done_spec() -> Composite:
    """``{"done", "terminated", "truncated"}``, each bool ``[1]``."""
    return Composite(
        {key: Categorical(2, shape=(1,), dtype=torch.bool) for key in DONE_KEYS}, shape=()
    )


def spec_differences(reference: Composite, other: Composite) -> list[str]:
    """Keys (as strings) whose presence, shape, dtype or bounds differ between two Composite specs."""
    ref_keys = set(reference.keys(True, True))
    other_keys = set(other.keys(True, True))
    diffs = [_key_name(k) + " (missing)" for k in ref_keys - other_keys]
    diffs += [_key_name(k) + " (unexpected)" for k in other_keys - ref_keys]
    for key in ref_keys & other_keys:
        if isinstance(reference[key], NonTensor) and isinstance(other[key], NonTensor):
            if reference[key].shape != other[key].shape:  # their example values may differ (one per task)
                diffs.append(f"{_key_name(key)} ({_describe(reference[key])} vs {_describe(other[key])})")
            continue
        if reference[key] != other[key]:
            diffs.append(
                f"{_key_name(key)} ({_describe(reference[key])} vs {_describe(other[key])})"
            )
    return sorted(diffs)


def check_same_specs(specs: dict, advice: str) -> None:
    """Raise :class:`~tdcollect.envs.errors.SpecMismatchError` when the specs in ``specs`` (``{label: specs}``,
    each an object with ``as_composite()``) are not all equal to the first one's, naming the keys that
    differ: "``<label>`` has other specs than ``<first label>``: ... . ``<advice>``"."""
    (first, reference), *rest = specs.items()
    reference = reference.as_composite()
    for label, other in rest:
        diffs = spec_differences(reference, other.as_composite())
        if diffs:
            raise SpecMismatchError(f"{label} has other specs than {first} (their metadata are incompatible): "
                                    f"{'; '.join(diffs)}. {advice}")


def agreed_specs(first_start, infos: dict, advice: str):
    """The specs every worker of a start-up must have: ``first_start`` (the specs of the first start's workers,
    or None at the first start) or else the lowest worker's. ``infos``: ``{worker: specs}``; raises
    :class:`~tdcollect.envs.errors.SpecMismatchError` when one differs."""
    known = {} if first_start is None else {"the first start's workers": first_start}
    check_same_specs({**known, **{f"worker {w}": specs for w, specs in infos.items()}}, advice)
    return first_start or infos[min(infos)]


def _key_name(key) -> str:
    return ".".join(key) if isinstance(key, tuple) else str(key)


def _describe(spec: TensorSpec) -> str:
    n = getattr(getattr(spec, "space", None), "n", None)  # categorical sizes, so that two specs read apart
    return f"{type(spec).__name__} shape={tuple(spec.shape)} dtype={spec.dtype}" + ("" if n is None else f" n={n}")
