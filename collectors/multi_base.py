"""ProcessCollector: what MultiSyncCollector and MultiAsyncCollector share — N worker processes, each a
collector loop over its own env and policy copy (``worker.py``), writing into its own batch storage in shared
memory; weights shared with them; worker restarts; seeding; shutdown. The messages between them are part of
the worker protocol (``tdcollect/envs/protocol.py``).

The subclasses say when workers collect: all at once, one batch from all of them (sync), or each on its own,
one batch per worker as it finishes (async).
"""
from __future__ import annotations

import cloudpickle
import torch
from tensordict import TensorDictBase
from torchrl.envs.utils import ExplorationType

from tdcollect.envs.engine.errors import EnvWorkerError, WorkerError
from tdcollect.envs.engine.group import seed_chain
from tdcollect.envs.engine.platform_policy import (
    CALLER_THREADS,
    built_on_cpu,
    exit_if_bootstrapping,
    resolve_start_method,
)
from tdcollect.envs.engine.pool import WorkerPool
from tdcollect.envs.engine.shared import forget_caches, in_shared_memory
from tdcollect.envs.engine.specs import agreed_specs

from .base import CollectorBase
from .loop import DEFAULT_EXPLORATION_TYPE, loop_options
from .options import one_device, per_worker_frames, rounded_steps, torchrl_options
from .policies import UNWRAPPABLE, runs_cuda
from .preemption import StopFlag, checked_threshold
from .remote_calls import WorkerCalls
from .weights import SharedWeights, policy_weights_of, requested_weights
from .worker import check_same_entries, prepare_workers, run_collector_worker


class StorageHandshake:
    """The main process' half of the start-up handshake (``protocol.py``): the workers' envs must have the same
    specs (a restarted worker's too); each worker collects ``T`` steps per batch — ``frames_per_batch`` over
    all workers' envs (``per_worker=False``: one batch from all) or over its own (``per_worker=True``: one
    batch per worker); a restarted worker must have as many envs as before; each worker's storage
    ``[n_envs, T]`` must hold the same entries as the others'."""

    def __init__(self, frames_per_batch: int, owner: str, per_worker: bool, shares: list[int] | None = None):
        self.frames_per_batch = frames_per_batch
        self.owner = owner
        self.per_worker = per_worker
        self.shares = shares  # frames per worker in one batch (sync), when given per worker
        self.envs_per_worker: list[int] = []
        self.unbatched: list[bool] = []
        self.steps: dict[int, int] = {}
        self.specs = None
        self.storages: dict[int, TensorDictBase] = {}
        self.stacked = False  # the workers' batches come by pipe (see ready)

    def setup(self, infos: dict[int, tuple]) -> dict[int, int]:
        self.specs = agreed_specs(self.specs, {w: specs for w, (_, specs, _) in infos.items()},
                                  f"All workers of one {self.owner} must build envs with the same specs.")
        if not self.steps:
            self.envs_per_worker = [infos[w][0] for w in sorted(infos)]
            self.unbatched = [infos[w][2] for w in sorted(infos)]
            if self.per_worker:  # TorchRL: every async batch holds the whole frames_per_batch
                self.steps = {w: rounded_steps(self.frames_per_batch, n, self.owner)
                              for w, n in enumerate(self.envs_per_worker)}
            elif self.shares is not None:
                self.steps = {w: rounded_steps(share, n, self.owner)
                              for w, (share, n) in enumerate(zip(self.shares, self.envs_per_worker))}
                if len(set(self.steps.values())) > 1:
                    raise ValueError(f"{self.owner}: frames_per_batch={self.shares} gives the workers' envs different "
                                     f"numbers of steps per batch ({list(self.steps.values())}), and one batch holds "
                                     "the same steps for every env: give each worker frames in proportion to its envs "
                                     "(or use MultiAsyncCollector).")
            else:
                steps = rounded_steps(self.frames_per_batch, sum(self.envs_per_worker), self.owner)
                self.steps = dict.fromkeys(range(len(self.envs_per_worker)), steps)
        for w, (n_envs, _, _) in infos.items():
            if n_envs != self.envs_per_worker[w]:
                raise ValueError(f"{self.owner}: restarted worker {w} has {n_envs} envs, not "
                                 f"{self.envs_per_worker[w]} as before; constructors must build the same envs "
                                 "every time.")
        return {w: self.steps[w] for w in infos}

    def ready(self, replies: dict[int, TensorDictBase | None]) -> None:
        """``replies``: each worker's storage, or None when its batches come stacked, by pipe (``stacked.py``)."""
        self.stacked = any(storage is None for storage in replies.values())
        for w in replies:
            if w in self.storages:  # a replaced worker's: its memory goes with this last reference (forget_caches)
                forget_caches(self.storages.pop(w))
        self.storages.update({w: storage for w, storage in replies.items() if storage is not None})
        if self.storages:
            check_same_entries(self.storages, self.owner, "worker")


