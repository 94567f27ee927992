"""MultiSyncCollector: N worker processes, each a collector loop over its own env and policy copy
(``worker.py``), writing into shared batch storage; the main process gathers one batch from all of them per
iteration. The messages between them are part of the worker protocol (``tdcollect/envs/protocol.py``).

Workers are idle while the main process uses a batch, so a weight update reaches every worker before the
next batch (synchronous, on-policy collection).
"""
from __future__ import annotations

import gc

import torch
from tensordict import TensorDictBase
from torchrl.envs.utils import ExplorationType

from tdcollect.envs.errors import WorkerError
from tdcollect.envs.group import seed_chain
from tdcollect.envs.platform_policy import exit_if_bootstrapping, resolve_start_method
from tdcollect.envs.pool import WorkerPool
from tdcollect.envs.protocol import COLLECT, COLLECT_RANDOM
from tdcollect.envs.shared import in_shared_memory
from tdcollect.envs.specs import agreed_specs

from .base import CollectorBase, check_same_entries, loop_options, prepare_workers
from .loop import DEFAULT_EXPLORATION_TYPE
from .weights import SharedWeights
from .worker import run_collector_worker

OWNER = "MultiSyncCollector"


class StorageHandshake:
    """MultiSyncCollector's half of the start-up handshake (``protocol.py``): the workers' envs must have
    the same specs (a restarted worker's too); from their env counts, ``T = frames_per_batch / total envs``
    (first start; a restarted worker must have as many envs as before); each worker's storage
    ``[n_envs, T]`` must hold the same entries as the others'."""

    def __init__(self, frames_per_batch: int):
        self.frames_per_batch = frames_per_batch
        self.envs_per_worker: list[int] = []
        self.steps: int | None = None
        self.specs = None
        self.storages: dict[int, TensorDictBase] = {}

    def setup(self, infos: dict[int, tuple]) -> dict[int, int]:
        self.specs = agreed_specs(self.specs, {w: specs for w, (_, specs) in infos.items()},
                                  "All workers of one MultiSyncCollector must build envs with the same specs.")
        infos = {w: n_envs for w, (n_envs, _) in infos.items()}
        if self.steps is None:
            self.envs_per_worker = [infos[w] for w in sorted(infos)]
            self.steps = CollectorBase.steps_per_batch(self.frames_per_batch, sum(self.envs_per_worker), OWNER)
        for w, n_envs in infos.items():
            if n_envs != self.envs_per_worker[w]:
                raise ValueError(f"{OWNER}: restarted worker {w} has {n_envs} envs, not "
                                 f"{self.envs_per_worker[w]} as before; constructors must build the same envs "
                                 "every time.")
        return {w: self.steps for w in infos}

    def ready(self, replies: dict[int, TensorDictBase]) -> None:
        self.storages.update(replies)
        check_same_entries(self.storages, OWNER, "worker")


