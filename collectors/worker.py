"""The process collectors' worker (MultiSync, MultiAsync): its env, its policy copy and a :class:`BatchLoop`
filling its storage in shared memory. Its messages and commands are part of the worker protocol
(``tdcollect/envs/protocol.py``): hello ``(n_envs, EnvSpecs of one env, unbatched)``, setup ``T``, ready its storage
``[n_envs, T]``; ``COLLECT`` / ``COLLECT_RANDOM`` fill the storage with the next ``T`` steps; ``CALL`` reaches
the loop. An env whose batches are stacked step by step (``stacked.py``) has no storage (ready: ``None``): each
``COLLECT`` answers with its batch, by pipe."""
from __future__ import annotations

import cloudpickle
import torch
from tensordict import TensorDict

from tdcollect.envs.protocol import COLLECT, COLLECT_RANDOM, WorkerChannel

from .env_setup import build_worker, worker_specs
from .loop import BatchLoop
from .options import compiled
from .policy_transforms import with_policy_transforms


def run_collector_worker(channel: WorkerChannel, factory, policy_payload, weights, versions, config) -> None:
    """Builds its env and policy copy (bound to the shared ``weights`` when it runs on the CPU, else pulling
    them at each batch); records in ``versions[w]`` the weights version each batch was collected with."""
    channel.start()
    env = None
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
        seen = -1

        def collect(random: bool) -> None:
            nonlocal seen
            if local_params is not None:
                seen = weights.pull(local_params, seen)
            elif weights is not None:
                seen = int(weights.version)
            versions[channel.index] = seen
            config["unread"][channel.index] = 0
            batch = loop.collect(random)
            if config["steps_taken"] is not None:  # preemption: how far this worker got
                config["steps_taken"][channel.index] = loop.steps_taken
            return batch if loop.stacked else None  # a stacked batch goes by pipe (see stacked.py)

        if channel.ready(None if loop.stacked else loop.storage):
            channel.serve({COLLECT: lambda: collect(False), COLLECT_RANDOM: lambda: collect(True)}, loop)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away
    finally:
        env.close()
