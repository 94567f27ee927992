"""CollectorBase: iteration, frame counting, trajectory ids, episode statistics, progress, devices.

Subclasses implement ``_collect(random: bool) -> TensorDict [n_envs, T]`` (a fresh TensorDict the caller
may keep), ``update_policy_weights_`` and ``_shutdown``.
"""
from __future__ import annotations

import math
import time
from collections import deque

import torch
from tensordict import TensorDictBase

from .stats import TrajectoryTracker


class CollectorBase:
    def __init__(self, frames_per_batch: int, total_frames: int, *, split_trajs: bool = False,
                 init_random_frames: int = 0, storing_device=None, progress_bar: bool = False):
        if not isinstance(frames_per_batch, int) or frames_per_batch < 1:
            raise ValueError(f"frames_per_batch must be a positive int, got {frames_per_batch!r}.")
        if total_frames is None or total_frames == 0 or (total_frames < 0 and total_frames != -1):
            raise ValueError(f"total_frames must be positive or -1 (endless), got {total_frames!r}.")
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.split_trajs = split_trajs
        self.init_random_frames = init_random_frames or 0
        self.storing_device = None if storing_device is None else torch.device(storing_device)
        self.progress_bar = progress_bar
        self.frames = 0
        self.batches = 0
        self.episode_stats: dict = {}
        self.recent_returns: deque = deque(maxlen=100)
        self._tracker: TrajectoryTracker | None = None
        self._closed = False

    @staticmethod
    def steps_per_batch(frames_per_batch: int, n_envs: int, owner: str) -> int:
        if frames_per_batch % n_envs:
            lower = max(n_envs, frames_per_batch // n_envs * n_envs)
            raise ValueError(
                f"{owner}: frames_per_batch={frames_per_batch} is not a multiple of the {n_envs} envs it "
                f"steps; use e.g. {lower} or {lower + n_envs}."
            )
        return frames_per_batch // n_envs

    def __iter__(self):
        bar = self._make_bar()
        try:
            while self.total_frames == -1 or self.frames < self.total_frames:
                start = time.perf_counter()
                batch = self._collect(self.frames < self.init_random_frames)
                if self._tracker is None:
                    self._tracker = TrajectoryTracker(batch.batch_size[0])
                self.episode_stats = self._tracker.annotate(batch)
                self.recent_returns.extend(self.episode_stats["returns"].tolist())
                self.frames += batch.numel()
                self.batches += 1
                if bar is not None:
                    bar.update(batch.numel())
                    bar.set_postfix(fps=f"{batch.numel() / (time.perf_counter() - start):,.0f}")
                if self.split_trajs:
                    from torchrl.collectors.utils import split_trajectories

                    batch = split_trajectories(batch)
                if self.storing_device is not None:
                    batch = batch.to(self.storing_device)
                yield batch
        finally:
            if bar is not None:
                bar.close()

    def _restart_trajectories(self, rows=None) -> None:
        """The envs in ``rows`` (default: all) start new episodes: new trajectory ids, returns and lengths
        counted from zero."""
        if self._tracker is not None:
            self._tracker.restart(range(len(self._tracker.current)) if rows is None else rows)

    def _make_bar(self):
        if not self.progress_bar:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=None if self.total_frames == -1 else self.total_frames, unit="frames")

    def __len__(self) -> int:
        if self.total_frames == -1:
            raise TypeError("an endless collector (total_frames=-1) has no length.")
        return math.ceil(self.total_frames / self.frames_per_batch)

    def _collect(self, random: bool) -> TensorDictBase:
        raise NotImplementedError

    def update_policy_weights_(self, policy_weights=None) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop everything the collector started; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - nothing useful can be done at garbage collection
            pass
