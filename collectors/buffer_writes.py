"""How a collector writes into a TorchRL replay buffer, as TorchRL's collectors do (``replay_buffer=``)."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase


def write_batch(buffer, batch: TensorDictBase, envs_per_write: int | None, extend_buffer: bool) -> None:
    """A batch ``[..., T]`` into ``buffer``. ``envs_per_write`` None (envs stepped one by one, unbatched): every
    step is an item. Batched envs: with ``extend_buffer`` each env's row of ``T`` steps is an item; without it,
    every step of one env batch (``envs_per_write`` envs) is added as it is (TorchRL adds them while collecting)."""
    if envs_per_write is None:
        extend(buffer, batch.reshape(-1))
    elif extend_buffer:
        extend(buffer, batch.reshape(-1, batch.shape[-1]))
    else:
        for group in batch.reshape(-1, batch.shape[-1]).split(envs_per_write):
            for t in range(group.shape[-1]):
                extend(buffer, group[:, t], one_item=True)


def extend(buffer, data: TensorDictBase, one_item: bool = False) -> None:
    """``buffer.extend(data)`` (``add`` for ``one_item``); data without a device gets the storage's (no copy: the
    collector's data is where the storage is, or the storage moves it anyway)."""
    device = getattr(getattr(buffer, "storage", None), "device", None)
    if data.device is None and isinstance(device, (torch.device, str)) and device != "auto":
        data = data.to(device)
    if one_item:
        buffer.add(data)
    else:
        buffer.extend(data)
