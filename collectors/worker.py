"""A collector's worker: what a collector accepts as an env, turned into a batched TorchRL env
(:func:`make_batched_env`, also used by the single-process collectors); what the multi-process collectors check
and pack before their workers start (:func:`prepare_workers`, :func:`check_same_entries`); and the process body of
the MultiSync / MultiAsync / Ray workers (:func:`run_collector_worker`, :func:`build_worker`).

The process body builds its env, its policy copy and a :class:`~.loop.BatchLoop` filling its storage in shared
memory. Its messages and commands are part of the worker protocol (``tdcollect/envs/protocol.py``): hello
``(n_envs, EnvSpecs of one env, unbatched)``, setup ``T``, ready its storage ``[n_envs, T]``; ``COLLECT`` /
``COLLECT_RANDOM`` fill the storage with the next ``T`` steps; ``CALL`` reaches the loop's declared calls
(:data:`LOOP_CALLS`). An env whose batches are stacked step by step (``stacked.py``) has no storage (ready:
``None``): each ``COLLECT`` answers with its batch, by pipe."""
from __future__ import annotations

import functools

import cloudpickle
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from torchrl.data import StackedComposite
from torchrl.envs import EnvBase

from tdcollect.envs.engine.errors import SpecMismatchError, sendable
from tdcollect.envs.engine.protocol import COLLECT, COLLECT_RANDOM, WorkerChannel
from tdcollect.envs.engine.shared import EnvSpecs, unbufferable
from tdcollect.envs.factories import PickledFactory, bind_kwargs, constructors_and_kwargs, is_env_instance
from tdcollect.envs.libs.envbase import TORCHRL_STEP
from tdcollect.envs.serial import SerialEnv

from .loop import BatchLoop
from .options import compiled
from .policies import make_policy, policy_module, with_exploration_specs
from .policy_transforms import with_policy_transforms
from .stacked import stacking_reason


def make_batched_env(env_or_factory, owner: str) -> tuple[EnvBase, bool, bool]:
    """Returns ``(env, owned, unbatched)``. A batched TorchRL env (SerialEnv, ParallelEnv, torchrl's own) is used
    as it is; any other env the engine steps (an env of any family in ``tdcollect.envs.libs``: a gymnasium env, an
    unbatched TorchRL env, ...) becomes a one-env SerialEnv, which raises a ``TypeError`` for anything else. A
    callable that is not an env is called first (``owned``: the collector built it, so it closes it).
    ``unbatched``: the env has no batch dim (its batches are ``[T]`` in TorchRL's layout, not ``[1, T]``); it
    was wrapped, but when a SerialEnv's step buffers cannot hold it (:func:`fits_step_buffers`) or when the
    SerialEnv would step it through its own ``step_and_maybe_reset`` (no native road for it: "TorchRL's step" in
    ``roads()``): then it is stepped as it is, as TorchRL's collector steps it."""
    owned = False
    env = env_or_factory
    if not is_env_instance(env):
        if not callable(env):
            raise TypeError(f"{owner} needs an env or a function that builds one, got {type(env).__name__}.")
        env, owned = env(), True
    if isinstance(env, EnvBase) and env.batch_size == () and not fits_step_buffers(env):
        return env, owned, True  # stepped as it is (see stacked.py)
    if not isinstance(env, EnvBase) or env.batch_size == ():
        instance = env
        wrapped = SerialEnv(1, lambda: instance, owner=owner)
        if isinstance(env, EnvBase) and wrapped.roads()[0].startswith(TORCHRL_STEP):
            wrapped.release()  # its own step_and_maybe_reset either way: the wrap would only add copies
            return env, owned, True
        return wrapped, True, True
    return env, owned, False


def fits_step_buffers(env: EnvBase) -> bool:
    """Whether a SerialEnv can hold ``env`` (a TorchRL env) in its step buffers: no dynamic, heterogeneous or
    non-tensor entries (``stacked.py``)."""
    specs = EnvSpecs(env.full_observation_spec, env.full_action_spec, env.full_reward_spec, env.full_done_spec)
    return stacking_reason(env) is None and unbufferable(specs.buffer_spec()) is None


class CopyOfEnv:
    """A constructor that returns a copy of a TorchRL env instance (cloudpickled once, here): how the process
    collectors take an ``EnvBase`` instance, as TorchRL's do: every worker steps its own copy. Any other
    instance (a gymnasium env, a native engine's object, ...) must come as a constructor."""

    def __init__(self, env: EnvBase, owner: str):
        self.payload = sendable(env, TypeError, f"{owner}: the {type(env).__name__} instance cannot be copied to the "
                                "worker processes", "; pass a function that builds it instead.")

    def __call__(self) -> EnvBase:
        return cloudpickle.loads(self.payload)


