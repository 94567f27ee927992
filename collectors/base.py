"""CollectorBase: iteration, frame counting, trajectory ids, episode statistics, progress, devices.

Subclasses implement ``_collect(random: bool) -> TensorDict [n_envs, T]`` (a TensorDict the caller may keep:
new or recycled memory from ``self._recycler``, or with ``return_same_td`` the same one every time),
``update_policy_weights_`` and ``_shutdown``. The multi-process collectors (MultiSync, Ray) share
:func:`prepare_workers` and :func:`check_same_entries`.
"""
from __future__ import annotations

import math
import threading
import time

import cloudpickle
import torch
from tensordict import TensorDictBase

from tdcollect.envs.errors import SpecMismatchError
from tdcollect.envs.factories import PickledFactory, bind_kwargs, constructors_and_kwargs
from tdcollect.envs.recycle import Recycler

from .policies import policy_module
from .stats import TrajectoryTracker


class CollectorBase:
    def __init__(self, frames_per_batch: int, total_frames: int, *, split_trajs: bool = False,
                 init_random_frames: int = 0, storing_device=None, progress_bar: bool = False,
                 return_same_td: bool = False):
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
        self.return_same_td = bool(return_same_td)
        #: memory for the batches, reused once the caller holds no batch over it (``tdcollect/envs/recycle.py``)
        self._recycler = Recycler()
        self.frames = 0
        self.batches = 0
        self.episode_stats: dict = {}
        self._tracker: TrajectoryTracker | None = None
        self._closed = False
        self._in_use = threading.Lock()

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
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is shut down (by shutdown(), or after a worker failure "
                               "it could not recover from); create a new one.")
        bar = self._make_bar()
        try:
            while self.total_frames == -1 or self.frames < self.total_frames:
                start = time.perf_counter()
                if not self._in_use.acquire(blocking=False):
                    raise RuntimeError(f"two threads iterate this {type(self).__name__} at once; their batches "
                                       "would interleave. Iterate a collector from one thread.")
                try:
                    batch = self._collect(self.frames < self.init_random_frames)
                finally:
                    self._in_use.release()
                if self._tracker is None:
                    self._tracker = TrajectoryTracker(batch.batch_size[0])
                self.episode_stats = self._tracker.annotate(batch)
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
        self._recycler.clear()
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


def check_env_device(env_device, owner: str) -> None:
    if env_device is not None and torch.device(env_device).type != "cpu":
        raise ValueError(f"{owner}: env_device must be the CPU (tdcollect's envs step on the CPU), got {env_device}.")


def prepare_workers(create_env_fn, policy, num_workers: int | None, create_env_kwargs, env_device, owner: str,
                    unit: str) -> tuple[list, bytes | None, object]:
    """What a multi-process collector checks and packs in the main process before any worker starts:
    ``(factories, policy_payload, module)`` — one cloudpickled env constructor per worker (``create_env_fn``
    is a list of them, or one with ``num_workers``), the policy cloudpickled (None: random actions) and the
    ``nn.Module`` holding its weights (or None)."""
    check_env_device(env_device, owner)
    if num_workers is None:
        num_workers = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else 1
    factories = bind_kwargs(*constructors_and_kwargs(create_env_fn, num_workers, create_env_kwargs, owner,
                                                     "num_workers"))
    pickled = [PickledFactory(fn, owner, f"{unit} {w}") for w, fn in enumerate(factories)]
    payload = cloudpickle.dumps(policy) if policy is not None else None
    return pickled, payload, policy_module(policy) if policy is not None else None


def check_same_entries(batches: dict[int, TensorDictBase], owner: str, unit: str) -> None:
    """Every worker's batches (``{worker: TensorDict [n_envs, T]}``) must have the same keys and, per key,
    the same dtype and per-step shape as the first worker's; else a
    :class:`~tdcollect.envs.errors.SpecMismatchError` naming the entries that differ."""
    def entries(batch) -> dict:
        return {str(key): (value.dtype, tuple(value.shape[2:])) for key, value in batch.items(True, True)}

    first, *rest = sorted(batches)
    reference = entries(batches[first])
    for w in rest:
        mine = entries(batches[w])
        if mine != reference:
            differ = "; ".join(f"{key}: {reference.get(key, 'missing')} vs {mine.get(key, 'missing')}"
                               for key in sorted(set(mine) | set(reference)) if mine.get(key) != reference.get(key))
            raise SpecMismatchError(
                f"{owner}: {unit} {w}'s batches differ from {unit} {first}'s ((dtype, shape per step) in "
                f"{unit} {first} vs {unit} {w}: {differ}); all {unit}s' envs must share their specs.")


def loop_options(reset_at_each_iter: bool, max_frames_per_traj: int | None, exploration_type,
                 check_actions: bool, check_values: bool = False) -> dict:
    """The keyword arguments of :class:`~tdcollect.collectors.loop.BatchLoop` every collector passes on."""
    from torchrl.envs.utils import ExplorationType

    if not isinstance(exploration_type, ExplorationType):
        raise ValueError(f"exploration_type must be an ExplorationType ({', '.join(e.name for e in ExplorationType)})"
                         f", got {exploration_type!r}.")
    return {"reset_at_each_iter": bool(reset_at_each_iter), "max_frames_per_traj": max_frames_per_traj,
            "exploration_type": exploration_type, "check_actions": bool(check_actions),
            "check_values": bool(check_values)}
