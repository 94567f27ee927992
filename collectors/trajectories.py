"""Whole trajectories out of frame batches: TorchRL's ``trajs_per_batch`` / ``trajs_per_write`` / ``traj_format``.

A collector collects fixed-frame batches as always; :class:`TrajectoryAssembler` cuts each batch into the pieces
of its trajectories (by ``("collector", "traj_ids")``), joins the pieces of one trajectory across batches, and
hands out a trajectory once its last step is done (``("next", "done" | "terminated" | "truncated")``). Episodes
still running are held back; none is ever handed out half.

Out of the assembler (``T_i``: the length of trajectory ``i``):

- ``traj_format="padded"`` (TorchRL's default): ``[trajs_per_batch, max T_i]``, zero-padded along time, with a
  bool ``("collector", "mask")`` marking the real steps (non-tensor entries are padded with their last value);
- ``traj_format="cat"``: ``[sum T_i]``, the trajectories one after the other in the order they finished;
- into a replay buffer: flat ``[sum T_i]`` writes of ``trajs_per_write`` trajectories each (all those that
  finished, by default), the layout a ``SliceSampler`` reads.
"""
from __future__ import annotations

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase, pad

from tdcollect.envs.engine.specs import DONE_KEYS
from tdcollect.envs.engine.user_warnings import warn_caller

from .stats import MASK_KEY, TRAJ_KEY


def check_trajectory_options(trajs_per_batch, trajs_per_write, traj_format, has_replay_buffer: bool,
                             owner: str) -> str:
    """The resolved ``traj_format`` (``"padded"`` or ``"cat"``), after checking the three arguments as TorchRL
    does (including its ``FutureWarning`` when the layout is left unset and batches are yielded)."""
    for name, value in (("trajs_per_batch", trajs_per_batch), ("trajs_per_write", trajs_per_write)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{owner}: {name} must be a positive int (or None), got {value!r}.")
    if traj_format is None:
        if trajs_per_batch is not None and not has_replay_buffer:
            warn_caller(f"{owner}: trajs_per_batch is set but traj_format is not; batches are 'padded' (TorchRL's "
                        "current default), which will change to 'cat' in torchrl v0.16. Pass "
                        "traj_format='padded' or 'cat' to choose.", FutureWarning)
        return "padded"
    if traj_format not in ("padded", "cat"):
        raise ValueError(f"{owner}: traj_format must be 'padded' or 'cat', got {traj_format!r}.")
    if traj_format != "padded" and trajs_per_batch is None:
        raise ValueError(f"{owner}: traj_format={traj_format!r} needs trajs_per_batch (the number of whole "
                         "trajectories per batch); without it batches are counted in frames.")
    if trajs_per_write is not None and trajs_per_batch is None:
        raise ValueError(f"{owner}: trajs_per_write needs trajs_per_batch and a replay_buffer.")
    return traj_format


def _ends_done(piece: TensorDictBase) -> bool:
    after = piece.get("next", None)
    if after is None:
        return False
    for name in DONE_KEYS:
        flag = after.get(name, None)
        if flag is not None and bool(flag[-1].any()):
            return True
    return False


class TrajectoryAssembler:
    """See the module docstring. ``add(batch)`` takes a frame batch (any batch shape, time last, with
    ``("collector", "traj_ids")``); ``batches()`` / ``writes()`` hand out what is complete."""

    def __init__(self, trajs_per_batch: int, traj_format: str = "padded", trajs_per_write: int | None = None):
        self.trajs_per_batch = trajs_per_batch
        self.traj_format = traj_format
        self.trajs_per_write = trajs_per_write
        self.pending: dict[int, list[TensorDictBase]] = {}  # trajectory id -> its pieces so far, in time order
        self.complete: list[TensorDictBase] = []  # finished trajectories [T_i], in the order they finished

    def add(self, batch: TensorDictBase) -> None:
        ids = batch.get(TRAJ_KEY, None)
        if ids is None:
            raise KeyError("trajs_per_batch needs ('collector', 'traj_ids') in every batch: leave "
                           "track_traj_ids=True and split_trajs=False.")
        flat, ids = batch.reshape(-1), ids.reshape(-1)
        order = torch.argsort(ids, stable=True)  # a trajectory's steps stay in time order
        flat, ids = flat[order], ids[order]
        unique, counts = torch.unique_consecutive(ids, return_counts=True)
        start = 0
        for traj_id, count in zip(unique.tolist(), counts.tolist()):
            piece = flat[start:start + count]
            start += count
            self.pending.setdefault(traj_id, []).append(piece)
            if _ends_done(piece):
                pieces = self.pending.pop(traj_id)
                self.complete.append(torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0])

    def batches(self):
        """Batches of ``trajs_per_batch`` finished trajectories in ``traj_format``, while there are enough."""
        while len(self.complete) >= self.trajs_per_batch:
            trajs = self.complete[:self.trajs_per_batch]
            del self.complete[:self.trajs_per_batch]
            yield torch.cat(trajs, 0) if self.traj_format == "cat" else padded(trajs)

    def writes(self):
        """Every finished trajectory, flat, ``trajs_per_write`` per write (all at once by default)."""
        per_write = self.trajs_per_write or max(len(self.complete), 1)
        while self.complete:
            trajs = self.complete[:per_write]
            del self.complete[:per_write]
            yield torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0]

    def drop_pending(self, traj_ids=None) -> None:
        """Forget the unfinished trajectories (those in ``traj_ids``; default: all): their envs restarted."""
        if traj_ids is None:
            self.pending.clear()
        for traj_id in traj_ids or ():
            self.pending.pop(int(traj_id), None)

    def clear(self) -> None:
        self.pending.clear()
        self.complete.clear()


def padded(trajs: list[TensorDictBase]) -> TensorDictBase:
    """``[len(trajs), max T_i]``: each trajectory zero-padded along time, with ``("collector", "mask")``."""
    longest = max(traj.shape[0] for traj in trajs)
    rows = []
    for traj in trajs:
        traj = traj.copy()
        traj.set(MASK_KEY, torch.ones(traj.shape[0], dtype=torch.bool, device=traj.device))
        missing = longest - traj.shape[0]
        if missing:
            non_tensor = {key: traj.get(key) for key in traj.keys(True, True, is_leaf=_non_tensor_leaf)
                          if isinstance(traj.get(key), (NonTensorData, NonTensorStack))}
            filled = pad(traj.exclude(*non_tensor), [0, missing])
            for key, value in non_tensor.items():  # pad() leaves non-tensor entries out: repeat the last one
                filled.set(key, torch.cat([value] + [value[-1:]] * missing, 0))
            traj = filled
        rows.append(traj)
    return torch.stack(rows, 0)


def _non_tensor_leaf(cls) -> bool:
    return issubclass(cls, (NonTensorData, NonTensorStack)) or issubclass(cls, torch.Tensor)
