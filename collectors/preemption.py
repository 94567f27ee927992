"""TorchRL's preemption: a collection may end before every env took its ``T`` steps.

``MultiSyncCollector(preemptive_threshold=p)``: once a fraction ``p`` of the workers has delivered its share of the
batch, the others stop at their next step boundary. ``Collector(interruptor=...)``: the collection stops at the next
step boundary once ``interruptor.collection_stopped()`` is true. Either way the steps not taken are marked as
TorchRL marks them: their ``("collector", "traj_ids")`` is -1 (their other entries are zeros), and with
``cat_results="stack"`` a ``("collector", "mask")`` entry flags the steps taken (``cat_results=-1`` drops the others).

:class:`StopFlag` is the flag the workers poll after each step (one bool in shared memory, TorchRL's interruptor
methods); each worker reports how many steps it took (``steps_taken[w]``).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from tdcollect.envs.engine.shared import in_shared_memory


class StopFlag:
    """One bool in shared memory: ``stop_collection()`` in the main process, ``collection_stopped()`` in the
    workers after each step; ``start_collection()`` before each batch (TorchRL's interruptor methods)."""

    def __init__(self):
        self._stopped = in_shared_memory(torch.zeros((), dtype=torch.bool), "the preemption flag")

    def start_collection(self) -> None:
        self._stopped.fill_(False)

    def stop_collection(self) -> None:
        self._stopped.fill_(True)

    def collection_stopped(self) -> bool:
        return bool(self._stopped)


def checked_threshold(preemptive_threshold, owner: str) -> float:
    """TorchRL's ``preemptive_threshold``: None (no preemption) is 1.0; any other value must lie in [0, 1]."""
    if preemptive_threshold is None:
        return 1.0
    value = float(preemptive_threshold)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: preemptive_threshold must be between 0.0 and 1.0 (the fraction of workers that "
                         f"finish their share before the others stop), got {preemptive_threshold!r}.")
    return value


def steps_taken_mask(steps_taken: torch.Tensor, steps: int) -> torch.Tensor | None:
    """bool ``[n_envs, steps]``: the steps each env took (``steps_taken``: int ``[n_envs]``); None when all did."""
    if bool((steps_taken >= steps).all()):
        return None
    return torch.arange(steps)[None, :] < steps_taken[:, None]


def clear_steps_not_taken(batch: TensorDictBase, taken: torch.Tensor) -> None:
    """Zero the entries of the steps not taken (a preempted worker's storage still holds an older batch there)."""
    not_taken = ~taken
    for leaf in batch.values(True, True):
        leaf[not_taken] = 0
