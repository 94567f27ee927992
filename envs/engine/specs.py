"""The specs every env shares (reward ``float32 [1]``; ``done`` / ``terminated`` / ``truncated`` ``bool [1]``) and
the checks that the envs of one batched env (or the workers of one start-up) agree on their specs. The families
convert their own spaces / specs (``tdcollect.envs.libs``)."""
from __future__ import annotations

import numpy as np
import torch
from torchrl.data import Categorical, Composite, NonTensor, TensorSpec, Unbounded

from .errors import SpecMismatchError

DONE_KEYS = ("done", "terminated", "truncated")


def torch_dtype(np_dtype) -> torch.dtype:
    """The torch dtype that holds values of a numpy dtype."""
    return torch.from_numpy(np.zeros((), dtype=np_dtype)).dtype


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
