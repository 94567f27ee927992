"""MultiSyncCollector: N worker processes (see ``multi_base.py``); each batch is gathered from all of them.

Workers are idle while the main process uses a batch, so a weight update reaches every worker before the
next batch (synchronous, on-policy collection).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from tdcollect.envs.engine.errors import WorkerError
from tdcollect.envs.engine.protocol import COLLECT, COLLECT_RANDOM

from .multi_base import ProcessCollector
from .preemption import steps_taken_mask
from .stacked import reshape_leading
from .stats import MASK_KEY


class MultiSyncCollector(ProcessCollector):
    """Yields one batch per iteration from all ``num_workers`` processes, in TorchRL's layout: with
    ``cat_results="stack"`` (TorchRL's default) ``[num_workers, T]`` when each worker steps one unbatched env,
    ``[num_workers, *env_batch, T]`` when it steps a batched env; ``cat_results=0`` concatenates the workers'
    batches along their first dim (``[n_envs, T]`` over all envs for batched ones), ``-1`` along time. Keys are
    TorchRL's (time last, ``("collector", "traj_ids")``); ``frames_per_batch`` is rounded up to a multiple of
    the envs over all workers.

    Args:
        create_env_fn: a list of env constructors, one per worker (or one constructor and ``num_workers``);
            a constructor may return a gymnasium env, a TorchRL env, a ``SerialEnv`` or a ``ParallelEnv``.
        policy: as for :class:`~tdcollect.collectors.Collector` (or ``policy_factory``); each worker gets a copy
            whose weights live in shared memory (see :meth:`update_policy_weights_`).
        check_actions, check_values: as for :class:`~tdcollect.collectors.Collector`.
        mp_start_method, timeout: as for :class:`~tdcollect.envs.ParallelEnv`.
        max_restarts: how many times in all a worker that died, hung or raised may be replaced by a fresh one
            (opt-in; default 0). The replacement collects that worker's part of the batch again, its envs
            start new episodes with new trajectory ids; a warning is issued and ``restarts`` counts them.
            Past the limit (or without it) the error propagates and the collector is shut down.
        return_same_td: opt-in, as for :class:`~tdcollect.collectors.Collector`: the same TensorDict every time,
            overwritten by the next batch. By default every batch is the caller's to keep.

    TorchRL's other arguments keep their meaning: ``frames_per_batch``, ``total_frames``, ``device``,
    ``env_device``, ``policy_device``, ``storing_device``, ``split_trajs``, ``reset_at_each_iter``,
    ``init_random_frames``, ``max_frames_per_traj``, ``progress_bar``, ``exploration_type`` (default
    ``ExplorationType.RANDOM``, applied in every worker), ``postproc``, ``replay_buffer``, ``extend_buffer``,
    ``trajs_per_batch``, ``trajs_per_write``, ``traj_format``, ``set_truncated``, ``track_traj_ids``,
    ``pre_collect_hook`` and ``post_collect_hook`` (run in each worker), ``update_at_each_batch``,
    ``compile_policy`` (in each worker), ``init_fn`` (called first in each worker),
    ``auto_register_policy_transforms``, ``weight_sync_schemes``, ``num_threads`` (this process' torch threads),
    ``cat_results``, ``create_env_kwargs``, ``trust_policy``, ``no_cuda_sync``, ``compact_obs``, ``use_buffers``
    (either value: the same batches), ``preemptive_threshold`` (``preemption.py``); ``collectors/options.py``
    lists the few TorchRL arguments refused, each with its reason.
    """

    owner = "MultiSyncCollector"

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, cat_results: str | int | None = None, **kwargs):
        if not (cat_results is None or cat_results == "stack"
                or (isinstance(cat_results, int) and not isinstance(cat_results, bool))):
            raise ValueError(f"cat_results must be 'stack' or an int (the dim to concatenate along), got "
                             f"{cat_results!r}.")
        self.cat_results = "stack" if cat_results is None else cat_results
        self._reused_batch: TensorDictBase | None = None  # the batch yielded every time with return_same_td
        super().__init__(create_env_fn, policy, frames_per_batch, total_frames, num_workers=num_workers, **kwargs)

    def _collect(self, random: bool) -> TensorDictBase:
        """Run one collection on every worker. Failed workers are replaced while ``max_restarts`` allows and
        their share of the batch is collected again (the batch is always full); otherwise — and on Ctrl-C —
        the collector shuts down before the error propagates."""
        code = COLLECT_RANDOM if random else COLLECT
        workers = list(range(self.num_workers))
        stacked = self._handshake.stacked  # the workers answer with their batches (see stacked.py)
        while workers:
            try:
                if self.interruptor is None:
                    parts = self._pool.run(code, workers)
                else:
                    self._run_preemptible(code, workers)
                workers = []
            except WorkerError as err:
                replaced = self._recover(err)  # (stacked: the others' answers were dropped, so all collect again)
                workers = list(range(self.num_workers)) if stacked else replaced
            except KeyboardInterrupt:
                self.shutdown()
                raise
        if not stacked:
            parts = [self._storage(w) for w in range(self.num_workers)]
        self._count_batches(list(range(self.num_workers)), parts[0].shape[-1])
        if self.interruptor is not None:
            per_env = torch.repeat_interleave(self._steps_taken, torch.tensor(self.envs_per_worker))
            self._taken = steps_taken_mask(per_env, parts[0].shape[-1])
        if stacked:
            return torch.cat(parts, 0)
        if not self.return_same_td:
            return self._recycler.cat(parts, 0)
        if self._reused_batch is None:
            self._reused_batch = torch.cat(parts, 0)
        else:  # the keys the collector adds to a batch (trajectory ids) are not the workers'
            torch.cat(parts, 0, out=self._reused_batch.select(*parts[0].keys(True, True)))
        return self._reused_batch

    def _run_preemptible(self, code: int, workers: list[int]) -> None:
        """TorchRL's preemption: once ``int(preemptive_threshold * num_workers)`` workers finished their share, the
        others stop at their next step (``preemption.py``). A failure raises after the others finished."""
        self.interruptor.start_collection()
        self._pool.start(code, workers)
        pending = list(workers)
        try:
            first = min(int(self.preemptive_threshold * self.num_workers), len(pending))
            for w in self._pool.wait_any(first, pending, code) if first else []:
                pending.remove(w)
            self.interruptor.stop_collection()
            self._pool.wait_any(len(pending), pending, code)
        except WorkerError as err:
            self.interruptor.stop_collection()
            failed = set(getattr(err, "failures", {})) | set(getattr(err, "finished", []))
            others = [w for w in pending if w not in failed]
            if others:  # let them finish (stopped at their next step) before the failed ones are replaced
                try:
                    self._pool.wait_any(len(others), others, code)
                except WorkerError:
                    pass
            raise

    def _shaped(self, batch: TensorDictBase) -> TensorDictBase:
        """``[n_envs, T]`` (all workers' envs, worker after worker) in TorchRL's layout for ``cat_results``."""
        n = self.num_workers
        steps = batch.shape[-1]
        envs = self.envs_per_worker
        if self.interruptor is not None and self.cat_results == "stack":  # TorchRL's mask of the steps taken
            batch.set(MASK_KEY, self._taken if self._taken is not None else torch.ones(batch.shape, dtype=torch.bool))
        if all(self._handshake.unbatched):
            per_worker = batch  # [n_workers, T]: worker w's batch is [T]
        elif len(set(envs)) == 1:
            per_worker = reshape_leading(batch, 1, (n, envs[0]))
        elif self.cat_results == 0:
            return batch
        else:
            raise ValueError(f"{self.owner}: the workers step different numbers of envs ({envs}), so their "
                             f"batches cannot be stacked (cat_results={self.cat_results!r}); pass cat_results=0.")
        if self.cat_results == "stack":
            return per_worker
        parts = per_worker.unbind(0)
        if self._taken is not None and self.cat_results == -1:  # TorchRL's: the steps no env took are dropped
            taken = self._taken.view(n, -1, steps).any(1)
            parts = [part[..., taken[w]] for w, part in enumerate(parts)]
        return torch.cat(parts, self.cat_results)

    def _shutdown(self) -> None:
        self._reused_batch = None
        super()._shutdown()