def copies_of_torchrl_instances(create_env_fn, owner: str):
    """``create_env_fn`` (one env constructor or a list of them) with each TorchRL env instance replaced by a
    :class:`CopyOfEnv` (the same instance given twice is pickled once)."""
    if isinstance(create_env_fn, (list, tuple)):
        copies: dict[int, CopyOfEnv] = {}
        return [copies.setdefault(id(fn), CopyOfEnv(fn, owner)) if isinstance(fn, EnvBase) else fn
                for fn in create_env_fn]
    return CopyOfEnv(create_env_fn, owner) if isinstance(create_env_fn, EnvBase) else create_env_fn


def worker_specs(env: EnvBase) -> EnvSpecs:
    """The specs of one env of a worker's batched ``env`` (of all of them, for an unbatched env or heterogeneous
    entries): what a remote collector worker reports at start-up, so that the main process can check that every
    worker steps the same envs (bounds included)."""
    specs = (env.full_observation_spec, env.full_action_spec, env.full_reward_spec, env.full_done_spec)
    if not env.batch_size or any(isinstance(spec, StackedComposite) for s in specs for spec in s.values(True)):
        return EnvSpecs(*specs)  # an unbatched env, or heterogeneous entries (not indexable by env): as they are
    return EnvSpecs(*(spec[0] for spec in specs))


def build_worker(factory, policy_payload: bytes | None, policy_device, owner: str):
    """What every remote collector worker (a MultiSyncCollector process, a RayCollector actor) builds first:
    its env (from ``factory``, as :func:`make_batched_env`), and its policy copy (``policy_payload``: the
    user's policy, cloudpickled; ``None``: random actions). Returns ``(env, policy, module, unbatched)``: ``policy`` is
    the per-step callable of :func:`~tdcollect.collectors.policies.make_policy`, ``module`` the user's ``nn.Module``
    holding the weights (or ``None``). On failure the env is closed before the error propagates."""
    env, _, unbatched = make_batched_env(factory, owner)
    try:
        user_policy = cloudpickle.loads(policy_payload) if policy_payload is not None else None
        if isinstance(user_policy, BuiltInWorker):
            user_policy = user_policy.policy_factory()
        user_policy = with_exploration_specs(user_policy, env)
        policy = make_policy(user_policy, env.full_action_spec, policy_device, env.full_observation_spec,
                             unbatched=unbatched and bool(env.batch_size))
        module = policy_module(user_policy)  # the user's module, as the shared weights were taken from it
    except BaseException:
        env.close()
        raise
    return env, policy, module, unbatched


def check_env_device(env_device, owner: str) -> None:
    if env_device is not None and torch.device(env_device).type != "cpu":
        raise ValueError(f"{owner}: env_device must be the CPU (tdcollect's envs step on the CPU), got {env_device}.")


class BuiltInWorker:
    """What a worker receives for TorchRL's ``policy_factory``: the factory, which each worker calls to build its
    own policy (the main process never calls it)."""

    def __init__(self, policy_factory):
        self.policy_factory = policy_factory


def prepare_workers(create_env_fn, policy, num_workers: int | None, create_env_kwargs, env_device, owner: str,
                    unit: str, policy_factory=None) -> tuple[list, list[bytes | None], object]:
    """What a multi-process collector checks and packs in the main process before any worker starts:
    ``(factories, policy_payloads, module)`` — one cloudpickled env constructor per worker (``create_env_fn``
    is a list of them, or one with ``num_workers``), one policy payload per worker, the policy cloudpickled (None:
    random actions; with ``policy_factory``, the factory — or worker ``w``'s of a list of them, one per worker —
    as :class:`BuiltInWorker`) and the ``nn.Module`` holding the weights the workers act with (the ``policy``'s,
    which with a ``policy_factory`` is only read here; or None)."""
    check_env_device(env_device, owner)
    create_env_fn = copies_of_torchrl_instances(create_env_fn, owner)
    if num_workers is None:
        num_workers = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else 1
    factories = bind_kwargs(*constructors_and_kwargs(create_env_fn, num_workers, create_env_kwargs, owner,
                                                     "num_workers"))
    pickled = [PickledFactory(fn, owner, f"{unit} {w}") for w, fn in enumerate(factories)]
    if policy_factory is not None:
        per_worker = list(policy_factory) if isinstance(policy_factory, (list, tuple)) else None
        if per_worker is not None and len(per_worker) != num_workers:
            raise ValueError(f"{owner}: policy_factory is a list of {len(per_worker)} factories for {num_workers} "
                             f"{unit}s: pass one per {unit} (or one for all).")
        for factory in per_worker or [policy_factory]:
            if not callable(factory):
                raise TypeError(f"{owner}: policy_factory must be a function returning the policy (or a list of "
                                f"them, one per {unit}), got {type(factory).__name__}.")
        payloads = [cloudpickle.dumps(BuiltInWorker(factory)) for factory in per_worker or [policy_factory]]
    else:
        payloads = [cloudpickle.dumps(policy) if policy is not None else None]
    if len(payloads) == 1:
        payloads = payloads * num_workers
    return pickled, payloads, policy_module(policy) if policy is not None else None