class ProcessCollector(WorkerCalls, CollectorBase):
    """See the module docstring; the arguments are :class:`~tdcollect.collectors.MultiSyncCollector`'s."""

    owner = "ProcessCollector"
    per_worker_batches = False
    hooks_in_workers = True  # as TorchRL's: each worker runs them around its share of every batch

    @built_on_cpu
    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, create_env_kwargs=None, device=None, env_device=None,
                 policy_device=None, storing_device=None, split_trajs: bool = False,
                 reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 mp_start_method: str | None = None, timeout: float = 300.0, max_restarts: int = 0,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool | str = True,
                 check_values: bool = False, return_same_td: bool = False, policy_factory=None,
                 compile_policy=None, num_threads: int | None = None,
                 auto_register_policy_transforms: bool | None = None, init_fn=None, preemptive_threshold=None,
                 **torchrl_kwargs):
        exit_if_bootstrapping()
        owner = self.owner
        device, env_device, policy_device, storing_device = (
            one_device(value, owner, name) for value, name in ((device, "device"), (env_device, "env_device"),
                                                                (policy_device, "policy_device"),
                                                                (storing_device, "storing_device")))
        options = torchrl_options(owner, split_trajs=split_trajs, return_same_td=return_same_td,
                                  built_in_policies=policy_factory is not None and policy is None, **torchrl_kwargs)
        pickled, payloads, module = prepare_workers(create_env_fn, policy, num_workers, create_env_kwargs,
                                                   env_device, owner, "worker", policy_factory)
        frames_per_batch, shares = per_worker_frames(frames_per_batch, len(pickled), owner)
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device, progress_bar=progress_bar,
                         return_same_td=return_same_td, options=options, reset_at_each_iter=reset_at_each_iter,
                         compile_policy=compile_policy)
        self.policy = policy
        self._built_in_workers = policy_factory is not None and module is None  # no weights here to share
        self.num_workers = num_workers = len(pickled)
        # this process' torch threads while the workers run, as TorchRL's process collectors set them when their
        # workers start (one fewer per worker, at least 1, or num_threads), given back at shutdown
        CALLER_THREADS.take(self, counted_workers(create_env_fn, num_workers), num_threads)
        self.max_restarts = int(max_restarts)
        self._module = module
        self._weights = SharedWeights(module) if module is not None else None
        self._versions_tensor = in_shared_memory(torch.full((num_workers,), -1, dtype=torch.int64), "the versions")
        self.preemptive_threshold = checked_threshold(preemptive_threshold, owner)
        if self.preemptive_threshold < 1.0 and self.per_worker_batches:
            raise ValueError(f"{owner}: preemptive_threshold applies to MultiSyncCollector (its workers deliver one "
                             "batch together); each worker of this one delivers its own batch.")
        # TorchRL's: no interruptor at 1.0, where preemption could never happen
        self.interruptor = StopFlag() if self.preemptive_threshold < 1.0 else None
        #: 1 from the moment a batch is started here until its worker has recorded its version in ``versions``
        self._unread = in_shared_memory(torch.zeros(num_workers, dtype=torch.int64), "the version marks")
        self._steps_taken = (in_shared_memory(torch.zeros(num_workers, dtype=torch.int64), "the steps taken")
                             if self.interruptor is not None else None)
        config = {"policy_device": policy_device or device, "compile_policy": compile_policy,
                  "register_transforms": auto_register_policy_transforms,
                  "hooks": packed_hooks(options),
                  "init_fn": cloudpickle.dumps(init_fn) if init_fn is not None else None,
                  "owner": owner, "steps_taken": self._steps_taken, "unread": self._unread,
                  "loop": {**loop_options(reset_at_each_iter, max_frames_per_traj, exploration_type, check_actions,
                                          check_values), "interruptor": self.interruptor}}
        self._handshake = StorageHandshake(frames_per_batch, owner, self.per_worker_batches, shares)
        try:
            self._pool = WorkerPool(
                run_collector_worker,
                [(factory, payload, self._weights, self._versions_tensor, config)
                 for factory, payload in zip(pickled, payloads)],
                handshake=self._handshake, start_method=resolve_start_method(
                    mp_start_method, runs_cuda(config["policy_device"], module), owner), timeout=timeout,
                owner=owner, preload=set().union(*(factory.imports for factory in pickled)),
            )
        except EnvWorkerError as err:  # a policy that cannot be wrapped is the caller's TypeError, as in TorchRL
            if err.exc_type == "TypeError" and err.exc_message.startswith(UNWRAPPABLE):
                raise TypeError(f"{owner}: {err.exc_message}") from err
            raise
        self.envs_per_worker = self._handshake.envs_per_worker
        if self._handshake.stacked and self.interruptor is not None:
            self.shutdown()
            raise ValueError(f"{owner}: preemptive_threshold stops workers inside their batch storage in shared "
                             "memory, and this env's batches are stacked step by step instead (dynamic or non-tensor "
                             "entries, see tdcollect/collectors/stacked.py): leave preemptive_threshold unset.")
        self._worker_frames = [0] * num_workers
        self._worker_batches = [0] * num_workers
        self._acted_versions: torch.Tensor | None = None  # the workers' versions when the last batch was taken

    def _recover(self, err: WorkerError) -> list[int]:
        """Replace the failed workers while ``max_restarts`` allows (their envs start new episodes, with new
        trajectory ids) and return them; otherwise shut down and raise ``err``."""
        try:
            workers = self._pool.replace_failed(err, self.max_restarts)
        except BaseException:
            self.shutdown()
            raise
        if workers is None:
            self.shutdown()
            raise err
        for w in workers:
            self._restart_trajectories(self._rows(w))
        return workers

    def _storage(self, w: int) -> TensorDictBase:
        """Worker ``w``'s batch storage in shared memory. A :meth:`shutdown` from another thread drops the storages
        while a collection may be about to read them: that call ends with the one "shut down" error."""
        storage = self._handshake.storages.get(w)
        if storage is None:
            raise self._shut_down_error()
        return storage

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """The frames worker ``worker_idx`` collects per batch (TorchRL's method; rounded up to its envs)."""
        if worker_idx is None:
            return self.frames_per_batch if self.per_worker_batches else -(-self.frames_per_batch // self.num_workers)
        return self._handshake.steps[worker_idx] * self.envs_per_worker[worker_idx]

    def _rows(self, w: int) -> range:
        """The rows of worker ``w``'s envs among all workers' envs."""
        first = sum(self.envs_per_worker[:w])
        return range(first, first + self.envs_per_worker[w])

    def stats(self, workers: str = "aggregate") -> dict:
        """TorchRL's snapshot (see :meth:`CollectorBase.stats`) plus ``workers`` and ``workers_alive``; with
        ``workers="per_worker"`` (or ``"both"``, with the aggregate too) ``worker_<w>/frames`` and
        ``worker_<w>/batches`` for every worker (counted in this process: no call reaches the workers)."""
        if workers not in ("aggregate", "per_worker", "both"):
            raise ValueError(f"stats(workers=...): workers must be one of 'aggregate', 'per_worker' or 'both', got "
                             f"{workers!r}.")
        out = super().stats() if workers != "per_worker" else {}
        out.update(workers=self.num_workers, workers_alive=len(self._pool.pids) if "_pool" in self.__dict__ else 0)
        if workers != "aggregate":
            for w, (frames, batches) in enumerate(zip(self._worker_frames, self._worker_batches)):
                out.update({f"worker_{w}/frames": frames, f"worker_{w}/batches": batches})
        return out

    def _hooks_changed(self) -> None:
        if "_pool" in self.__dict__:
            self._settle()
            hooks = packed_hooks(self.options)
            self._pool.call("set_hooks", [(hooks,)] * self.num_workers)

    def _count_batches(self, workers: list[int], steps: int) -> None:
        """Per-worker counts for :meth:`stats`: each of ``workers`` delivered a batch of ``steps`` steps."""
        for w in workers:
            self._worker_frames[w] += self.envs_per_worker[w] * steps
            self._worker_batches[w] += 1

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return list(self._pool.restarts)

    def _set_seed(self, seed: int, static_seed: bool) -> int:
        """Env i (counted over all workers) gets the i-th seed of TorchRL's chain (``seed``,
        ``seed_generator(seed)``, ...: see ``EnvGroup.set_seed``), worker w's torch RNG the seed of its first env."""
        self._settle()
        seeds = seed_chain(seed, sum(self.envs_per_worker), static_seed)
        answers = self._pool.call("set_seed", [(seeds[self._rows(w)[0]], static_seed)
                                               for w in range(self.num_workers)])
        return answers[-1]

    def _envs_per_buffer_write(self) -> int | None:
        return None if all(self._handshake.unbatched) else self.envs_per_worker[0]

    def reset(self, reset_idx=None) -> None:
        """Every env of the workers flagged in ``reset_idx`` (a sequence of bools, one per worker; default: all)
        starts a new episode at the next batch (TorchRL's ``reset``)."""
        self._settle()
        workers = [w for w in range(self.num_workers) if reset_idx is None or reset_idx[w]]
        self._pool.call("reset_envs", [()] * len(workers), workers)
        for w in workers:
            self._restart_trajectories(self._rows(w))

    def _settle(self) -> None:
        """Wait for any collection still running in the workers (async collectors); nothing here."""

    def _policy_module(self):
        return self._module

    def _envs_count(self) -> int:
        return sum(self.envs_per_worker)

    def state_dict(self) -> dict:
        """TorchRL's multi-process checkpoint: ``{"worker<w>": {"policy_state_dict": ...}, "frames", "iter"}``,
        each worker's entry holding the weights it acts with (the shared copy of the last
        :meth:`update_policy_weights_`)."""
        state = super().state_dict()
        state.pop("policy_state_dict", None)
        if self._weights is not None:
            acted = {key: value.clone() for key, value in self._weights.params.flatten_keys(".").items()}
            per_worker = [dict(acted) for _ in range(self.num_workers)]
        elif self._built_in_workers:  # each worker holds the weights of the policy it built
            self._settle()
            per_worker = self._pool.call("policy_state_dict", [()] * self.num_workers)
        else:
            per_worker = [{}] * self.num_workers
        for w, policy_state in enumerate(per_worker):
            state[f"worker{w}"] = {"policy_state_dict": policy_state} if policy_state else {}
            if self.options.track_policy_version:  # the workers share one copy, so one version
                state[f"worker{w}"]["policy_version"] = self.policy_version
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restore a :meth:`state_dict` (or one in the single collector's form, with ``"policy_state_dict"``);
        the workers share one copy of the weights, so worker 0's are loaded."""
        if "policy_state_dict" not in state_dict and "policy_state_dict" in state_dict.get("worker0", {}):
            state_dict = {**state_dict, "policy_state_dict": state_dict["worker0"]["policy_state_dict"]}
        super().load_state_dict(state_dict, strict=strict)

    def update_policy_weights_(self, policy_weights=None, **kwargs) -> None:
        """A new weights version (see ``weight_versions``). On the CPU the workers act with the policy's own
        tensors (``weights.py``), so the call only marks the version, or copies ``policy_weights`` (a TensorDict or a
        module of the same structure; TorchRL's ``policy_or_weights``) into them; elsewhere the policy's weights (or
        those given) are copied into the shared copy, which every worker pulls at its next batch. Policies built in
        the workers by ``policy_factory`` (without ``policy=``) each load the weights given, or, as TorchRL's
        per-worker weights, ``{worker: weights}``."""
        worker_ids = kwargs.pop("worker_ids", None)  # the shared weights reach every worker
        policy_weights = requested_weights(policy_weights, kwargs)
        per_worker = isinstance(policy_weights, dict) and all(isinstance(w, int) for w in policy_weights)
        if per_worker or (worker_ids is not None and self._built_in_workers):
            self._load_per_worker(policy_weights if per_worker else dict.fromkeys(worker_ids, policy_weights))
        elif self._weights is not None:
            self._weights.publish(policy_weights if policy_weights is not None else self.policy)
        elif self._built_in_workers and policy_weights is not None:  # policy_factory only: each worker loads them
            self._settle()
            if not all(self._pool.call("load_policy_weights", [(policy_weights_of(policy_weights),)] *
                                       self.num_workers)):
                raise TypeError(f"{self.owner}: update_policy_weights_(weights) requires an nn.Module policy; the "
                                "policy the workers built with policy_factory has no weights.")
            self.increment_version()
        elif self._built_in_workers:
            raise ValueError(f"{self.owner}: the policies were built in the workers by policy_factory and this "
                             "process holds none to read weights from: pass the weights "
                             "(update_policy_weights_(weights)), or pass policy= too (the weights' source).")

    def _load_per_worker(self, weights: dict) -> None:
        """``{worker: weights}`` loaded by those workers' own policies (built there by ``policy_factory``)."""
        if not self._built_in_workers:
            raise ValueError(f"{self.owner}: per-worker weights need policies built in the workers (policy_factory, "
                             "without policy=); with policy= every worker acts with one shared copy of its weights: "
                             "call update_policy_weights_() or pass one set of weights.")
        workers = sorted(weights)
        if any(not 0 <= w < self.num_workers for w in workers):
            raise ValueError(f"{self.owner}: per-worker weights for workers {workers}; there are {self.num_workers}.")
        self._settle()
        if not all(self._pool.call("load_policy_weights", [(policy_weights_of(weights[w]),) for w in workers],
                                   workers)):
            raise TypeError(f"{self.owner}: update_policy_weights_(weights) requires an nn.Module policy; the "
                            "policy the workers built with policy_factory has no weights.")
        self.increment_version()

    @property
    def policy_version(self) -> int:
        """The version of the shared weights: 0 at first, one more for every :meth:`update_policy_weights_`."""
        return int(self._weights.version) if self._weights is not None else self._local_version

    def _restore_version(self, version: int) -> None:
        if self._weights is not None:
            self._weights.version.fill_(version)
        else:
            self._local_version = version

    def increment_version(self) -> None:
        if self._weights is not None:
            self._weights.version += 1
        else:
            self._local_version += 1

    def _frame_versions(self, n_envs: int) -> torch.Tensor:
        rows = self._batch_rows or range(n_envs)
        workers = [w for w in range(self.num_workers) if self._rows(w).start in rows]
        # the versions the batch was collected with (an async worker may have started its next batch since)
        versions = self._versions_tensor if self._acted_versions is None else self._acted_versions
        return torch.cat([versions[w].clamp(min=0).expand(self.envs_per_worker[w]) for w in workers])

    @property
    def weight_versions(self) -> list[int]:
        """The weights version each worker acted with in its last batch (0 = the initial weights)."""
        return self._versions_tensor.tolist()

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids

    def _shutdown(self) -> None:
        pool = self.__dict__.get("_pool")
        handshake = self.__dict__.get("_handshake")
        if pool is not None:
            pool.stop()
        CALLER_THREADS.give_back(self)
        if handshake is not None:
            for storage in handshake.storages.values():
                forget_caches(storage)  # (their shared memory goes with the last reference, see forget_caches)
            handshake.storages.clear()
        if "_versions_tensor" in self.__dict__:  # a private copy: weight_versions still answers
            self._versions_tensor = self._versions_tensor.clone()
        for name in ("_unread", "_steps_taken"):  # private copies too: their shared segments go now
            if self.__dict__.get(name) is not None:
                setattr(self, name, self.__dict__[name].clone())
        self._weights = None


def counted_workers(create_env_fn, num_workers: int) -> int:
    """The workers TorchRL's process collectors count for this process' torch threads: one per constructor, a
    ``ParallelEnv`` instance (TorchRL's, or ours in its place) counting its own workers (ours: those it counts for
    the torch threads, TorchRL's count under ``tdcollect run``'s layout)."""
    from torchrl.envs import ParallelEnv as TorchRLParallelEnv

    from tdcollect.envs.parallel import ParallelEnv

    if not isinstance(create_env_fn, (list, tuple)):
        create_env_fn = [create_env_fn] * num_workers
    return sum(fn.counted_workers if isinstance(fn, ParallelEnv) else fn.num_workers
               if isinstance(fn, TorchRLParallelEnv) else 1 for fn in create_env_fn)


def packed_hooks(options) -> bytes:
    """``(pre_collect_hook, post_collect_hook)`` cloudpickled, as a worker's ``BatchLoop.set_hooks`` takes them."""
    return cloudpickle.dumps((options.pre_collect_hook, options.post_collect_hook))
