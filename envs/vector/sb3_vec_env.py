"""tdcollect's engine as a Stable-Baselines3 ``VecEnv`` (needs ``pip install "tdcollect[sb3]"``).

    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from tdcollect.envs.vector import ParallelVecEnv

    env = make_vec_env("CartPole-v1", n_envs=64, vec_env_cls=ParallelVecEnv)   # 2 workers x 32 envs on 2 cores
    model = PPO("MlpPolicy", env).learn(100_000)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from ..engine.user_warnings import warn_caller
from .core import EngineCore, EngineWorkers
from .worker import RESET, SAME_STEP, STEP

__all__ = ["ParallelVecEnv"]


def patch_env(env):
    """What Stable-Baselines3's own vec envs do to each env (envs of the older gym API converted), in the worker;
    nothing when this SB3 version has no such step."""
    try:
        from stable_baselines3.common.vec_env.patch_gym import _patch_env
    except ImportError:
        return env
    return _patch_env(env)


class ParallelVecEnv(VecEnv, EngineWorkers):
    """``len(env_fns)`` envs in worker processes, several per worker, as a Stable-Baselines3 ``VecEnv``.

    Args:
        env_fns: one constructor per env (what ``make_vec_env`` passes); env ``i`` runs in worker
            ``i // envs_per_worker``, built there (never in this process).
        start_method: ``"fork"`` (default on Linux: fastest start), ``"forkserver"`` or ``"spawn"``; checked
            before anything starts (a ``ValueError`` naming the choices).
        envs_per_worker / num_workers: how the envs are split (they must multiply to ``len(env_fns)``); default:
            the most workers that divide the envs evenly and fit in the usable cores.
        timeout: seconds a worker may take for one command before the env is shut down (``WorkerTimeoutError``).
        max_restarts: replace dead or failing workers up to this many times in all (their envs come back reset
            and report ``done`` with ``TimeLimit.truncated``); default 0: a dead worker is one ``WorkerDiedError``.
        spin_s, check_values: see ``ParallelEnv``.

    ``step_wait()`` returns ``(obs, rewards float32 [n], dones bool [n], infos)``: ``obs`` the observation to act
    on (the reset one where an env ended), ``infos[i]`` the env's own info plus ``"TimeLimit.truncated"`` and,
    where it ended, ``"terminal_observation"``; the reset info is in ``reset_infos[i]``. ``step_async`` checks and
    writes the actions; the envs step in ``step_wait``.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], start_method: str | None = None, *,
                 envs_per_worker: int | None = None, num_workers: int | None = None, timeout: float = 120.0,
                 max_restarts: int = 0, spin_s: float | None = None, check_values: bool = False):
        self.waiting = False
        self.closed = False
        self._core = EngineCore(env_fns, owner=type(self).__name__, mode=SAME_STEP, num_workers=num_workers,
                                envs_per_worker=envs_per_worker, start_method=start_method, timeout=timeout,
                                max_restarts=max_restarts, spin_s=spin_s, wrap_env=patch_env, check_values=check_values)
        try:
            first = self._core.spaces[0]
            super().__init__(self._core.num_envs, first["observation_space"], first["action_space"])
        except BaseException:
            self._core.close()
            raise

    # ----------------------------------------------------------------- stepping
    def reset(self) -> VecEnvObs:
        """Reset every env (with the seeds of ``seed()`` and the options of ``set_options()``, then forgotten);
        the observations, and each env's reset info in ``reset_infos``."""
        self._check_idle("reset")
        options = [options or None for options in self._options]
        with self._closed_under("reset"):
            self._core.reset(None, list(self._seeds), options)
            posts = self._core.reset_posts()
            observations = self._core.observations.batch("root")
        self.reset_infos = [posts.get(i, {}) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return observations

    def step_async(self, actions: np.ndarray) -> None:
        """Check ``actions`` (``[num_envs, ...]``), write them into the shared buffers and begin the step on the
        workers (this process is free until ``step_wait``; no other call to the envs until then)."""
        self._check_idle("step_async")
        with self._closed_under("step_async"):
            self._core.write_actions(actions)
            self._core.start_step()
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """The results of the step ``step_async`` began."""
        if not self.waiting:
            raise RuntimeError("step_wait() was called with no step_async() before it.")
        self.waiting = False
        with self._closed_under("step_wait"):
            return self._step_result()

    def _step_result(self) -> VecEnvStepReturn:
        """The step begun, finished; SB3's step results."""
        core = self._core
        core.finish_step()
        posts = core.take_posts() or ({}, {}, {})
        done = core.done.copy()
        time_limit = (core.truncated & ~core.terminated).tolist()
        infos = [{"TimeLimit.truncated": limit} for limit in time_limit]
        for i, info in posts[STEP].items():
            infos[i] = {**info, "TimeLimit.truncated": time_limit[i]}
        for i in np.flatnonzero(done).tolist():
            infos[i]["terminal_observation"] = core.observations.row("next", i)
            self.reset_infos[i] = posts[RESET].get(i, {})
        return core.observations.batch("root"), core.reward.copy(), done, infos

    def close(self) -> None:
        """Stop the workers and free the shared memory; idempotent."""
        if self.closed:
            return
        self._core.close()
        self.closed = True
        self.waiting = False

    # ----------------------------------------------------------------- calls
    def _indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        chosen = [indices] if isinstance(indices, (int, np.integer)) else list(indices)
        for i in chosen:
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"env index {i} is out of range for {self.num_envs} envs.")
        return [int(i) % self.num_envs for i in chosen]

    def _request(self, op: str, indices: Iterable[int], args: tuple = ()) -> list:
        self._check_idle(op)
        with self._closed_under(op):
            return self._core.request(op, indices, args)

    def _check_idle(self, what: str) -> None:
        """Raise unless this env is open and no step is under way (``step_async`` without its ``step_wait``)."""
        self._check_open(what)
        if self.waiting:
            raise RuntimeError(f"{what}() was called between step_async() and step_wait(): the step is under way in "
                               "the workers; call step_wait() first.")

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """``attr_name`` of each env (``get_wrapper_attr``: the outermost wrapper that has it)."""
        return self._request("get_attr", self._indices(indices), (attr_name,))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` on each env's outermost wrapper."""
        self._request("setattr", self._indices(indices), (attr_name, value))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Call ``method_name(*method_args, **method_kwargs)`` on each env; the results."""
        return self._request("env_method", self._indices(indices), (method_name, method_args, method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each env is wrapped (at any depth) in ``wrapper_class``."""
        return self._request("is_wrapped", self._indices(indices), (wrapper_class,))

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has ``attr_name``."""
        return all(self._request("has_attr", range(self.num_envs), (attr_name,)))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame (``render_mode="rgb_array"``; else a warning and Nones)."""
        if self.render_mode != "rgb_array":
            warn_caller(f"get_images() needs render_mode 'rgb_array'; the envs' render_mode is {self.render_mode!r}.")
            return [None] * self.num_envs
        return self._request("render", range(self.num_envs))

    def __del__(self):
        if not getattr(self, "closed", True) and "_core" in self.__dict__:
            self.close()

    def __repr__(self) -> str:
        core = self.__dict__.get("_core")
        split = f", workers={core.num_workers}x{core.envs_per_worker}" if core is not None else ""
        return f"{type(self).__name__}(num_envs={getattr(self, 'num_envs', '?')}{split})"
