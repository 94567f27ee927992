"""MultiAsyncCollector and AsyncCollector: worker processes (see ``multi_base.py``) that each collect on their
own; every iteration yields the batch of whichever worker finished first, and that worker starts its next
batch at once, while the caller trains on this one (off-policy collection, as TorchRL's).
"""
from __future__ import annotations

from tensordict import TensorDictBase

from tdcollect.envs.engine.errors import WorkerError
from tdcollect.envs.engine.protocol import COLLECT, COLLECT_RANDOM

from .multi_base import ProcessCollector
from .stats import TrajectoryTracker


class MultiAsyncCollector(ProcessCollector):
    """Yields one worker's batch per iteration, as soon as one is ready: ``frames_per_batch`` frames (rounded up
    to a multiple of that worker's envs) in TorchRL's layout, ``[T]`` for a worker stepping an unbatched env and
    ``[*env_batch, T]`` for a batched one; ``("collector", "traj_ids")`` are unique over all workers.

    The workers keep collecting while the caller uses a batch, so a batch may have been collected with weights
    older than the last :meth:`update_policy_weights_` (``weight_versions`` says which; ``update_at_each_batch``
    publishes the policy's weights before each worker starts its next batch). The arguments are
    :class:`~tdcollect.collectors.MultiSyncCollector`'s, but for ``cat_results`` (batches are never
    merged: only ``None`` / ``"stack"``).
    """

    owner = "MultiAsyncCollector"
    per_worker_batches = True

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, cat_results=None, **kwargs):
        if cat_results not in (None, "stack"):  # one worker's batch is in the "stack" layout already
            raise ValueError(f"{self.owner} yields one worker's batch at a time: cat_results={cat_results!r} applies "
                             "to MultiSyncCollector only (leave it unset or 'stack').")
        self._in_flight: list[int] = []
        self._held: list[int] = []  # finished workers whose batches wait for older ones (see _next_finished)
        self._reused_batch: dict[int, TensorDictBase] = {}
        self._last_worker = 0
        super().__init__(create_env_fn, policy, frames_per_batch, total_frames, num_workers=num_workers, **kwargs)
        self._tracker = TrajectoryTracker(sum(self.envs_per_worker))

    def _start(self, workers: list[int]) -> None:
        code = COLLECT_RANDOM if self.frames < self.init_random_frames else COLLECT
        self._unread[workers] = 1  # until each worker has recorded the version it acts with
        self._pool.start(code, workers)
        self._in_flight.extend(workers)

    def _collect(self, random: bool) -> TensorDictBase:
        """The next batch to finish. A failed worker is replaced while ``max_restarts`` allows and starts
        again (its envs with new episodes); otherwise — and on Ctrl-C — the collector shuts down first."""
        if not self._in_flight and not self._held:  # the first batch, or after set_seed / reset (see _settle)
            self._start(list(range(self.num_workers)))
        while True:
            try:
                w = self._next_finished()
                break
            except WorkerError as err:
                for done in [*getattr(err, "finished", []), *getattr(err, "failures", {})]:
                    if done in self._in_flight:
                        self._in_flight.remove(done)
                self._start(self._recover(err))
            except KeyboardInterrupt:
                self.shutdown()
                raise
        if self._handshake.stacked:  # the batch comes by pipe, a new one each time (see stacked.py)
            batch = self._pool.reply(w)
        elif self.return_same_td:
            storage = self._storage(w)
            if w not in self._reused_batch:
                self._reused_batch[w] = storage.clone()
            else:
                self._reused_batch[w].update_(storage.select(*self._reused_batch[w].keys(True, True), strict=False))
            batch = self._reused_batch[w]
        else:
            batch = self._recycler.clone(self._storage(w))
        self._count_batches([w], batch.shape[-1])
        self._acted_versions = self._versions_tensor.clone()  # (before the worker records its next batch's)
        self._start([w])  # it collects its next batch while the caller uses this one
        self._last_worker = w
        self._batch_rows = self._rows(w)
        return batch

    def _next_finished(self) -> int:
        """The worker whose batch to yield next: the first to finish, but a batch in flight when the weights changed
        comes before any collected with newer ones (TorchRL's order: its weight update waits for the batches in
        flight). A newer batch that finishes first is held (``_held``) until the older ones are yielded."""
        while True:
            current = self.policy_version  # (a worker that has not read its version yet will read this one)
            stale = [w for w in self._in_flight if not self._unread[w] and self._versions_tensor[w] < current]
            if self._held and not stale:
                return self._held.pop(0)
            w = self._pool.wait_any(1, self._in_flight, COLLECT)[0]
            self._in_flight.remove(w)
            if not stale or w in stale:
                return w
            self._held.append(w)

    def _shaped(self, batch: TensorDictBase) -> TensorDictBase:
        return batch[0] if self._handshake.unbatched[self._last_worker] else batch

    def _settle(self) -> None:
        """Let the batches still being collected finish (their frames are dropped), so the workers take calls."""
        held, self._held = self._held, []
        try:
            finished = self._pool.wait_any(len(self._in_flight), self._in_flight, COLLECT) if self._in_flight else []
        finally:
            self._in_flight = []
        if self._handshake.stacked:
            for w in [*held, *finished]:
                self._pool.reply(w)  # (dropped)

    def _shutdown(self) -> None:
        self._in_flight = []
        self._held = []
        self._reused_batch = {}
        super()._shutdown()


class AsyncCollector(MultiAsyncCollector):
    """TorchRL's ``AsyncCollector``: one worker process collecting while the caller trains on the last batch
    (a :class:`MultiAsyncCollector` with one worker). Arguments as for it, with one env constructor."""

    owner = "AsyncCollector"

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, **kwargs):
        if isinstance(create_env_fn, (list, tuple)):
            if len(create_env_fn) != 1:
                raise ValueError(f"AsyncCollector runs one worker: pass one env constructor, got "
                                 f"{len(create_env_fn)} (use MultiAsyncCollector for several).")
            create_env_fn = create_env_fn[0]
        if kwargs.pop("num_workers", None) not in (None, 1):
            raise ValueError("AsyncCollector runs one worker; use MultiAsyncCollector for several.")
        super().__init__([create_env_fn], policy, frames_per_batch, total_frames, **kwargs)
