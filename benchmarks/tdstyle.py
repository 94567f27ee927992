"""Benchmark runners for TorchRL-style (TensorDict based) batched envs.

The same code times both the TorchRL anchor and this project's own
``envs``/``collectors`` packages: each run takes a :class:`Backend`, a
record of the callables a library offers.  Factories handed to worker
processes must pickle under the library's start method, so backends build
them as ``functools.partial`` objects over module-level functions.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .workloads import WORKLOADS

#: Upper bound on the memory one ``rollout`` chunk may stack (bytes): a training loop's rollouts, not one
#: giant one.
ROLLOUT_CHUNK_BYTES = 64 * 2**20
#: Frames gathered by the collector per batch (summed over all workers).
FRAMES_PER_BATCH = 2048
WARMUP_STEPS = 10
#: Timed loops repeat their ``steps`` until at least this long has elapsed,
#: so very fast systems are not timed over a few milliseconds.
MIN_TIMED_SECONDS = 0.5


@dataclass(frozen=True)
class Backend:
    """How one TorchRL-style library builds what a benchmark needs.

    Attributes:
        name: prefix of the system names (``<name>_parallel`` ...).
        make_parallel: ``(workload, num_workers, envs_per_worker) -> env``,
            a batched env of ``num_workers`` worker processes.
        worker_env_factory: ``(workload, envs_per_worker) -> factory``, a
            picklable zero-argument callable building the env one collector
            worker owns.
        multi_sync_collector: the synchronous multi-process collector class.
        step_mdp: moves a step's ``"next"`` entries to the root.
    """

    name: str
    make_parallel: Callable
    worker_env_factory: Callable
    multi_sync_collector: Any
    step_mdp: Callable


def split_envs(num_envs: int, num_workers: int) -> int:
    """Envs per worker; ``num_envs`` must divide evenly among workers."""
    if num_workers < 1 or num_envs % num_workers:
        raise ValueError(f"num_envs={num_envs} is not a multiple of "
                         f"num_workers={num_workers}")
    return num_envs // num_workers


def obs_nbytes(workload: str) -> int:
    """Bytes of one observation of ``workload``."""
    space = WORKLOADS[workload]().observation_space
    return int(np.prod(space.shape)) * space.dtype.itemsize


@contextlib.contextmanager
def preserve_torch_threads():
    """Restore ``torch``'s intra-op thread count after the block.

    TorchRL's batched envs and collectors change the parent's thread count
    while they run; this keeps one benchmark from skewing the next.
    """
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def result(system, workload, num_envs, num_workers, envs_per_worker, steps,
           env_steps, seconds, **extra) -> dict:
    """Build the standard result record shared by every system.

    ``steps`` counts batched steps, ``env_steps`` single-env transitions;
    ``steps_per_s`` is env steps per second of timed wall clock.
    """
    record = {
        "system": system,
        "workload": workload,
        "num_workers": num_workers,
        "envs_per_worker": envs_per_worker,
        "num_envs": num_envs,
        "steps": steps,
        "env_steps": env_steps,
        "seconds": seconds,
        "steps_per_s": env_steps / seconds,
    }
    record.update(extra)
    return record


# -------------------------------------------------------------- parallel env
def run_parallel(backend: Backend, workload: str, num_envs: int,
                 num_workers: int, steps: int) -> dict:
    """Time ``env.rollout`` with random actions on a parallel env.

    Each worker holds ``num_envs // num_workers`` envs.  Long rollouts of
    big observations are cut into chunks (each continued from the last one
    with ``step_mdp``) so the stacked output stays under
    :data:`ROLLOUT_CHUNK_BYTES`; for vector workloads it is one chunk.
    When there are several chunks, two are run before the clock starts, as a
    training loop's first rollouts (a library may reuse memory from there
    on, as the collectors get a warm-up batch). At least ``steps`` batched steps are timed, more
    if needed to fill :data:`MIN_TIMED_SECONDS`.
    """
    envs_per_worker = split_envs(num_envs, num_workers)
    per_step = max(1, 2 * num_envs * obs_nbytes(workload))
    chunk = max(1, min(steps, ROLLOUT_CHUNK_BYTES // per_step))
    with preserve_torch_threads():
        env = backend.make_parallel(workload, num_workers, envs_per_worker)
        try:
            env.set_seed(0)
            td = env.reset()
            warm_steps = chunk if chunk < steps else WARMUP_STEPS  # one chunk: a short warm-up
            for _ in range(2):
                warm = env.rollout(warm_steps, break_when_any_done=False,
                                   auto_reset=False, tensordict=td)
                td = backend.step_mdp(warm[..., -1])
            del warm
            done, seconds = 0, 0.0
            start = time.perf_counter()
            while done < steps or seconds < MIN_TIMED_SECONDS:
                # whole chunks: a loop of rollouts of one length
                out = env.rollout(chunk, break_when_any_done=False,
                                  auto_reset=False, tensordict=td)
                td = backend.step_mdp(out[..., -1])
                done += chunk
                seconds = time.perf_counter() - start
        finally:
            env.close()
    return result(f"{backend.name}_parallel", workload, num_envs, num_workers,
                  envs_per_worker, done, done * num_envs, seconds,
                  processes=num_workers, rollout_chunk=chunk)


# ----------------------------------------------------------------- collector
class MLPActor(nn.Module):
    """2x64 tanh MLP sampling a categorical action from the observation.

    Works for vector and image observations alike: the trailing
    ``len(obs_shape)`` dims are flattened, ``uint8`` inputs are scaled to
    [0, 1], and leading batch dims are kept.
    """

    def __init__(self, obs_shape, n_actions: int, hidden: int = 64):
        super().__init__()
        self.obs_ndim = len(obs_shape)
        self.net = nn.Sequential(
            nn.Linear(int(math.prod(obs_shape)), hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, n_actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / 255.0 if obs.dtype == torch.uint8 else 1.0
        x = obs.flatten(-self.obs_ndim).to(torch.float32) * scale
        logits = self.net(x)
        return torch.distributions.Categorical(logits=logits).sample()


class CNNActor(nn.Module):
    """A small convolutional actor for image observations (``[H, W, C]`` or ``[C, H, W]``, ``uint8`` scaled to
    [0, 1]): two strided convolutions, a 64-unit layer, a Categorical sample over ``n_actions``."""

    def __init__(self, obs_shape, n_actions: int):
        super().__init__()
        self.channels_last = obs_shape[-1] <= 4 < obs_shape[0]
        channels = obs_shape[-1] if self.channels_last else obs_shape[0]
        self.conv = nn.Sequential(nn.Conv2d(channels, 16, 8, stride=4), nn.ReLU(),
                                  nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(self._images(torch.zeros(1, *obs_shape))).shape[-1]
        self.head = nn.Sequential(nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, n_actions))

    def _images(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32) * (1.0 / 255.0 if obs.dtype == torch.uint8 else 1.0)
        return x.movedim(-1, -3) if self.channels_last else x

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[:-3]
        logits = self.head(self.conv(self._images(obs.reshape(-1, *obs.shape[-3:]))))
        return torch.distributions.Categorical(logits=logits.reshape(*batch, -1)).sample()


class GaussianActor(nn.Module):
    """2x64 tanh MLP giving the mean of a unit Gaussian; samples squashed by tanh into ``[low, high]``."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, int(np.prod(low.shape))))
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.net(obs.to(torch.float32))
        squashed = torch.tanh(mean + torch.randn_like(mean))
        return self.low + (squashed + 1) * 0.5 * (self.high - self.low)


