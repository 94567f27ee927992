"""RayCollector: MultiSyncCollector's worker loop in Ray actors — the same batches, on one machine or on a
Ray cluster of many.

Each actor (:class:`RayCollectorWorker`, one per constructor) builds its env from the cloudpickled
constructor (which may return a ``SerialEnv`` or a ``ParallelEnv``: one actor per machine can step many
envs), its own copy of the policy, and a :class:`~tdcollect.collectors.loop.BatchLoop` of ``T = frames_per_batch /
n_envs`` steps — exactly what a MultiSyncCollector worker process builds. One batch, as messages::

    driver                                              actor w (n_w envs)
    collect.remote(random, T, [weights_ref], version) -> if version differs from the one it holds: fetch
                                                         weights_ref and copy it into its policy in place;
                                                         fill its [n_w, T] storage with the next T steps
                             <- ("ok", (storage, info))  or ("error", report)  (info: incarnation, pid,
                                                                               version acted with)
    torch.cat over actors, in actor order -> TensorDict [sum(n_w), T], MultiSyncCollector's keys and layout

Weights: ``update_policy_weights_()`` puts the policy's parameters into Ray's object store once (``ray.put``)
and bumps the version. The ref travels with every collect call, wrapped in a list so that Ray does not fetch
it for actors that already hold that version; an actor that Ray restarted is therefore current from its
first batch.

Restarts: actors are created with ``max_restarts`` and ``max_task_retries=-1``. When an actor process dies
(killed, crashed, its node lost), Ray builds it again from the same arguments and runs the collect call that
was in flight again on the new actor, so its part of the batch is refilled by fresh envs (new episodes, new
trajectory ids): batches are never half-empty. Exceptions raised by an env or the policy are not retried:
they are reported as :class:`~tdcollect.envs.EnvWorkerError` naming the actor, and the collector shuts down.
"""
from __future__ import annotations

import logging
import os
import time
import uuid

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs.utils import ExplorationType

try:
    import ray
    from ray import exceptions as ray_exceptions
except ImportError as exc:  # pragma: no cover - exercised in a subprocess that hides ray
    raise ImportError(
        'tdcollect.collectors.RayCollector needs Ray, an optional extra of tdcollect: pip install "tdcollect[ray]" '
        '(or pip install "ray>=2.60,<3").'
    ) from exc

from tdcollect.envs.engine.errors import (
    EnvWorkerError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    error_report,
    worker_error,
)
from tdcollect.envs.engine.group import seed_chain
from tdcollect.envs.engine.specs import check_same_specs
from tdcollect.envs.engine.user_warnings import warn_caller

from ..base import CollectorBase
from ..loop import DEFAULT_EXPLORATION_TYPE, BatchLoop, loop_options
from ..weights import policy_weights_of
from ..worker import build_worker, check_same_entries, prepare_workers, worker_specs

OWNER = "RayCollector"


