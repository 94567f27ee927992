"""TorchRL's masks on their way in: the ``"_step"`` entry (partial steps, one flag per env) and the ``"_reset"``
entries (one flag per element, or per agent group) as numpy masks for a batched env's hooks."""
from __future__ import annotations

import numpy as np
from tensordict import TensorDictBase


def step_mask(tensordict: TensorDictBase, num_envs: int, elements: int, owner: str) -> np.ndarray | None:
    """The ``"_step"`` entry of ``tensordict`` as bool ``[num_envs]``, or None when it is absent or selects
    every env. ``elements``: the envs' elements in all (``num_envs * prod(B)`` for batched envs); a mask per
    element must select whole envs. Raises ``ValueError`` naming ``owner`` for another size or a split env."""
    step = tensordict.get("_step", None)
    if step is None:
        return None
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
