"""Collector: one batched env and a policy in this process (the central-inference path with a ParallelEnv:
one batched policy forward per step, on a GPU if asked)."""
from __future__ import annotations

import functools

import torch
from tensordict import TensorDictBase
from torchrl.envs.utils import ExplorationType

from tdcollect.envs.batched import stands_in_for_torchrl

from .base import CollectorBase
from .loop import DEFAULT_EXPLORATION_TYPE, BatchLoop, loop_options
from .options import compiled, torchrl_options
from .policies import draw_as_torchrl_at_construction, make_policy, one_policy, policy_module, with_exploration_specs
from .policy_transforms import with_policy_transforms
from .preemption import steps_taken_mask
from .remote_calls import LocalCalls
from .stacked import reshape_leading
from .stats import TRAJ_KEY
from .weights import policy_weights_of, requested_weights
from .worker import check_env_device, make_batched_env


class Collector(LocalCalls, CollectorBase):
    """Yields TensorDicts ``[*env.batch_size, T]`` with ``n_envs * T == frames_per_batch`` (TorchRL keys and layout,
    time last, ``("collector", "traj_ids")``; an unbatched env gives ``[T]``, as in TorchRL); consecutive batches
    continue the same episodes.

    ``Collector(..., num_collectors=N, sync=True|False)`` (or ``backend="process"``) is TorchRL's entry point for
    process collectors: it returns a :class:`~tdcollect.collectors.MultiSyncCollector` (``sync=True``) or a
    :class:`~tdcollect.collectors.MultiAsyncCollector` (``sync=False``, TorchRL's default) over ``N`` workers.

    Args:
        create_env_fn: a batched env (``ParallelEnv``, ``SerialEnv``, any TorchRL env with one batch dim), a
            gymnasium or unbatched TorchRL env, or a function returning one of these (called with
            ``create_env_kwargs``).
        policy: a ``TensorDictModule`` / TorchRL actor, an ``nn.Module`` (observation -> action), a callable
            on a TensorDict, or ``None`` (random actions); or ``policy_factory``, a function returning one.
        frames_per_batch: frames per yielded batch (rounded up to a multiple of the number of envs, with
            TorchRL's warning).
        total_frames: frames to collect in all (-1: endless).
        device: default for ``policy_device`` and ``storing_device``; ``env_device`` must be the CPU.
        policy_device: where the policy runs (inputs go there through pinned memory, actions come back; the
            TensorDicts the policy sees carry that device, the CPU too).
        storing_device: where yielded batches live (default: ``device``, else ``env_device`` when it is the
            ``policy_device``, else none: batches without a device, as TorchRL's).
        exploration_type: the interaction type the policy runs under, as in TorchRL (default
            ``ExplorationType.RANDOM``: a ``ProbabilisticActor`` samples its actions).
        check_actions: check every step's actions against the action spec before they reach the envs (default
            True: shape and dtype, integer and one-hot actions in range, no NaN/inf; values outside the spec go
            to the envs unchanged, as in TorchRL's collectors, with a ``UserWarning``; ``"raise"``: a
            ``ValueError`` instead; ``"bounds"``: the bounds of continuous specs too, raising); False checks the
            first step's shapes and dtypes only.
        check_values: opt-in (default False): a batch whose observations or rewards hold NaN or an infinity is a
            ``ValueError`` naming the env and the key (shapes, ``None`` and values that do not fit the buffers'
            dtypes are refused always).
        progress_bar: show a tqdm bar with frames/s.
        return_same_td: as in TorchRL, opt-in: yield the same TensorDict every time, its values overwritten by the
            next batch (no copy at all). By default every batch is the caller's to keep: it is never written again
            (its memory is reused only once nothing holds it any more).

    TorchRL's other arguments keep their meaning: ``split_trajs``, ``reset_at_each_iter``, ``init_random_frames``,
    ``max_frames_per_traj``, ``postproc``, ``replay_buffer``, ``extend_buffer``, ``set_truncated``,
    ``track_traj_ids``, ``pre_collect_hook``, ``post_collect_hook``, ``compile_policy``, ``trust_policy``,
    ``no_cuda_sync``, ``compact_obs``, ``use_buffers`` (either value: the same batches), ``interruptor``
    (``preemption.py``); ``collectors/options.py`` lists the few TorchRL arguments refused, each with its reason.

    After each batch, ``episode_stats`` holds ``returns`` and ``lengths`` of the episodes that ended in it.
    """

    def __new__(cls, *args, backend=None, num_collectors=None, sync=None, **kwargs):
        # (a class standing in for TorchRL's under tdcollect run dispatches as Collector itself)
        if ((cls is not Collector and not stands_in_for_torchrl(cls))
                or (backend in (None, "direct") and num_collectors is None)):
            if backend not in (None, "direct") or sync is not None:
                raise ValueError(f"{cls.__name__}: backend, num_collectors and sync choose process collectors; "
                                 "pass num_collectors=N to Collector itself (sync=True for a MultiSyncCollector).")
            return super().__new__(cls)
        from .dispatch import process_collector

        return process_collector(args, kwargs, backend, num_collectors, sync)

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 device=None, env_device=None, policy_device=None, storing_device=None,
                 split_trajs: bool = False, reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool | str = True,
                 check_values: bool = False, return_same_td: bool = False, create_env_kwargs: dict | None = None,
                 policy_factory=None, compile_policy=None, backend=None, num_collectors=None, sync=None,
                 auto_register_policy_transforms: bool | None = None, worker_idx: int | None = None,
                 interruptor=None, **torchrl_kwargs):
        options = torchrl_options("Collector", split_trajs=split_trajs, return_same_td=return_same_td,
                                  **torchrl_kwargs)
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device or same_device(env_device, policy_device),
                         progress_bar=progress_bar,
                         return_same_td=return_same_td, options=options, reset_at_each_iter=reset_at_each_iter,
                         compile_policy=compile_policy)
        check_env_device(env_device, "Collector")
        self.worker_idx = worker_idx  # TorchRL's label for a collector that is one worker of several
        if interruptor is not None and not callable(getattr(interruptor, "collection_stopped", None)):
            raise TypeError("Collector: interruptor must have a collection_stopped() method (TorchRL's interruptor), "
                            f"got {type(interruptor).__name__}.")
        self.interruptor = interruptor
        policy = one_policy(policy, policy_factory, "Collector")
        if create_env_kwargs and callable(create_env_fn) and not hasattr(create_env_fn, "batch_size"):
            create_env_fn = functools.partial(create_env_fn, **create_env_kwargs)
        self.env, self._owns_env, self._unbatched = make_batched_env(create_env_fn, "Collector")
        try:
            self.env = with_policy_transforms(self.env, policy, auto_register_policy_transforms, "Collector")
            policy = with_exploration_specs(policy, self.env)
            steps = self.steps_per_batch(frames_per_batch, self.env.batch_size.numel(), "Collector")
            wrapped = self._unbatched and bool(self.env.batch_size)  # (with batch [1]: see make_batched_env)
            self.policy = compiled(make_policy(policy, self.env.full_action_spec, policy_device or device,
                                               self.env.full_observation_spec, wrapped), compile_policy)
            self._module = policy_module(policy) if policy is not None else None
            self._loop = BatchLoop(self.env, self.policy, steps, interruptor=interruptor, **loop_options(
                reset_at_each_iter, max_frames_per_traj, exploration_type, check_actions, check_values),
                clear_device=same_device(env_device or device, policy_device or device) is None)
            draw_as_torchrl_at_construction(policy, self.policy, self.env, self._loop.root, wrapped,
                                            buffers=not self._loop.stacked)
        except BaseException:
            self._shutdown()
            raise

    def _collect(self, random: bool) -> TensorDictBase:
        batch = self._loop.collect(random)
        if self._loop.steps_taken < self._loop.steps:  # stopped by the interruptor (see preemption.py)
            self._taken = steps_taken_mask(torch.full((batch.shape[0],), self._loop.steps_taken), batch.shape[1])
        if self._loop.stacked:  # a new stack of new TensorDicts each batch
            return batch
        return batch if self.return_same_td else self._recycler.clone(batch)

    def _shaped(self, batch: TensorDictBase) -> TensorDictBase:
        if self.storing_device is None and batch.device is not None:  # TorchRL's: no storing device, no device
            batch.clear_device_()
        if self._unbatched:
            return batch[0]
        if len(self.env.batch_size) == 1:
            return batch
        return reshape_leading(batch, 1, tuple(self.env.batch_size))  # [*env batch, T], as TorchRL

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled TensorDict shaped like one batch (TorchRL's method): the keys, dtypes, batch size and dim
        names of ``next(iter(collector))`` for this collector's arguments, without stepping the env."""
        batch = self._loop.storage.clone().zero_()
        batch.set(TRAJ_KEY, torch.zeros(batch.shape, dtype=torch.int64))
        return self._finish(self._in_torchrl_layout(batch), hook=False)

    def _envs_per_buffer_write(self) -> int | None:
        return None if self._unbatched else self.env.batch_size.numel()

    def _set_seed(self, seed: int, static_seed: bool) -> int:
        return self._loop.set_seed(seed, static_seed)

    def reset(self, index=None) -> None:
        """Start new episodes in every env (TorchRL's ``Collector.reset``; ``index`` is not supported)."""
        if index is not None:
            raise ValueError("Collector.reset(index) is not supported; reset() restarts every env.")
        self._loop.reset_envs()
        self._restart_trajectories()

    def _policy_module(self):
        return self._module

    def _envs_count(self) -> int:
        return self.env.batch_size.numel()

    def update_policy_weights_(self, policy_weights=None, **kwargs) -> None:
        """The policy runs in this process, so it always acts with its current weights; with
        ``policy_weights`` (a TensorDict or a module of the same structure; TorchRL's ``policy_or_weights``),
        those are copied into it first."""
        policy_weights = requested_weights(policy_weights, kwargs)
        if policy_weights is not None:
            policy_weights_of(self._module if self._module is not None else self.policy).update_(
                policy_weights_of(policy_weights))
        self.increment_version()

    def _collected_all(self) -> None:
        """TorchRL's collector closes its env once the total frames are collected, inside the ``next()`` that
        returns the last batch (a later use of the env starts it again); so does this one, at the same moment (the
        process-wide state a close restores, e.g. torch's threads, is TorchRL's for the last batch's update)."""
        if not self.env.is_closed:
            self.env.close()

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Stop the collector and close its env, as TorchRL's does: an env given as an instance is closed too
        (``close_env=False`` leaves it open; an env the collector built from a constructor is always closed).
        Idempotent; garbage collection of the collector calls it with the defaults, as TorchRL's."""
        self._closes_given_env = close_env
        super().shutdown(timeout, close_env, raise_on_error)

    def _shutdown(self) -> None:
        loop = self.__dict__.get("_loop")
        if loop is not None:
            loop.finish_profile()
        closes = self.__dict__.get("_owns_env") or self.__dict__.get("_closes_given_env", False)
        if closes and not self.env.is_closed:
            self.env.close()


def same_device(env_device, policy_device):
    """TorchRL's storing device when neither ``storing_device`` nor ``device`` is given: the env's and the policy's
    device when they are one (else None: the batches carry no device, and the policy sees the env's TensorDicts
    without one, as TorchRL's collector clears it then)."""
    if env_device is None or policy_device is None or torch.device(env_device) != torch.device(policy_device):
        return None
    return torch.device(env_device)