class RayCollectorWorker:
    """One Ray actor: its env(s), its policy copy and its batch loop (built at the first ``collect`` or
    ``set_seed``, when the driver knows ``steps``). Ray runs ``__init__`` again, with the same arguments,
    when it restarts the actor. Every method answers ``("ok", value)`` or ``("error", report)`` (a report as
    :func:`tdcollect.envs.errors.error_report` makes it), so that the driver raises one clear error naming
    the actor."""

    def __init__(self, factory, policy_payload: bytes | None, config: dict):
        self.incarnation = uuid.uuid4().hex  # tells the driver that Ray restarted this actor
        self.config = config
        self.env = self.loop = self.params = self.error = None
        self.version = 0  # the policy payload holds the weights of version 0
        torch.set_num_threads(config["threads"])
        try:
            self.env, self.policy, module, _ = build_worker(factory, policy_payload, config["policy_device"], OWNER)
            self.params = TensorDict.from_module(module).data if module is not None else None
        except Exception as exc:  # noqa: BLE001 - reported by info()/collect()
            self.error = error_report(exc, "construction")

    def info(self):
        """``("ok", {"n_envs", "specs", "incarnation", "pid", "node"})``."""
        if self.error is not None:
            return "error", self.error
        return "ok", {"n_envs": int(self.env.batch_size.numel()), "specs": worker_specs(self.env), **self._identity()}

    def collect(self, random: bool, steps: int, weights: list, version: int):
        """Fill the next ``[n_envs, steps]`` batch; ``weights``: ``[ObjectRef of the parameters' TensorDict or
        None]``, loaded first when ``version`` differs from the version held. Returns ``("ok", (storage,
        info))`` with ``info`` = ``{"incarnation", "pid", "node", "version"}``."""
        if self.error is not None:
            return "error", self.error
        try:
            if version != self.version:
                if self.params is not None and weights[0] is not None:
                    self.params.update_(ray.get(weights[0]))
                self.version = version
            batch = self._loop(steps).collect(random)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            return "error", error_report(exc, "collection")
        return "ok", (batch, {**self._identity(), "version": self.version})

    def set_seed(self, seed: int, steps: int, static_seed: bool = False):
        """This actor's envs get TorchRL's seed chain from ``seed``, its torch and numpy RNGs ``seed``; episodes
        restart. Answers the seed after its last env's."""
        if self.error is not None:
            return "error", self.error
        try:
            return "ok", self._loop(steps).set_seed(seed, static_seed, seed_process=True)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            return "error", error_report(exc, "set_seed")

    def close(self):
        if self.env is not None and not self.env.is_closed:
            self.env.close()
        return "ok", None

    def _loop(self, steps: int) -> BatchLoop:
        if self.loop is None:
            config = self.config
            self.loop = BatchLoop(self.env, self.policy, steps, inference_mode=True, **config["loop"])
        elif self.loop.steps != steps:
            raise ValueError(f"{OWNER}: this actor collects batches of {self.loop.steps} steps, not {steps}.")
        return self.loop

    def _identity(self) -> dict:
        return {"incarnation": self.incarnation, "pid": os.getpid(), "node": ray.util.get_node_ip_address()}


_RemoteWorker = ray.remote(RayCollectorWorker)


class RayWorkerDiedError(WorkerDiedError):
    """A Ray actor died and Ray could not (or may no more) restart it. ``pid``: its last known pid."""

    def __init__(self, worker: int, pid: int, during: str, max_restarts: int, cause: str):
        WorkerError.__init__(
            self,
            f"Ray actor {worker} (last pid {pid}) died during {during} and was not restarted (max_restarts="
            f"{max_restarts} per actor); the collector was shut down. Ray says: {cause}",
            worker,
        )
        self.pid = pid
        self.exitcode = None


