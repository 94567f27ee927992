"""CollectorBase: iteration, frame counting, trajectory ids, episode statistics, progress, devices.

Subclasses implement ``_collect(random: bool) -> TensorDict [n_envs, T]`` (a TensorDict the caller may keep:
new or recycled memory from ``self._recycler``, or with ``return_same_td`` the same one every time),
``update_policy_weights_``, ``_policy_module`` and ``_shutdown``, and may override ``_shaped`` (TorchRL's batch
layout for their arguments, from ``[n_envs, T]``). TorchRL's per-batch arguments (``postproc``, ``replay_buffer``,
hooks, ...) are applied here, as :class:`~tdcollect.collectors.options.BatchOptions` says. The multi-process
collectors (MultiSync, MultiAsync, Ray) share
:func:`prepare_workers` and :func:`check_same_entries`.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time

import torch
from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector

from tdcollect.envs.engine.recycle import Recycler

from .buffer_writes import extend, write_batch
from .options import BatchOptions, rounded_steps
from .preemption import clear_steps_not_taken
from .stats import TRAJ_KEY, TrajectoryTracker, next_observation_keys
from .trajectories import TrajectoryAssembler


class CollectorBase:
    def __init__(self, frames_per_batch: int, total_frames: int, *, split_trajs: bool = False,
                 init_random_frames: int = 0, storing_device=None, progress_bar: bool = False,
                 return_same_td: bool = False, options: BatchOptions | None = None,
                 reset_at_each_iter: bool = False, compile_policy=None):
        if not isinstance(frames_per_batch, int) or isinstance(frames_per_batch, bool) or frames_per_batch < 1:
            raise ValueError(f"frames_per_batch must be a positive int, got {frames_per_batch!r}.")
        if total_frames is None or total_frames == 0 or (total_frames < 0 and total_frames != -1):
            raise ValueError(f"total_frames must be positive or -1 (endless), got {total_frames!r}.")
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.split_trajs = split_trajs
        self.init_random_frames = init_random_frames or 0
        self.options = options or BatchOptions()
        self.postproc = self.options.postproc
        self.replay_buffer = self.options.replay_buffer
        self.storing_device = None if storing_device is None else torch.device(storing_device)
        self.progress_bar = progress_bar
        self.return_same_td = bool(return_same_td)
        self._resets_each_batch = bool(reset_at_each_iter)
        #: TorchRL's switch (and name): entries whose key has a part starting with "_" are left out of batches
        self._exclude_private_keys = True
        # TorchRL's attributes for compile_policy (cudagraph_policy is refused on the CPU)
        self.compiled_policy = compile_policy is not None and compile_policy is not False
        self.compiled_policy_kwargs = dict(compile_policy) if isinstance(compile_policy, dict) else {}
        self.cudagraphed_policy = False
        self.cudagraphed_policy_kwargs = {}
        self._assembler: TrajectoryAssembler | None = None  # with trajs_per_batch, while iterating
        #: memory for the batches, reused once the caller holds no batch over it (``tdcollect/envs/recycle.py``)
        self._recycler = Recycler()
        self.frames = 0
        self.batches = 0
        self.episode_stats: dict = {}
        self._tracker: TrajectoryTracker | None = None
        #: the rows (among all envs) of the last batch, when it holds some envs only (async collectors)
        self._batch_rows: range | None = None
        #: bool [n_envs, T], the steps taken, when the last batch was preempted (``preemption.py``); else None
        self._taken: torch.Tensor | None = None
        self._closed = False
        self._in_use = threading.Lock()
        self._next_iter = None  # the iteration next() goes on with
        self._local_version = 0  # the policy's weights version, where the collector counts it itself
        self._background: threading.Thread | None = None  # start()'s collection
        self._background_error: BaseException | None = None
        self._running = threading.Event()
        self._stopping = False
        self._parked = threading.Event()  # the background collection waits in pause()

    steps_per_batch = staticmethod(rounded_steps)

    def iterator(self):
        """The batches, as ``iter(collector)`` gives them (TorchRL's name)."""
        return iter(self)

    def next(self):
        """The next batch of one iteration kept by the collector (TorchRL's ``next()``); ``None`` at the end."""
        if self._next_iter is None:
            self._next_iter = iter(self)
        return next(self._next_iter, None)

    #: where TorchRL runs pre_collect_hook / post_collect_hook: in this process (the batch yielded goes to the post
    #: hook), or, for the process collectors, in each worker (around its share of the batch)
    hooks_in_workers = False

    # TorchRL's hook attributes: settable after construction too
    pre_collect_hook = property(lambda self: self.options.pre_collect_hook,
                                lambda self, hook: self._set_hook("pre_collect_hook", hook))
    post_collect_hook = property(lambda self: self.options.post_collect_hook,
                                 lambda self, hook: self._set_hook("post_collect_hook", hook))

    def _set_hook(self, name: str, hook) -> None:
        setattr(self.options, name, hook)
        self._hooks_changed()

    def _hooks_changed(self) -> None:
        """The hooks were set anew (the process collectors send them to their workers)."""

    def start(self) -> None:
        """Collect in the background into the ``replay_buffer`` until :meth:`async_shutdown` (TorchRL's ``start``);
        :meth:`pause` holds the collection while its block runs."""
        if self.replay_buffer is None:
            raise RuntimeError(f"{type(self).__name__}.start() collects into a replay buffer: pass replay_buffer=.")
        if self._background is not None:
            raise RuntimeError(f"this {type(self).__name__} was started already.")
        self._running.set()
        self._background = threading.Thread(target=self._collect_in_background, daemon=True,
                                            name=f"{type(self).__name__}.start")
        self._background.start()

    def _collect_in_background(self) -> None:
        try:
            for _ in self:
                self._hold_while_paused()
                if self._closed or self._stopping:
                    return
        except BaseException as exc:  # noqa: BLE001 - kept and raised by async_shutdown in the caller's thread
            if not self._stopping:
                self._background_error = exc

    def _hold_while_paused(self) -> None:
        """In a :meth:`start`-ed collection, nothing reaches the replay buffer while :meth:`pause` holds (the
        background thread parks here, with the workers idle)."""
        if self._background is not None and threading.current_thread() is self._background:
            if not self._running.is_set():
                self._parked.set()
                self._running.wait()
                self._parked.clear()

    @contextlib.contextmanager
    def pause(self):
        """While the block runs, a collector :meth:`start`-ed collects no new batch and writes nothing: entering
        waits for the batch under way to finish, so the block may call the collector (``map_fn``, weights, ...)."""
        self._parked.clear()  # (a park from an earlier pause may not be cleared yet)
        self._running.clear()
        background = self._background
        while background is not None and background.is_alive() and not self._parked.wait(0.05):
            pass
        try:
            yield
        finally:
            self._running.set()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop a :meth:`start`-ed collection (the batch under way finishes), then :meth:`shutdown`; an error the
        background collection met is raised here."""
        self._stopping = True
        self._running.set()
        background, self._background = self._background, None
        if background is not None:
            background.join(timeout)
        self.shutdown()
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error

    def __iter__(self):
        if self._closed:
            raise self._shut_down_error()
        if self.options.trajs_per_batch is not None:
            yield from self._whole_trajectories(self._frame_batches())
            return
        for batch in self._frame_batches():
            if self.replay_buffer is None:
                yield batch
                continue
            self._hold_while_paused()
            write_batch(self.replay_buffer, batch, self._envs_per_buffer_write(), self.options.extend_buffer)
            yield None  # TorchRL's collectors yield None when the batch went into the replay buffer

    def _shut_down_error(self) -> RuntimeError:
        """The one error of a call on (or in flight during) a shut down collector."""
        return RuntimeError(f"this {type(self).__name__} is shut down (by shutdown(), or after a worker failure it "
                            "could not recover from); create a new one.")

    def _frame_batches(self):
        """The fixed-frame batches, each in TorchRL's layout and through TorchRL's per-batch steps (see
        :class:`BatchOptions`), before any replay buffer."""
        bar = self._make_bar()
        try:
            while self.total_frames == -1 or self.frames < self.total_frames:
                start = time.perf_counter()
                if self.options.update_at_each_batch:
                    self.update_policy_weights_()
                if self.options.pre_collect_hook is not None and not self.hooks_in_workers:
                    self.options.pre_collect_hook()
                if not self._in_use.acquire(blocking=False):
                    raise RuntimeError(f"two threads iterate this {type(self).__name__} at once; their batches "
                                       "would interleave. Iterate a collector from one thread.")
                try:
                    self._taken = None  # _collect sets it when the batch was preempted
                    batch = self._collect(self.frames < self.init_random_frames)
                finally:
                    self._in_use.release()
                if self._tracker is None:
                    self._tracker = TrajectoryTracker(batch.batch_size[0])
                taken = self._taken
                if taken is not None:
                    clear_steps_not_taken(batch, taken)
                self.episode_stats = self._tracker.annotate(batch, self._batch_rows, taken)
                frames = batch.numel() if taken is None else int(taken.sum())
                self.frames += frames
                self.batches += 1
                if bar is not None:
                    bar.update(frames)
                    bar.set_postfix(fps=f"{frames / (time.perf_counter() - start):,.0f}")
                if self.total_frames != -1 and self.frames >= self.total_frames:
                    self._collected_all()  # TorchRL's moment: before the last batch's postproc, hook and yield
                yield self._finish(self._in_torchrl_layout(batch))
        finally:
            if bar is not None:
                bar.close()

    def _collected_all(self) -> None:
        """Called once the total frames are collected, before the last batch is post-processed and yielded (where
        TorchRL's ``Collector`` closes its env: in the ``next()`` that returns that batch); not when the iteration is
        left early."""

    def _in_torchrl_layout(self, batch: TensorDictBase) -> TensorDictBase:
        """A collected batch ``[n_envs, T]`` (with trajectory ids) as TorchRL yields it for this collector's
        arguments: ``set_truncated``, ``compact_obs``, policy versions, ``track_traj_ids``, private keys left out,
        the layout of :meth:`_shaped` and the dim names."""
        if self.options.set_truncated:
            self._truncate_last_step(batch)
        if self.options.compact_obs:
            batch = batch.exclude(*next_observation_keys(batch))
        if self.options.track_policy_version:
            versions = self._frame_versions(batch.shape[0]).unsqueeze(-1).expand(batch.shape)
            batch.set("policy_version", versions.clone())
            batch.set(("next", "policy_version"), versions.clone())
        if not self.options.track_traj_ids:
            batch = batch.exclude(TRAJ_KEY)
            if not batch.get("collector").keys():
                batch = batch.exclude("collector")
        private = [key for key in batch.keys(True) if _is_private(key)] if self._exclude_private_keys else []
        if private:  # (a new TensorDict only then: return_same_td keeps yielding the same one)
            batch = batch.exclude(*private)
        batch = self._shaped(batch)
        batch.refine_names(..., "time")  # TorchRL's dim names: time is the last dim
        return batch

    def _finish(self, batch: TensorDictBase, hook: bool = True) -> TensorDictBase:
        """TorchRL's steps after a batch is collected (see :class:`BatchOptions`), but the replay buffer (and,
        without ``hook``, the ``post_collect_hook``)."""
        if self.split_trajs:
            from torchrl.collectors.utils import split_trajectories

            batch = split_trajectories(batch, prefix="collector")
        if self.storing_device is not None:
            batch = batch.to(self.storing_device)
        if self.postproc is not None:
            batch = self.postproc(batch)
        if hook and self.options.post_collect_hook is not None and not self.hooks_in_workers:
            self.options.post_collect_hook(batch)
        return batch

    def _whole_trajectories(self, frame_batches):
        """TorchRL's ``trajs_per_batch``: batches of whole trajectories (``collectors/trajectories.py``), or, with
        a replay buffer, every finished trajectory written flat into it (yielding ``None`` per frame batch)."""
        options = self.options
        self._assembler = TrajectoryAssembler(options.trajs_per_batch, options.traj_format, options.trajs_per_write)
        for batch in frame_batches:
            self._assembler.add(batch)
            if self._resets_each_batch and not options.set_truncated:
                self._assembler.drop_pending()  # the envs restart: those episodes never finish
            if self.replay_buffer is not None:
                self._hold_while_paused()
                for trajectory in self._assembler.writes():
                    extend(self.replay_buffer, trajectory)
                yield None
            else:
                yield from self._assembler.batches()

    def _envs_per_buffer_write(self) -> int | None:
        """The envs of one TorchRL write (one worker's env batch); None when the envs are stepped one by one."""
        return None

    @property
    def _weight_sync_schemes(self) -> dict:
        """TorchRL's name for how the policy's weights reach the workers: ``{"policy": scheme}``, the scheme
        passed or TorchRL's ``SharedMemWeightSyncScheme`` (what tdcollect's shared weights are); ``{}`` for a policy
        without weights."""
        if self.options.weight_sync_schemes is None:
            from torchrl.weight_update import SharedMemWeightSyncScheme

            has_weights = self._policy_module() is not None  # a stateless policy has nothing to send
            self.options.weight_sync_schemes = {"policy": SharedMemWeightSyncScheme()} if has_weights else {}
        return self.options.weight_sync_schemes

    # TorchRL's internal names that its own tools and tests read: read-only views of ours
    _frames = property(lambda self: self.frames)
    _iter = property(lambda self: self.batches - 1)  # TorchRL counts batches from -1
    _use_buffers = True  # batches go into preallocated (shared-memory) buffers where the env allows (stacked.py)

    # TorchRL's attribute names for the whole-trajectory arguments
    trajs_per_batch = property(lambda self: self.options.trajs_per_batch)
    trajs_per_write = property(lambda self: self.options.trajs_per_write)
    traj_format = property(lambda self: self.options.traj_format)

    @staticmethod
    def _truncate_last_step(batch: TensorDictBase) -> None:
        """TorchRL's ``set_truncated``: every trajectory is cut at the end of the batch (every ``truncated`` and
        ``done`` entry under ``"next"``, nested ones included)."""
        after = batch.get("next")
        for key in after.keys(True, True):
            name = key[-1] if isinstance(key, tuple) else key
            if name in ("truncated", "done"):
                after.get(key)[:, -1] = True

    def _shaped(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch in TorchRL's layout for this collector's arguments (``[n_envs, T]`` here)."""
        return batch

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every env (env i gets the i-th seed of TorchRL's chain: ``seed``, ``seed_generator(seed)``, ...;
        all of them ``seed`` with ``static_seed``); every episode restarts. Returns the seed that follows the
        last env's, as TorchRL's collectors do (to seed what comes next)."""
        out = self._set_seed(int(seed), bool(static_seed))
        self._restart_trajectories()
        return out

    def _set_seed(self, seed: int, static_seed: bool) -> int:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """TorchRL's collector checkpoint: ``{"policy_state_dict": ..., "frames": int, "iter": int, "traj_pool":
        {"traj_id": the last trajectory id given}}`` (``iter`` as TorchRL counts it: batches - 1; the policy entry
        when the policy is an ``nn.Module``)."""
        last_id = self._tracker.next_id - 1 if self._tracker is not None else -1
        state = {"frames": self.frames, "iter": self.batches - 1, "traj_pool": {"traj_id": torch.tensor(last_id)}}
        if self.options.track_policy_version:
            state["policy_version"] = self.policy_version
        module = self._policy_module()
        if module is not None:
            state["policy_state_dict"] = module.state_dict()
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restore what :meth:`state_dict` saved: frame and batch counts, and the policy's weights (every worker
        acts with them from the next batch on)."""
        module = self._policy_module()
        if "policy_state_dict" in state_dict:
            if module is None:
                raise ValueError(f"{type(self).__name__}: the state dict holds policy weights but this collector's "
                                 "policy has none (it is not an nn.Module).")
            module.load_state_dict(state_dict["policy_state_dict"], strict=strict)
            self.update_policy_weights_()
        elif strict and module is not None:
            raise KeyError(f"{type(self).__name__}: the state dict has no 'policy_state_dict' (strict=True).")
        if self.options.track_policy_version and "policy_version" in state_dict:
            self._restore_version(int(state_dict["policy_version"]))
        self.frames = int(state_dict.get("frames", self.frames))
        self.batches = int(state_dict.get("iter", self.batches - 1)) + 1
        if "traj_pool" in state_dict:  # the envs go on with new trajectories, numbered after the saved ones
            self._tracker = TrajectoryTracker(self._envs_count())
            self._tracker.next_id = int(state_dict["traj_pool"]["traj_id"]) + 1
            self._tracker.restart(range(self._envs_count()))

    def _policy_module(self):
        return None

    def _envs_count(self) -> int:
        """How many envs the collector steps (rows of its batches before TorchRL's layout)."""
        raise NotImplementedError

    def stats(self) -> dict:
        """TorchRL's progress snapshot (plain numbers, JSON-serialisable, safe from any thread): ``frames``,
        ``batches``, ``total_frames`` and ``completed`` (when the collector is not endless),
        ``requested_frames_per_batch``, ``policy_version``."""
        out = {"frames": int(self.frames), "batches": int(self.batches),
               "requested_frames_per_batch": int(self.frames_per_batch), "policy_version": int(self.policy_version)}
        if self.total_frames != -1:
            out.update(total_frames=int(self.total_frames), completed=self.frames >= self.total_frames)
        return out

    @property
    def policy_version(self) -> int:
        """The version of the policy's weights: 0 at first, one more for every weight update."""
        return self._local_version

    def get_policy_version(self) -> int:
        return self.policy_version

    def increment_version(self) -> None:
        self._local_version += 1

    def _restore_version(self, version: int) -> None:
        self._local_version = version

    def _frame_versions(self, n_envs: int) -> torch.Tensor:
        """int64 ``[n_envs]``: the weights version each env of the last batch was stepped with."""
        return torch.full((n_envs,), self.policy_version, dtype=torch.int64)

    def _restart_trajectories(self, rows=None) -> None:
        """The envs in ``rows`` (default: all) start new episodes: new trajectory ids, returns and lengths
        counted from zero."""
        if self._tracker is not None:
            rows = range(len(self._tracker.current)) if rows is None else rows
            if self._assembler is not None:  # their unfinished episodes never finish
                self._assembler.drop_pending(self._tracker.current[list(rows)].tolist())
            self._tracker.restart(rows)

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

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Stop everything the collector started; idempotent (TorchRL's arguments are accepted: workers get a few
        seconds to leave, then are killed; the envs the collector built are always closed, and ``Collector`` closes
        an env given to it as an instance unless ``close_env=False``)."""
        if self._closed:
            return
        if self._background is not None and threading.current_thread() is not self._background:
            self._stopping = True
            self._running.set()
            self._background.join(timeout)
            self._background = None
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


# a virtual subclass of TorchRL's base (an ABC): TorchRL's code that checks ``isinstance(collector, BaseCollector)``
# before it uses one (its trainers and their hydra configs) takes ours, as it takes its own
BaseCollector.register(CollectorBase)


def _is_private(key) -> bool:
    return any(part.startswith("_") for part in ((key,) if isinstance(key, str) else key))
