"""TorchRL's collector arguments: which ones tdcollect's collectors take, what they mean here, and a clear error
for the few it refuses (never a silent ignore).

:func:`torchrl_options` takes the keyword arguments of a TorchRL collector that are not tdcollect's own and
returns :class:`BatchOptions` (what happens to every batch after it is collected, in the main process), having
checked the rest. The refused arguments, each with its reason, are in :data:`REFUSED`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tdcollect.envs.engine.user_warnings import warn_caller

from .trajectories import check_trajectory_options

#: TorchRL arguments refused when given a value other than their default: ``{name: (default, why / what instead)}``
REFUSED: dict[str, tuple[Any, str]] = {
    "reset_when_done": (True, "tdcollect's envs always reset a finished env in the same step (TorchRL's default)"),
    "weight_updater": (None, "weights reach the workers through shared memory: call update_policy_weights_()"),
    "weight_recv_schemes": (None, "weights reach the workers through shared memory: call update_policy_weights_()"),
    "collector_class": (None, "every worker runs tdcollect's own collector loop"),
    "worker_idx": (None, "a worker's index is set by the collector that starts it (Collector takes one)"),
    "backend_options": (None, "the process backend takes no options here"),
    "num_sub_threads": (1, "each worker steps its envs on one thread"),
}
#: accepted with any value: they change nothing on the CPU, where tdcollect's collectors run the envs
NO_EFFECT_ON_CPU = ("no_cuda_sync",)
#: accepted with any value: the batches are the same either way. tdcollect's collectors collect into buffers
#: allocated once (in shared memory) where the env's entries allow, and stack each step's TensorDict, as TorchRL's
#: use_buffers=False, where they do not (dynamic shapes, non-tensor entries: ``stacked.py``)
SAME_BATCHES = ("use_buffers",)


@dataclass
class BatchOptions:
    """What the main process does to each batch ``[*batch_dims, T]`` before yielding it, in TorchRL's order:
    ``set_truncated`` (the last step of every row ends its trajectory: ``("next", "truncated")`` and
    ``("next", "done")`` set), ``track_traj_ids`` (``("collector", "traj_ids")``), ``track_policy_version``
    (``"policy_version"`` and ``("next", "policy_version")``: int64, the weights version each frame was collected
    with), ``split_trajs``, the storing
    device, ``postproc``, ``post_collect_hook``; then a ``replay_buffer`` is extended with it (and the iteration
    yields ``None``, as TorchRL's does). ``pre_collect_hook()`` runs before each batch is collected."""
    postproc: Callable | None = None
    replay_buffer: Any = None
    extend_buffer: bool = True
    set_truncated: bool = False
    track_traj_ids: bool = True
    pre_collect_hook: Callable | None = None
    post_collect_hook: Callable | None = None
    update_at_each_batch: bool = False
    track_policy_version: bool = False
    #: TorchRL's whole-trajectory batches (``tdcollect/collectors/trajectories.py``); None: fixed-frame batches
    trajs_per_batch: int | None = None
    trajs_per_write: int | None = None
    traj_format: str = "padded"
    #: TorchRL's ``weight_sync_schemes`` as given (checked by :func:`checked_weight_schemes`); None: the default
    weight_sync_schemes: dict | None = None
    #: TorchRL's ``compact_obs``: the observation (and state) entries under ``"next"`` are left out of batches (the
    #: root of the next step holds them); reward and done flags stay
    compact_obs: bool = False


def torchrl_options(owner: str, *, postproc=None, replay_buffer=None, extend_buffer: bool = True,
                    set_truncated: bool = False, track_traj_ids: bool = True, pre_collect_hook=None,
                    post_collect_hook=None, update_at_each_batch: bool = False, track_policy_version: bool = False,
                    split_trajs=None,
                    return_same_td: bool = False, compile_policy=None, cudagraph_policy=None, trust_policy=None,
                    trajs_per_batch=None, trajs_per_write=None, traj_format=None, weight_sync_schemes=None,
                    built_in_policies: bool = False, compact_obs: bool = False, **rest) -> BatchOptions:
    """Check TorchRL's collector arguments (see the module docstring) and return the per-batch ones
    (``built_in_policies``: each worker builds its own policy, so per-worker weights are possible)."""
    for name, value in rest.items():
        if name in NO_EFFECT_ON_CPU or name in SAME_BATCHES:
            continue
        if name not in REFUSED:
            raise TypeError(f"{owner} got an unexpected keyword argument {name!r}.")
        default, why = REFUSED[name]
        if value is not default and value != default:
            raise ValueError(f"{owner} does not support {name}={value!r}: {why}.")
    if not isinstance(track_policy_version, bool):
        raise ValueError(f"{owner}: track_policy_version must be True or False (the collector counts the versions "
                         f"itself), got {type(track_policy_version).__name__}.")
    if cudagraph_policy:
        raise ValueError(f"{owner}: cudagraph_policy={cudagraph_policy!r} needs a CUDA policy device; tdcollect's "
                         "collectors run the policy where policy_device says (CUDA graphs are not supported); "
                         "use compile_policy=True instead, or leave cudagraph_policy unset.")
    for name, hook in (("postproc", postproc), ("pre_collect_hook", pre_collect_hook),
                       ("post_collect_hook", post_collect_hook)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{owner}: {name} must be callable, got {type(hook).__name__}.")
    if replay_buffer is not None:
        if not hasattr(replay_buffer, "extend"):
            raise TypeError(f"{owner}: replay_buffer must have an extend() method (a TorchRL ReplayBuffer), got "
                            f"{type(replay_buffer).__name__}.")
        if return_same_td:
            raise TypeError(f"{owner}: return_same_td must be False when a replay buffer is passed.")
        if not extend_buffer and (postproc is not None or split_trajs):
            raise TypeError(f"{owner}: postproc and split_trajs need extend_buffer=True with a replay buffer.")
    traj_format = check_trajectory_options(trajs_per_batch, trajs_per_write, traj_format, replay_buffer is not None,
                                           owner)
    if trajs_per_batch is not None and (split_trajs or not track_traj_ids):
        raise ValueError(f"{owner}: trajs_per_batch assembles trajectories by their ids: leave split_trajs=False and "
                         "track_traj_ids=True.")
    return BatchOptions(postproc, replay_buffer, bool(extend_buffer), bool(set_truncated), bool(track_traj_ids),
                        pre_collect_hook, post_collect_hook, bool(update_at_each_batch), bool(track_policy_version),
                        trajs_per_batch, trajs_per_write, traj_format,
                        checked_weight_schemes(weight_sync_schemes, owner, built_in_policies), bool(compact_obs))


def checked_weight_schemes(schemes, owner: str, built_in_policies: bool = False) -> dict | None:
    """TorchRL's ``weight_sync_schemes`` (``{"policy": scheme}``): tdcollect's collectors hand the policy's weights
    to their workers through one shared-memory copy, which is what TorchRL's ``SharedMemWeightSyncScheme`` (and
    its ``MultiProcessWeightSyncScheme``) ask for, so those are accepted, with per-worker weights where the workers
    build their own policies (``built_in_policies``); other schemes or models other than the policy are a clear
    error."""
    if schemes is None:
        return None
    from torchrl.weight_update import SharedMemWeightSyncScheme

    if not isinstance(schemes, dict):
        raise TypeError(f"{owner}: weight_sync_schemes must be a dict {{'policy': scheme}}, got "
                        f"{type(schemes).__name__}.")
    for name, scheme in schemes.items():
        if name != "policy":
            raise ValueError(f"{owner}: weight_sync_schemes[{name!r}]: only the policy's weights are sent to the "
                             "workers (key 'policy').")
        if not isinstance(scheme, SharedMemWeightSyncScheme) or (getattr(scheme, "per_worker_weights", False)
                                                                  and not built_in_policies):
            raise ValueError(f"{owner}: weight_sync_schemes['policy'] = {type(scheme).__name__}: tdcollect's "
                             "collectors send the policy's weights to every worker through one shared-memory copy "
                             "(TorchRL's SharedMemWeightSyncScheme or MultiProcessWeightSyncScheme; per-worker "
                             "weights with policies built in the workers by policy_factory); pass one of those or "
                             "leave weight_sync_schemes unset.")
    return dict(schemes)


def compiled(policy: Callable, compile_policy) -> Callable:
    """``torch.compile(policy, **options)`` for ``compile_policy=True`` or a dict of options, else ``policy``."""
    if compile_policy is None or compile_policy is False:  # TorchRL: {} compiles with default options
        return policy
    options = compile_policy if isinstance(compile_policy, dict) else {}
    return torch.compile(policy, **options)


def rounded_steps(frames_per_batch: int, n_envs: int, owner: str) -> int:
    """Steps per env for a batch of ``frames_per_batch`` frames over ``n_envs`` envs: rounded up, with TorchRL's
    warning, when it is not a multiple (the batch then holds more frames than asked)."""
    if not isinstance(frames_per_batch, int) or isinstance(frames_per_batch, bool) or frames_per_batch < 1:
        raise ValueError(f"{owner}: frames_per_batch must be a positive int, got {frames_per_batch!r}.")
    steps = math.ceil(frames_per_batch / n_envs)
    if steps * n_envs != frames_per_batch:
        warn_caller(f"{owner}: frames_per_batch ({frames_per_batch}) is not exactly divisible by the number of "
                    f"envs ({n_envs}); each batch holds {steps * n_envs} frames.")
    return steps


def per_worker_frames(frames_per_batch, num_workers: int, owner: str) -> tuple[int, list[int] | None]:
    """TorchRL's ``frames_per_batch`` for the process collectors: an int (the whole batch), or a sequence with one
    count per worker (its share of every batch). Returns ``(total, shares or None)``."""
    if isinstance(frames_per_batch, (list, tuple)):
        if len(frames_per_batch) != num_workers:  # TorchRL's words (its tests match them)
            raise ValueError("If `frames_per_batch` is provided as a sequence, it should contain exactly one value "
                             f"per worker. {owner}: got {len(frames_per_batch)} values for {num_workers} workers.")
        for frames in frames_per_batch:
            if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
                raise ValueError(f"{owner}: frames_per_batch[...] must be positive ints, got {frames_per_batch!r}.")
        return sum(frames_per_batch), list(frames_per_batch)
    return frames_per_batch, None


def one_device(value, owner: str, name: str):
    """A device argument that TorchRL's process collectors also take as a sequence, one per worker: the one device
    when every entry is the same (ours run every worker's policy and envs on one device, and gather into one)."""
    if not isinstance(value, (list, tuple)):
        return value
    devices = {torch.device(device) if device is not None else None for device in value}
    if len(devices) != 1:
        raise ValueError(f"{owner}: {name}={list(value)!r}: the workers must share one {name}; pass one device.")
    return devices.pop()