class RayCollector(CollectorBase):
    """Yields TensorDicts ``[n_envs, T]`` gathered from ``num_workers`` Ray actors — the batches of a
    :class:`~tdcollect.collectors.MultiSyncCollector` with the same arguments: TorchRL keys (``"observation"``,
    ``"action"``, ``"done"``, ``"terminated"``, ``"truncated"``, ``("next", ...)`` with ``"reward"``, ...),
    time last, ``("collector", "traj_ids")``; ``n_envs`` is the sum of the actors' envs, in actor order,
    and ``n_envs * T == frames_per_batch``.

    Args:
        create_env_fn: a list of env constructors, one per actor (or one constructor and ``num_workers``);
            a constructor may return a gymnasium env, a TorchRL env, a ``SerialEnv`` or a ``ParallelEnv``.
            Constructors and the policy travel with cloudpickle; on a multi-node cluster every node needs
            tdcollect and the modules they use (installed there, or through ``runtime_env`` in
            ``ray_init_kwargs``).
        policy: as for :class:`~tdcollect.collectors.Collector`; each actor gets its own copy, updated by
            :meth:`update_policy_weights_`.
        frames_per_batch: as for :class:`~tdcollect.collectors.MultiSyncCollector`, as are ``total_frames``,
            ``device``, ``env_device``, ``policy_device`` (the device inside each actor), ``storing_device``,
            ``split_trajs``, ``reset_at_each_iter``, ``init_random_frames``, ``max_frames_per_traj``,
            ``progress_bar``, ``exploration_type``, ``check_actions`` and ``check_values``.
        ray_init_kwargs: passed to ``ray.init`` when Ray is not initialized in this process yet, e.g.
            ``{"address": "auto"}`` to join a running cluster; by default a local cluster is started
            (without dashboard, actors' output not forwarded: ``{"log_to_driver": True}`` to see it).
            Ignored, with a warning, when Ray is already initialized.
        num_cpus, num_gpus: Ray resources per actor (``num_gpus`` is needed for a CUDA ``policy_device``).
            The actor's torch uses ``max(1, int(num_cpus))`` threads.
        max_restarts: how many times Ray may restart each actor (-1: no limit). A restarted actor rebuilds
            its envs and policy, takes the latest weights, and collects its part of the batch again; a
            ``RuntimeWarning`` is issued and ``restarts`` counts them.
        timeout: seconds to wait for the actors' start (resources included) and for each batch before a
            :class:`~tdcollect.envs.WorkerTimeoutError`.

    Ray is started in ``__init__`` if needed and shut down by :meth:`shutdown` only if this collector
    started it (a cluster joined with ``address`` stays up; this process just disconnects).
    """

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 num_workers: int | None = None, create_env_kwargs=None, device=None, env_device=None,
                 policy_device=None, storing_device=None, split_trajs: bool = False,
                 reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 ray_init_kwargs: dict | None = None, num_cpus: float = 1, num_gpus: float = 0,
                 max_restarts: int = 3, timeout: float = 300.0,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool | str = True,
                 check_values: bool = False):
        self._actors: list = []
        self._started_ray = False
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device, progress_bar=progress_bar)
        policy_device = policy_device or device
        _check_resources(num_cpus, num_gpus, max_restarts, timeout, policy_device, ray_init_kwargs)
        pickled, payloads, self._module = prepare_workers(create_env_fn, policy, num_workers, create_env_kwargs,
                                                         env_device, OWNER, "actor")
        num_workers = len(pickled)
        self.policy = policy
        self.num_workers = num_workers
        self.max_restarts = int(max_restarts)
        self.timeout = float(timeout)
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self._weights_ref = None
        self._version = 0
        self._restarts = [0] * num_workers
        self._versions = [-1] * num_workers
        config = {"policy_device": policy_device, "threads": max(1, int(num_cpus)), "loop": loop_options(
            reset_at_each_iter, max_frames_per_traj, exploration_type, check_actions, check_values)}
        self._start_ray(ray_init_kwargs)
        try:
            self._warn_if_too_big()
            options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": self.max_restarts,
                       "max_task_retries": -1}
            self._actors = [_RemoteWorker.options(**options).remote(fn, payload, config)
                            for fn, payload in zip(pickled, payloads)]
            infos = self._gather([actor.info.remote() for actor in self._actors], "construction")
            check_same_specs({f"actor {w}": info["specs"] for w, info in enumerate(infos)},
                             f"All actors of one {OWNER} must build envs with the same specs.")
            self.envs_per_worker = [info["n_envs"] for info in infos]
            self._incarnations = [info["incarnation"] for info in infos]
            self._pids = [info["pid"] for info in infos]
            self.nodes = [info["node"] for info in infos]
            self._steps = self.steps_per_batch(frames_per_batch, sum(self.envs_per_worker), OWNER)
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- Ray
    def _start_ray(self, ray_init_kwargs: dict | None) -> None:
        if ray.is_initialized():
            if ray_init_kwargs:
                warn_caller(f"{OWNER}: Ray is already initialized in this process; ray_init_kwargs "
                            f"{ray_init_kwargs} are ignored.", RuntimeWarning)
            return
        kwargs = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        kwargs.update(ray_init_kwargs or {})
        ray.init(**kwargs)
        self._started_ray = True

    def _warn_if_too_big(self) -> None:
        """Actors that do not fit wait for resources (an autoscaler may add nodes): say so up front."""
        cluster = ray.cluster_resources()
        for name, per_actor in (("CPU", self.num_cpus), ("GPU", self.num_gpus)):
            have = cluster.get(name, 0.0)
            need = per_actor * self.num_workers
            if need > have:
                warn_caller(
                    f"{OWNER}: {self.num_workers} actors x {per_actor:g} {name}s need {need:g} {name}s but the "
                    f"Ray cluster has {have:g}; the actors that do not fit wait (up to timeout={self.timeout:g} "
                    f"s) for nodes to join. Ask for less per actor (e.g. num_{name.lower()}s="
                    f"{have / self.num_workers:.2g}) to share them.", RuntimeWarning)

    def _gather(self, refs: list, during: str) -> list:
        """The actors' answers in actor order; any failure becomes one error naming the actor (the caller
        shuts down)."""
        deadline = time.monotonic() + self.timeout
        out = []
        for w, ref in enumerate(refs):
            try:
                status, value = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray_exceptions.GetTimeoutError:
                raise self._timeout_error(w, during) from None
            except ray_exceptions.RayActorError as exc:
                lines = [line for line in (getattr(exc, "error_msg", None) or str(exc)).splitlines() if line.strip()]
                cause = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1].strip()}"
                raise RayWorkerDiedError(w, self._pid(w), during, self.max_restarts, cause) from None
            except ray_exceptions.RayTaskError as exc:  # not raised by our methods; kept for safety
                raise EnvWorkerError(w, type(exc.cause).__name__, str(exc.cause), exc.traceback_str,
                                     during) from None
            if status == "error":
                raise worker_error(w, value)
            out.append(value)
        return out

    def _timeout_error(self, w: int, during: str) -> WorkerTimeoutError:
        err = WorkerTimeoutError(w, self.timeout, during)
        hint = (f" It may still be waiting for resources (num_cpus={self.num_cpus:g}, num_gpus="
                f"{self.num_gpus:g} per actor; the cluster has {ray.cluster_resources()})."
                if during == "construction" else "")
        err.args = (f"{OWNER}: actor {w} did not finish {during} within timeout={self.timeout:g} s; the "
                    f"collector was shut down.{hint}",)
        return err

    def _pid(self, w: int) -> int:
        pids = getattr(self, "_pids", [])
        return pids[w] if w < len(pids) else -1

    def _call(self, refs: list, during: str) -> list:
        try:
            return self._gather(refs, during)
        except BaseException:  # an actor's error, Ctrl-C, a Ray failure: nothing half-running stays
            self.shutdown()
            raise

    # ----------------------------------------------------------------- collection
    def _collect(self, random: bool) -> TensorDictBase:
        """One batch from every actor (actors that Ray restarted meanwhile included: they refill their part
        with fresh envs, whose trajectories get new ids)."""
        weights = [self._weights_ref]
        refs = [actor.collect.remote(random, self._steps, weights, self._version) for actor in self._actors]
        answers = self._call(refs, "collection")
        batches = []
        for w, (batch, info) in enumerate(answers):
            if info["incarnation"] != self._incarnations[w]:
                self._note_restart(w, info)
            self._versions[w] = info["version"]
            if batch.batch_size != (self.envs_per_worker[w], self._steps):
                self.shutdown()
                raise ValueError(f"{OWNER}: actor {w} sent a batch of {tuple(batch.batch_size)}, not "
                                 f"{(self.envs_per_worker[w], self._steps)}: its rebuilt env has another number "
                                 "of envs; constructors must build the same envs every time.")
            batches.append(batch)
        if self.batches == 0:
            try:
                check_same_entries(dict(enumerate(batches)), OWNER, "actor")
            except ValueError:
                self.shutdown()
                raise
        return torch.cat(batches, 0)

    def _note_restart(self, w: int, info: dict) -> None:
        self._restarts[w] += 1
        warn_caller(f"{OWNER}: Ray restarted actor {w} (pid {self._pids[w]} -> {info['pid']} on "
                    f"{info['node']}); its part of this batch was collected by its rebuilt envs.", RuntimeWarning)
        self._incarnations[w], self._pids[w] = info["incarnation"], info["pid"]
        self.nodes[w] = info["node"]
        first = sum(self.envs_per_worker[:w])
        self._restart_trajectories(range(first, first + self.envs_per_worker[w]))

    def _set_seed(self, seed: int, static_seed: bool) -> int:
        """Env i (counted over all actors) gets the i-th seed of TorchRL's chain (``seed``,
        ``seed_generator(seed)``, ...), actor w's torch RNG the seed of its first env. (An actor that Ray restarts
        later starts unseeded.)"""
        seeds = seed_chain(seed, sum(self.envs_per_worker), static_seed)
        firsts = [sum(self.envs_per_worker[:w]) for w in range(self.num_workers)]
        return self._call([actor.set_seed.remote(seeds[first], self._steps, static_seed)
                           for actor, first in zip(self._actors, firsts)], "set_seed")[-1]

    def _envs_count(self) -> int:
        return sum(self.envs_per_worker)

    def _policy_module(self):
        return self._module

    def update_policy_weights_(self, policy_weights=None) -> None:
        """Put the policy's current weights (or ``policy_weights``: a TensorDict of them, or a module of the
        same structure) into Ray's object store, once; every actor loads them in place before its next batch
        (see ``weight_versions``)."""
        if self._module is None:
            return
        source = policy_weights_of(self._module if policy_weights is None else policy_weights)
        self._weights_ref = ray.put(source.detach().to("cpu"))
        self._version += 1

    # ----------------------------------------------------------------- state
    @property
    def weight_versions(self) -> list[int]:
        """The weights version each actor acted with in the last batch (0 = the initial weights)."""
        return list(self._versions)

    @property
    def restarts(self) -> list[int]:
        """How many times Ray restarted each actor, as seen in the batches so far."""
        return list(self._restarts)

    @property
    def worker_pids(self) -> list[int]:
        """The actors' process ids (as last seen), on their nodes (see ``nodes``)."""
        return list(getattr(self, "_pids", [])) if self._actors else []

    @property
    def actors(self) -> list:
        """The Ray actor handles, in actor order."""
        return list(self._actors)

    def _shutdown(self) -> None:
        actors, self._actors = self._actors, []
        self._weights_ref = None
        if ray.is_initialized() and actors:
            closing = [actor.close.remote() for actor in actors]  # lets a ParallelEnv close its workers
            ray.wait(closing, num_returns=len(closing), timeout=2.0)
            for actor in actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if self._started_ray:
            self._started_ray = False
            if ray.is_initialized():
                ray.shutdown()


def _check_resources(num_cpus, num_gpus, max_restarts, timeout, policy_device, ray_init_kwargs) -> None:
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
        raise ValueError(f"{OWNER}: num_cpus must be a number >= 0 (per actor), got {num_cpus!r}.")
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0:
        raise ValueError(f"{OWNER}: num_gpus must be a number >= 0 (per actor), got {num_gpus!r}.")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
        raise ValueError(f"{OWNER}: max_restarts must be an int >= -1 (-1: no limit), got {max_restarts!r}.")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{OWNER}: timeout must be a positive number of seconds, got {timeout!r}.")
    if ray_init_kwargs is not None and not isinstance(ray_init_kwargs, dict):
        raise TypeError(f"{OWNER}: ray_init_kwargs must be a dict of ray.init arguments, got "
                        f"{type(ray_init_kwargs).__name__}.")
    if policy_device is not None and torch.device(policy_device).type == "cuda" and not num_gpus:
        raise ValueError(f"{OWNER}: policy_device={policy_device} needs num_gpus > 0 per actor (e.g. "
                         "num_gpus=0.5 to share one GPU between two actors): Ray hides GPUs from actors "
                         "that did not ask for one.")