#: Workloads whose collector policy is :class:`CNNActor` (the synthetic ``pixels`` keeps the MLP, as in the
#: published table).
CNN_WORKLOADS = ("atari", "atari84")


def make_policy(backend: Backend, workload: str):
    """A ``TensorDictModule`` actor reading the workload's observation key: an MLP (Categorical actions), a small
    CNN (the Atari workloads) or a Gaussian MLP (continuous actions).

    The key (e.g. ``"observation"`` or ``"pixels"``) and the observation
    shape are read from a throw-away env built by the backend's factory.
    """
    from tensordict.nn import TensorDictModule

    probe = backend.worker_env_factory(workload, 1)()
    try:
        (obs_key,) = list(probe.observation_spec.keys())
        spec_shape = probe.observation_spec[obs_key].shape
        obs_shape = tuple(spec_shape[len(probe.batch_size):])
    finally:
        probe.close()
    space = WORKLOADS[workload]().action_space
    if not hasattr(space, "n"):
        actor = GaussianActor(int(math.prod(obs_shape)), space.low, space.high)
    elif workload in CNN_WORKLOADS:
        actor = CNNActor(obs_shape, int(space.n))
    else:
        actor = MLPActor(obs_shape, int(space.n))
    return TensorDictModule(actor, in_keys=[obs_key], out_keys=["action"])


