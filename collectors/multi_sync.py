"""MultiSyncCollector: N worker processes, each a collector loop over its own env and policy copy, writing
into shared batch storage; the main process gathers one batch from all of them per iteration.

Worker protocol (on top of ``envs.pool``; one docstring, every message)::

    STARTING  builds its env from the cloudpickled constructor and its policy copy (bound to the shared
              weights when it runs on the CPU)   -> ("envs", n_envs)        or ("error", report), exit 1
              <- ("steps", T)                     allocates its storage [n_envs, T] in shared memory
              -> ("storage", storage)             (sent once; the main process keeps the shared views)
    IDLE      blocks on its ``wake`` semaphore
    COLLECT / COLLECT_RANDOM
              fills its storage with the next T steps (policy / random actions), records the weights version
              it acted with in ``versions[w]``; then OK or FAILED + report; releases ``done``
    CLOSE     closes its env and exits

Workers are idle while the main process uses a batch, so a weight update reaches every worker before the
next batch (synchronous, on-policy collection).
"""
from __future__ import annotations

import cloudpickle
import torch
from tensordict import TensorDict, TensorDictBase

from tdcollect.envs.errors import WorkerError
from tdcollect.envs.factories import PickledFactory, resolve_factories
from tdcollect.envs.pool import WorkerChannel, WorkerPool, exit_if_bootstrapping, resolve_start_method

from .base import CollectorBase
from .env_setup import build_worker
from .loop import BatchLoop
from .policies import policy_module
from .single import _check_env_device
from .weights import SharedWeights

COLLECT, COLLECT_RANDOM = 1, 2
COMMAND_NAMES = {COLLECT: "collection", COLLECT_RANDOM: "collection (random actions)"}


def run_collector_worker(channel: WorkerChannel, factory, policy_payload, weights, versions, config) -> None:
    channel.start()
    env = None
    try:
        env, policy, module = build_worker(factory, policy_payload, config["policy_device"], "MultiSyncCollector")
        on_cpu = config["policy_device"] is None or torch.device(config["policy_device"]).type == "cpu"
        if weights is not None and on_cpu:
            weights.bind(module)
        local_params = TensorDict.from_module(module).data if weights is not None and not on_cpu else None
    except BaseException as exc:  # noqa: BLE001 - reported to the main process
        if env is not None:
            env.close()
        channel.fail_start(exc)
    try:
        channel.conn.send(("envs", env.batch_size.numel()))
        message = channel.receive()
        if message is None:
            return
        _, steps = message
        loop = BatchLoop(env, policy, steps, shared=True, reset_at_each_iter=config["reset_at_each_iter"],
                         max_frames_per_traj=config["max_frames_per_traj"], inference_mode=True)
        channel.conn.send(("storage", loop.storage))
        seen = [-1]

        def collect(random: bool) -> None:
            if local_params is not None:
                seen[0] = weights.pull(local_params, seen[0])
            elif weights is not None:
                seen[0] = int(weights.version)
            versions[channel.index] = seen[0]
            loop.collect(random)

        channel.serve({COLLECT: lambda: collect(False), COLLECT_RANDOM: lambda: collect(True)}, loop,
                      COMMAND_NAMES)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass
    finally:
        env.close()