class MultiSyncCollector(CollectorBase):
    """Yields TensorDicts ``[n_envs, T]`` gathered from ``num_workers`` processes (TorchRL keys, time last,
    ``("collector", "traj_ids")``), ``n_envs`` being the sum of the workers' envs.

    Args:
        create_env_fn: a list of env constructors, one per worker (or one constructor and ``num_workers``);
            a constructor may return a gymnasium env, a TorchRL env, a ``SerialEnv`` or a ``ParallelEnv``.
        policy: as for :class:`~tdcollect.collectors.Collector`; each worker gets a copy whose weights live in shared
            memory (see :meth:`update_policy_weights_`).
        frames_per_batch, total_frames, device, env_device, policy_device, storing_device, split_trajs,
        reset_at_each_iter, init_random_frames, max_frames_per_traj, progress_bar, exploration_type: as in
        TorchRL (``exploration_type`` default ``ExplorationType.RANDOM``, applied in every worker).
        check_actions, check_values: as for :class:`~tdcollect.collectors.Collector`.
        mp_start_method, timeout: as for :class:`~tdcollect.envs.ParallelEnv`.
        max_restarts: how many times in all a worker that died, hung or raised may be replaced by a fresh one
            (opt-in; default 0). The replacement collects that worker's part of the batch again, its envs
            start new episodes with new trajectory ids; a warning is issued and ``restarts`` counts them.
            Past the limit (or without it) the error propagates and the collector is shut down.
        return_same_td: opt-in, as for :class:`~tdcollect.collectors.Collector`: the same TensorDict every time,
            overwritten by the next batch. By default every batch is the caller's to keep.
    """

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, create_env_kwargs=None, device=None, env_device=None,
                 policy_device=None, storing_device=None, split_trajs: bool = False,
                 reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 mp_start_method: str | None = None, timeout: float = 300.0, max_restarts: int = 0,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool = True,
                 check_values: bool = False,
                 return_same_td: bool = False):
        exit_if_bootstrapping()
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device, progress_bar=progress_bar,
                         return_same_td=return_same_td)
        self._same: TensorDictBase | None = None  # the batch yielded every time with return_same_td
        pickled, payload, module = prepare_workers(create_env_fn, policy, num_workers, create_env_kwargs,
                                                   env_device, OWNER, "worker")
        self.policy = policy
        self.num_workers = num_workers = len(pickled)
        self.max_restarts = int(max_restarts)
        self._weights = SharedWeights(module) if module is not None else None
        self._versions_tensor = in_shared_memory(torch.full((num_workers,), -1, dtype=torch.int64), "the versions")
        config = {"policy_device": policy_device or device, "loop": loop_options(
            reset_at_each_iter, max_frames_per_traj, exploration_type, check_actions, check_values)}
        self._handshake = StorageHandshake(frames_per_batch)
        self._pool = WorkerPool(
            run_collector_worker,
            [(factory, payload, self._weights, self._versions_tensor, config) for factory in pickled],
            handshake=self._handshake, start_method=resolve_start_method(mp_start_method), timeout=timeout,
            owner=OWNER, preload=set().union(*(factory.imports for factory in pickled)),
        )
        self.envs_per_worker = self._handshake.envs_per_worker

    def _collect(self, random: bool) -> TensorDictBase:
        """Run one collection on every worker. Failed workers are replaced while ``max_restarts`` allows and
        their share of the batch is collected again (the batch is always full); otherwise — and on Ctrl-C —
        the collector shuts down before the error propagates."""
        code = COLLECT_RANDOM if random else COLLECT
        workers = list(range(self.num_workers))
        while workers:
            try:
                self._pool.run(code, workers)
                workers = []
            except WorkerError as err:
                try:
                    workers = self._pool.replace_failed(err, self.max_restarts)
                except BaseException:
                    self.shutdown()
                    raise
                if workers is None:
                    self.shutdown()
                    raise
                for w in workers:  # their envs start new episodes (and new trajectory ids)
                    first = sum(self.envs_per_worker[:w])
                    self._restart_trajectories(range(first, first + self.envs_per_worker[w]))
            except KeyboardInterrupt:
                self.shutdown()
                raise
        parts = [self._handshake.storages[w] for w in range(self.num_workers)]
        if not self.return_same_td:
            return self._recycler.cat(parts, 0)
        if self._same is None:
            self._same = torch.cat(parts, 0)
        else:  # the keys the collector adds to a batch (trajectory ids) are not the workers'
            torch.cat(parts, 0, out=self._same.select(*parts[0].keys(True, True)))
        return self._same

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return list(self._pool.restarts)

    def set_seed(self, seed: int) -> None:
        """Env i (counted over all workers) gets the i-th seed of TorchRL's chain (``seed``,
        ``seed_generator(seed)``, ...: see ``EnvGroup.set_seed``), worker w's torch RNG the seed of its first env;
        every episode restarts."""
        seeds = seed_chain(seed, sum(self.envs_per_worker))
        firsts = [sum(self.envs_per_worker[:w]) for w in range(self.num_workers)]
        self._pool.call("set_seed", [(seeds[first],) for first in firsts])
        self._restart_trajectories()

    def update_policy_weights_(self, policy_weights=None) -> None:
        """Copy the policy's current weights (or ``policy_weights``, a TensorDict) into the shared copy;
        every worker acts with them from the next batch on (see ``weight_versions``)."""
        if self._weights is None:
            return
        self._weights.publish(policy_weights if policy_weights is not None else self.policy)

    @property
    def weight_versions(self) -> list[int]:
        """The weights version each worker acted with in the last batch (0 = the initial weights)."""
        return self._versions_tensor.tolist()

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids

    def _shutdown(self) -> None:
        pool, handshake = self.__dict__.get("_pool"), self.__dict__.get("_handshake")
        if pool is not None:
            pool.stop()
        if handshake is not None:
            handshake.storages.clear()
        if "_versions_tensor" in self.__dict__:  # a private copy: weight_versions still answers
            self._versions_tensor = self._versions_tensor.clone()
        self._same = self._weights = None
        gc.collect(1)  # tensordict views form young reference cycles; collect them so the memory goes now

