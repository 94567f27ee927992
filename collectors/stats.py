"""Trajectory ids and episode statistics, computed in the main process from consecutive batches."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from tdcollect.envs.engine.shared import key_tuple
from tdcollect.envs.engine.specs import DONE_KEYS

TRAJ_KEY = ("collector", "traj_ids")
MASK_KEY = ("collector", "mask")  # TorchRL's flags of the steps that hold data (padded or preempted batches)


def episode_ends(batch: TensorDictBase) -> torch.Tensor:
    """bool ``[n_envs, T]``: the steps of a batch ``[n_envs, T]`` after which the env's episode is over:
    ``("next", "done")``, or, for envs whose done flags are nested only (per agent, ...), any of them."""
    n, t = batch.batch_size
    return ends_of([leaf.reshape(n, t, -1) for leaf in done_leaves(batch)])


def done_leaves(batch: TensorDictBase) -> list[torch.Tensor]:
    """The done flags :func:`episode_ends` reads: ``[("next", "done")]``, else every nested ``"done"`` under
    ``"next"``."""
    after = batch.get("next")
    done = after.get("done", None)
    leaves = [done] if done is not None else [after.get(key) for key in after.keys(True, True)
                                              if isinstance(key, tuple) and key[-1] == "done"]
    if not leaves:
        raise KeyError("the batch has no ('next', 'done') entry, nested or not: the env reports no done flag.")
    return leaves


def ends_of(leaves: list[torch.Tensor]) -> torch.Tensor:
    """Any of the flags ``[..., k]`` of every leaf, over the last dim: ``[...]``."""
    ends = leaves[0].any(-1)
    for leaf in leaves[1:]:
        ends = ends | leaf.any(-1)
    return ends


class TrajectoryTracker:
    """Gives every trajectory a unique id and measures the episodes that finish.

    ``annotate(batch)`` (batch ``[n_envs, T]`` with done flags, see :func:`episode_ends`, and
    ``("next", "reward")``) sets
    ``("collector", "traj_ids")`` (int64 ``[n_envs, T]``; a trajectory that spans batches keeps its id) and
    returns ``{"returns": float [k], "lengths": int64 [k]}`` for the ``k`` episodes that ended in the batch
    (returns summed over reward dims, counted from the episode's start even if that was batches ago).
    ``valid`` (bool ``[n_envs, T]``, for preempted batches): the steps collected; the others (zeroed by the
    caller, so that no episode ends there) get the id -1, TorchRL's mark, and do not count in episode lengths.
    """

    def __init__(self, n_envs: int):
        self.current = torch.arange(n_envs)
        self.next_id = n_envs
        self.running_return = torch.zeros(n_envs, dtype=torch.float64)
        self.running_length = torch.zeros(n_envs, dtype=torch.int64)

    def annotate(self, batch: TensorDictBase, rows: range | None = None, valid: torch.Tensor | None = None) -> dict:
        """``rows``: the envs the batch holds, when not all of them (one worker's batch)."""
        if rows is not None and len(rows) != len(self.current):
            part = TrajectoryTracker(len(rows))
            part.current = self.current[rows.start:rows.stop]
            part.next_id = self.next_id
            part.running_return = self.running_return[rows.start:rows.stop]
            part.running_length = self.running_length[rows.start:rows.stop]
            stats = part.annotate(batch, valid=valid)
            self.next_id = part.next_id
            self.current[rows.start:rows.stop] = part.current
            self.running_return[rows.start:rows.stop] = part.running_return
            self.running_length[rows.start:rows.stop] = part.running_length
            return stats
        n, t = batch.batch_size
        done = episode_ends(batch)
        ends = done.long()
        before = ends.cumsum(1) - ends  # episodes ended strictly before each step
        new = ends.sum(1)
        offsets = new.cumsum(0) - new
        ids = torch.where(before == 0, self.current[:, None], self.next_id + offsets[:, None] + before - 1)
        self.current = torch.where(done[:, -1], self.next_id + offsets + new - 1, ids[:, -1])
        self.next_id += int(new.sum())
        batch.set(TRAJ_KEY, ids if valid is None else ids.masked_fill(~valid, -1))
        return self._episodes(batch, before, new, n, t, valid)

    def restart(self, rows) -> None:
        """The envs in ``rows`` were rebuilt: their next steps belong to new trajectories, whose returns
        and lengths count from zero."""
        rows = torch.as_tensor(list(rows), dtype=torch.int64)
        self.current[rows] = self.next_id + torch.arange(len(rows))
        self.next_id += len(rows)
        self.running_return[rows] = 0
        self.running_length[rows] = 0

    def _episodes(self, batch, before, new, n, t, valid) -> dict:
        reward = batch.get(("next", "reward"), None)
        if reward is None:
            return {"returns": torch.zeros(0), "lengths": torch.zeros(0, dtype=torch.int64)}
        reward = reward.reshape(n, t, -1).sum(-1).double()
        segment = (torch.arange(n)[:, None] * (t + 1) + before).flatten()
        sums = torch.zeros(n * (t + 1), dtype=torch.float64).index_add_(0, segment, reward.flatten())
        steps = torch.ones_like(segment) if valid is None else valid.flatten().long()
        lens = torch.zeros(n * (t + 1), dtype=torch.int64).index_add_(0, segment, steps)
        sums, lens = sums.view(n, t + 1), lens.view(n, t + 1)
        sums[:, 0] += self.running_return
        lens[:, 0] += self.running_length
        finished = torch.arange(t + 1)[None, :] < new[:, None]
        rows = torch.arange(n)
        self.running_return = sums[rows, new].clone()
        self.running_length = lens[rows, new].clone()
        return {"returns": sums[finished].float(), "lengths": lens[finished]}


def next_observation_keys(batch: TensorDictBase) -> list:
    """The ``("next", ...)`` entries that are observations or state (what TorchRL's ``compact_obs`` leaves out): those
    the root holds too, but the done flags."""
    root = set(batch.exclude("next").keys(True, True))
    return [("next", *key_tuple(key)) for key in batch.get("next").keys(True, True)
            if key in root and key_tuple(key)[-1] not in DONE_KEYS]