def build_collector(backend: Backend, workload: str, num_workers: int,
                    envs_per_worker: int, random_policy: bool = False):
    """A synchronous multi-process collector with the workload's policy (see :func:`make_policy`), or with
    ``random_policy`` none (random actions from the action spec)."""
    factory = backend.worker_env_factory(workload, envs_per_worker)
    return backend.multi_sync_collector(
        [factory] * num_workers,
        None if random_policy else make_policy(backend, workload),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
    )


def time_batches(collector, batches: int) -> tuple[int, float]:
    """``(frames, seconds)`` of ``batches`` batches of ``collector``, after one warm-up batch."""
    iterator = iter(collector)
    next(iterator)
    frames = 0
    start = time.perf_counter()
    for _ in range(batches):
        frames += next(iterator).numel()
    return frames, time.perf_counter() - start


def run_collector(backend: Backend, workload: str, num_envs: int,
                  num_workers: int, steps: int, random_policy: bool = False) -> dict:
    """Time a multi-sync collector: frames/s after one warm-up batch.

    The number of timed batches is chosen so that roughly
    ``num_envs * steps`` frames are collected (at least two batches).
    """
    envs_per_worker = split_envs(num_envs, num_workers)
    batches = max(2, math.ceil(num_envs * steps / FRAMES_PER_BATCH))
    with preserve_torch_threads():
        collector = build_collector(backend, workload, num_workers,
                                    envs_per_worker, random_policy)
        try:
            frames, seconds = time_batches(collector, batches)
        finally:
            collector.shutdown()
    name = f"{backend.name}_random_collector" if random_policy else f"{backend.name}_collector"
    return result(name, workload, num_envs, num_workers,
                  envs_per_worker, frames // num_envs, frames, seconds,
                  processes=num_workers, batches=batches)


# ------------------------------------------------------- the public step path
#: Random actions drawn before the timed loop and cycled through (drawing costs the user's policy, not the env).
ACTION_BLOCK = 256


def run_step_loop(backend: Backend, workload: str, num_envs: int,
                  num_workers: int, steps: int) -> dict:
    """Time a user loop on the public API: ``td["action"] = ...; _, td =
    env.step_and_maybe_reset(td)`` (what TorchRL's collectors and most user
    loops call), with actions drawn beforehand."""
    envs_per_worker = split_envs(num_envs, num_workers)
    with preserve_torch_threads():
        env = backend.make_parallel(workload, num_workers, envs_per_worker)
        try:
            env.set_seed(0)
            actions = [env.full_action_spec.rand()["action"] for _ in range(ACTION_BLOCK)]
            td = env.reset()
            for t in range(WARMUP_STEPS):
                td["action"] = actions[t]
                _, td = env.step_and_maybe_reset(td)
            done, seconds = 0, 0.0
            start = time.perf_counter()
            while done < steps or seconds < MIN_TIMED_SECONDS:
                td["action"] = actions[done % ACTION_BLOCK]
                _, td = env.step_and_maybe_reset(td)
                done += 1
                if done % 64 == 0:
                    seconds = time.perf_counter() - start
            seconds = time.perf_counter() - start
        finally:
            env.close()
    return result(f"{backend.name}_step_loop", workload, num_envs, num_workers,
                  envs_per_worker, done, done * num_envs, seconds,
                  processes=num_workers)


def run_torchrl_collector_over(backend: Backend, workload: str, num_envs: int,
                               num_workers: int, steps: int) -> dict:
    """TorchRL's own single-process ``Collector`` over
    ``TransformedEnv(<backend's ParallelEnv>, StepCounter())`` with the MLP
    policy (sampling): frames/s after one warm-up batch."""
    from torchrl.collectors import Collector
    from torchrl.envs import StepCounter, TransformedEnv

    envs_per_worker = split_envs(num_envs, num_workers)
    batches = max(2, math.ceil(num_envs * steps / FRAMES_PER_BATCH))
    with preserve_torch_threads():
        env = TransformedEnv(backend.make_parallel(workload, num_workers, envs_per_worker), StepCounter())
        collector = Collector(env, make_policy(backend, workload), frames_per_batch=FRAMES_PER_BATCH,
                              total_frames=-1)
        try:
            frames, seconds = time_batches(collector, batches)
        finally:
            collector.shutdown()
            env.close(raise_if_closed=False)  # the collector may have closed it already
    return result(f"{backend.name}_in_torchrl_collector", workload, num_envs, num_workers,
                  envs_per_worker, frames // num_envs, frames, seconds,
                  processes=num_workers, batches=batches)