class MultiSyncCollector(CollectorBase):
    """Yields TensorDicts ``[n_envs, T]`` gathered from ``num_workers`` processes (TorchRL keys, time last,
    ``("collector", "traj_ids")``), ``n_envs`` being the sum of the workers' envs.

    Args:
        create_env_fn: a list of env constructors, one per worker (or one constructor and ``num_workers``);
            a constructor may return a gymnasium env, a TorchRL env, a ``SerialEnv`` or a ``ParallelEnv``.
        policy: as for :class:`~tdcollect.collectors.Collector`; each worker gets a copy whose weights live in shared
            memory (see :meth:`update_policy_weights_`).
        frames_per_batch, total_frames, device, env_device, policy_device, storing_device, split_trajs,
        reset_at_each_iter, init_random_frames, max_frames_per_traj, progress_bar: as in TorchRL.
        mp_start_method, timeout: as for :class:`~tdcollect.envs.ParallelEnv`.
        max_restarts: how many times in all a worker that died, hung or raised may be replaced by a fresh one
            (opt-in; default 0). The replacement collects that worker's part of the batch again, its envs
            start new episodes with new trajectory ids; a warning is issued and ``restarts`` counts them.
            Past the limit (or without it) the error propagates and the collector is shut down.
    """

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, create_env_kwargs=None, device=None, env_device=None,
                 policy_device=None, storing_device=None, split_trajs: bool = False,
                 reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 mp_start_method: str | None = None, timeout: float = 300.0, max_restarts: int = 0):
        exit_if_bootstrapping()
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device, progress_bar=progress_bar)
        _check_env_device(env_device, "MultiSyncCollector")
        if num_workers is None:
            num_workers = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else 1
        factories = resolve_factories(create_env_fn, num_workers, create_env_kwargs, "MultiSyncCollector",
                                      "num_workers")
        pickled = [PickledFactory(fn, "MultiSyncCollector", f"worker {w}") for w, fn in enumerate(factories)]
        self.policy = policy
        module = policy_module(policy) if policy is not None else None
        self._weights = SharedWeights(module) if module is not None else None
        self._versions_tensor = torch.full((num_workers,), -1, dtype=torch.int64).share_memory_()
        payload = cloudpickle.dumps(policy) if policy is not None else None
        config = {"policy_device": policy_device or device, "reset_at_each_iter": reset_at_each_iter,
                  "max_frames_per_traj": max_frames_per_traj}
        self.num_workers = num_workers
        self.max_restarts = int(max_restarts)
        self._pool = WorkerPool(
            run_collector_worker,
            [(factory, payload, self._weights, self._versions_tensor, config) for factory in pickled],
            start_method=resolve_start_method(mp_start_method), timeout=timeout, owner="MultiSyncCollector",
            command_names=COMMAND_NAMES,
        )
        try:
            self.envs_per_worker = self._pool.receive_all("construction")
            steps = self.steps_per_batch(frames_per_batch, sum(self.envs_per_worker), "MultiSyncCollector")
            self._steps = steps
            self._pool.send_all(("steps", steps))
            self._storages = self._pool.receive_all("start-up")
            _check_same_keys(self._storages)
        except BaseException:
            self._pool.stop()
            raise

    def _collect(self, random: bool) -> TensorDictBase:
        """Run one collection on every worker. A failed worker is replaced while ``max_restarts`` allows and
        its share of the batch is collected again (the batch is always full); otherwise — and on Ctrl-C —
        the collector shuts down before the error propagates."""
        code = COLLECT_RANDOM if random else COLLECT
        workers = list(range(self.num_workers))
        while workers:
            try:
                self._pool.run(code, workers)
                workers = []
            except WorkerError as err:
                failures = self._pool.replaceable(err, self.max_restarts)
                if failures is None:
                    self.shutdown()
                    raise
                workers = sorted(failures)
                self._restart(failures)
            except KeyboardInterrupt:
                self.shutdown()
                raise
        return torch.cat(self._storages, 0)

    def _restart(self, failures: dict) -> None:
        """Replace the failed workers; their envs start new episodes (and new trajectory ids)."""
        try:
            for w in sorted(failures):
                self._pool.restart(w, failures[w])
                n_envs = self._pool.receive(w, "construction")
                if n_envs != self.envs_per_worker[w]:
                    raise ValueError(f"MultiSyncCollector: restarted worker {w} has {n_envs} envs, "
                                     f"not {self.envs_per_worker[w]} as before.")
                self._pool.conns[w].send(("steps", self._steps))
                self._storages[w] = self._pool.receive(w, "start-up")
                first = sum(self.envs_per_worker[:w])
                self._restart_trajectories(range(first, first + n_envs))
        except BaseException:
            self.shutdown()
            raise

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return list(self._pool.restarts)

    def set_seed(self, seed: int) -> None:
        """Env i (counted over all workers) gets ``seed + i``, worker w's torch RNG ``seed + first env of w``;
        every episode restarts."""
        firsts = [sum(self.envs_per_worker[:w]) for w in range(self.num_workers)]
        self._pool.call("set_seed", [(seed + first,) for first in firsts])
        self._restart_trajectories()

    def update_policy_weights_(self, policy_weights=None) -> None:
        """Copy the policy's current weights (or ``policy_weights``, a TensorDict) into the shared copy;
        every worker acts with them from the next batch on (see ``weight_versions``)."""
        if self._weights is None:
            return
        self._weights.publish(policy_weights if policy_weights is not None else policy_module(self.policy))

    @property
    def weight_versions(self) -> list[int]:
        """The weights version each worker acted with in the last batch (0 = the initial weights)."""
        return self._versions_tensor.tolist()

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids

    def _shutdown(self) -> None:
        self._pool.stop()
        self._storages = []


def _check_same_keys(storages: list[TensorDictBase]) -> None:
    reference = set(storages[0].keys(True, True))
    for w, storage in enumerate(storages[1:], start=1):
        keys = set(storage.keys(True, True))
        if keys != reference:
            raise ValueError(
                f"MultiSyncCollector: worker {w}'s batches have other keys than worker 0's "
                f"(only in worker 0: {sorted(map(str, reference - keys))}; only in worker {w}: "
                f"{sorted(map(str, keys - reference))}); all workers' envs must share their specs."
            )
