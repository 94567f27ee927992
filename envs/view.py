"""Indexing a ParallelEnv: ``env[1:3]`` is a live view of some of its workers, as with TorchRL's batched envs.

A :class:`WorkerView` is a batched env of its own (its own buffers, batch ``[len(workers) * envs_per_worker,
*B]``) that steps, resets, seeds and forwards through its parent: a step of the view is a partial step of the
parent over the view's workers, whose rows are then copied into the view's buffers. The parent's other workers
are untouched; closing the view leaves the parent running; closing the parent makes the view unusable. The view
holds its parent, so ``env = env[:1]`` keeps the workers alive.
"""
from __future__ import annotations

import numpy as np
import torch

from .batched import BatchedEnv
from .engine.shared import allocate_buffers
from .parallel import ParallelEnv


def worker_indices(item, num_workers: int) -> list[int]:
    """``item`` (an int, a slice, or a 1-D sequence / array / tensor of ints) as worker indices; raises
    ``NotImplementedError`` for boolean masks, ``IndexError`` for an empty selection or an index out of range."""
    if isinstance(item, (bool, np.bool_)):
        raise NotImplementedError("Boolean masks are not supported to index a batched env; pass worker indices.")
    if isinstance(item, slice):
        indices = list(range(num_workers))[item]
    else:
        index = torch.as_tensor(item)
        if index.dtype == torch.bool:
            raise NotImplementedError(
                "Boolean masks are not supported to index a batched env; pass worker indices.")
        if index.ndim > 1 or index.is_floating_point():
            raise IndexError(f"a batched env is indexed by worker indices (ints), got {item!r}.")
        indices = [int(i) for i in index.reshape(-1).tolist()]
        for i in indices:
            if not -num_workers <= i < num_workers:
                raise IndexError(f"index {i} is out of range for {num_workers} workers.")
        indices = [i % num_workers for i in indices]
    if not indices:
        raise IndexError("an empty selection of workers is not a batched env.")
    return indices


class WorkerView(ParallelEnv):
    """The workers ``workers`` of ``parent`` (a :class:`~tdcollect.envs.ParallelEnv`, or a view of one), as a
    batched env (see the module docstring). A ``ParallelEnv`` to ``isinstance``, it starts no process: every hook
    goes through the parent."""

    def __init__(self, parent, item):
        workers = worker_indices(item, parent.num_workers)
        k = parent.envs_per_worker
        rows = np.concatenate([np.arange(w * k, (w + 1) * k) for w in workers])
        buffers = allocate_buffers(parent._env_specs, len(rows), shared=False)
        BatchedEnv.__init__(self, parent._env_specs, len(rows), buffers, check_actions=parent.check_actions,
                            owner=f"{parent.owner}[workers {list(workers)}]", device=parent.device)
        self.__dict__["parent"] = parent  # held, not registered as a submodule (its state is not the view's)
        self.check_values = parent.check_values
        self.workers = list(workers)
        self._rows = rows
        self.num_workers = len(workers)
        self.envs_per_worker = k
        self._copy_rows()

    # ----------------------------------------------------------------- rows <-> parent
    def _parent_mask(self, mask: np.ndarray | None) -> np.ndarray:
        """An env mask of the parent: the view's envs (those where ``mask`` is True, when given)."""
        full = np.zeros(self.parent.num_envs, dtype=bool)
        full[self._rows if mask is None else self._rows[mask]] = True
        return full

    def _copy_rows(self) -> None:
        rows = torch.from_numpy(self._rows)
        self.root_buffer.update_(self.parent.root_buffer[rows])
        self.next_buffer.update_(self.parent.next_buffer[rows])
        if self._non_tensor_keys:
            for which in ("root", "next"):
                self._objects.last[which] = [self.parent._objects.last[which][i] for i in self._rows]

    def _check_parent(self) -> None:
        if self.parent.is_closed:
            raise RuntimeError("the parent environment has been closed: index it again once it has started.")

    # ----------------------------------------------------------------- hooks
    def _run_step(self, mask: np.ndarray | None = None):
        self._check_parent()
        rows = torch.from_numpy(self._rows)
        for (_, mine), (_, theirs) in zip(self.action_buffers, self.parent.action_buffers):
            theirs[rows] = mine
        self.parent.step_buffers(self._parent_mask(mask))
        self._copy_rows()

    worker_rollouts = None  # its steps go through the parent's (see _run_step): its rollouts are not recorded there

    def _run_reset(self, mask: np.ndarray | None):
        self._check_parent()
        parent = self.parent
        per_env = self._num_elements // self.num_envs
        elements = np.zeros(parent._num_elements, dtype=bool)
        chosen = np.ones(self._num_elements, dtype=bool) if mask is None else mask
        parent_elements = (self._rows[:, None] * per_env + np.arange(per_env)).reshape(-1)
        elements[parent_elements[chosen]] = True
        parent._objects.keep(parent._run_reset(elements))
        parent._pending_reset[elements] = False
        self._copy_rows()

    def _run_set_seed(self, seed, static_seed, episodes=False, workers=None):
        self._check_parent()
        mine = self.workers if workers is None else [self.workers[w] for w in workers]
        return self.parent._run_set_seed(seed, static_seed, episodes, mine)

    def _run_env_attribute(self, path, op, args, kwargs, workers=None):
        self._check_parent()
        mine = self.workers if workers is None else [self.workers[w] for w in workers]
        return self.parent._run_env_attribute(path, op, args, kwargs, mine)

    @property
    def restarts(self) -> list[int]:
        return [self.parent.restarts[w] for w in self.workers]

    @property
    def worker_pids(self) -> list[int]:
        return [self.parent.worker_pids[w] for w in self.workers]

    def _shutdown(self) -> None:
        pass  # the workers are the parent's

    def begin(self, command: str, mask: np.ndarray | None = None, call: tuple = ()) -> None:
        raise NotImplementedError(f"{self.owner}: begin() and finish() run on the ParallelEnv itself, not on a view "
                                  "of some of its workers (use the parent's, with a mask for a step or reset).")

    def finish(self, timeout: float | None = None) -> None:
        self.begin("finish")

    def _start_again(self):
        self._check_parent()
        raise RuntimeError("this closed indexed view cannot start again: index the parent env again.")

    def _ensure_open(self) -> None:
        self._check_parent()
        super()._ensure_open()


ParallelEnv.view_class = WorkerView