def entries(batch: TensorDictBase, prefix: str = "") -> dict[str, tuple]:
    """``{key: (dtype, shape per step)}`` of a batch ``[n_envs, T]``; the parts of a lazy stack (heterogeneous
    entries, e.g. one per agent) one by one, as ``"<key> part <i>"``."""
    if isinstance(batch, LazyStackedTensorDict):
        return {name: entry for i, part in enumerate(batch.tensordicts)
                for name, entry in entries(part, f"{prefix} part {i}").items()}
    found = {}
    for key, value in batch.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        found.update(entries(value, name) if isinstance(value, TensorDictBase)
                     else {name: (value.dtype, tuple(value.shape[2:]))})
    return found


def check_same_entries(batches: dict[int, TensorDictBase], owner: str, unit: str) -> None:
    """Every worker's batches (``{worker: TensorDict [n_envs, T]}``) must have the same keys and, per key,
    the same dtype and per-step shape as the first worker's; else a
    :class:`~tdcollect.envs.errors.SpecMismatchError` naming the entries that differ."""
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


#: what the main process may call on a worker's :class:`~.loop.BatchLoop` (``CALL``; ``call_method`` runs TorchRL's
#: ``map_fn``, which names a method of the worker's collector)
LOOP_CALLS = ("set_seed", "reset_envs", "set_hooks", "load_policy_weights", "policy_state_dict", "call_method",
              "enable_profile")


def run_collector_worker(channel: WorkerChannel, factory, policy_payload, weights, versions, config) -> None:
    """Builds its env and policy copy (bound to the shared ``weights`` when it runs on the CPU, else pulling
    them at each batch); records in ``versions[w]`` the weights version each batch was collected with."""
    channel.start()
    env = None
    loop = None
    try:
        if config["init_fn"] is not None:  # TorchRL's init_fn: first thing in every worker
            cloudpickle.loads(config["init_fn"])()
        env, policy, module, unbatched = build_worker(factory, policy_payload, config["policy_device"],
                                                      config["owner"])
        env = with_policy_transforms(env, module, config["register_transforms"], config["owner"])
        policy = compiled(policy, config["compile_policy"])
        on_cpu = config["policy_device"] is None or torch.device(config["policy_device"]).type == "cpu"
        if weights is not None and on_cpu:
            weights.bind(module)
        local_params = TensorDict.from_module(module).data if weights is not None and not on_cpu else None
    except BaseException as exc:  # noqa: BLE001 - reported to the main process
        if env is not None:
            env.close()
        channel.fail_start(exc)
    try:
        try:
            hello = (env.batch_size.numel(), worker_specs(env), unbatched)
        except BaseException as exc:  # noqa: BLE001 - reported to the main process (the env closes below)
            channel.fail_start(exc, "start-up")
        steps = channel.hello(hello)
        if steps is None:
            return
        try:
            loop = BatchLoop(env, policy, steps, shared=True, inference_mode=True, **config["loop"])
            loop.set_hooks(config["hooks"])
            loop.worker_idx = channel.index
        except BaseException as exc:  # noqa: BLE001 - reported to the main process (the env closes below)
            channel.fail_start(exc, "start-up")
        version_held = -1

        def collect(random: bool) -> None:
            nonlocal version_held
            if local_params is not None:
                version_held = weights.pull(local_params, version_held)
            elif weights is not None:
                version_held = int(weights.version)
            versions[channel.index] = version_held
            config["unread"][channel.index] = 0
            batch = loop.collect(random)
            if config["steps_taken"] is not None:  # preemption: how far this worker got
                config["steps_taken"][channel.index] = loop.steps_taken
            return batch if loop.stacked else None  # a stacked batch goes by pipe (see stacked.py)

        if channel.ready(None if loop.stacked else loop.storage):
            channel.serve({COLLECT: lambda: collect(False), COLLECT_RANDOM: lambda: collect(True)},
                          {**{name: getattr(loop, name) for name in LOOP_CALLS},
                           "set_seed": functools.partial(loop.set_seed, seed_process=True)})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away
    finally:
        if loop is not None:
            loop.finish_profile()
        env.close()
