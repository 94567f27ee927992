""":class:`ParallelVectorEnv`: a ``gymnasium.vector.VectorEnv`` with ``AsyncVectorEnv``'s constructor arguments
(``env_fns, shared_memory, copy, context, daemon, observation_mode, autoreset_mode``) plus ``envs_per_worker``, on
ParallelEnv's workers (see the package docstring).
"""
from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from ..engine.user_warnings import warn_caller
from .core import EngineCore, EngineWorkers
from .errors import SpaceMismatchError
from .worker import DISABLED, FINAL, NEXT_STEP, RESET, SAME_STEP, STEP

_MODES = {AutoresetMode.NEXT_STEP: NEXT_STEP, AutoresetMode.SAME_STEP: SAME_STEP, AutoresetMode.DISABLED: DISABLED}


class ParallelVectorEnv(VectorEnv, EngineWorkers):
    """``len(env_fns)`` gymnasium envs in worker processes, as a ``gymnasium.vector.VectorEnv``.

    Args:
        env_fns: one constructor per env (lambdas and closures work under every start method); env ``i`` runs in
            worker ``i // envs_per_worker``.
        shared_memory: the spaces ``AsyncVectorEnv`` takes with it, and Graph and Sequence too. Values of Box, Discrete,
            MultiDiscrete, MultiBinary and Dict/Tuple of these always travel through shared buffers; Text, OneOf,
            Graph and Sequence travel pickled (one value per env per step); space classes of your own are refused
            at start-up unless ``shared_memory=False`` (then they travel pickled too). Pickled spaces are batched
            as gymnasium batches them (a tuple with one entry per env for Text, Graph, Sequence, OneOf, ...).
        copy: return copies of the observations (True) or views of the buffers, overwritten by the next call.
        context: start method, ``"fork"`` (the default on Linux), ``"forkserver"`` or ``"spawn"``.
        daemon: accepted for compatibility; the workers always end with this process (and may start their
            own child processes).
        observation_mode: ``"same"`` (every env's observation space equal), ``"different"`` (same shape and
            dtype, e.g. other bounds) or ``(observation_space, single_observation_space)``.
        autoreset_mode: ``AutoresetMode`` (or its value): ``NEXT_STEP`` (default), ``SAME_STEP`` (infos carry
            ``"final_obs"`` / ``"final_info"``) or ``DISABLED`` (reset ended envs with
            ``reset(options={"reset_mask": mask})``).
        envs_per_worker / num_workers: how the envs are split (they must multiply to ``len(env_fns)``); default:
            the most workers that divide the envs evenly and fit in the usable cores.
        timeout: seconds a worker may take for one command before the env is shut down (``WorkerTimeoutError``).
        max_restarts: replace dead or failing workers up to this many times in all (their envs come back reset,
            marked truncated); default 0: a dead worker is one ``WorkerDiedError``.
        spin_s, check_values: see ``ParallelEnv`` (``check_values=True``: NaN or infinite observations and rewards
            are a ``ValueError`` naming the env).

    Shapes: observations ``[num_envs, *single shape]`` (dicts / tuples of them for Dict / Tuple spaces); rewards
    float64 ``[num_envs]``; terminations, truncations bool ``[num_envs]``; infos a dict of ``[num_envs]`` arrays,
    each key ``k`` with a mask ``"_k"`` (gymnasium's layout). An exception in an env is raised here as a type
    that is both the env's own (e.g. ``ValueError``) and ``EnvWorkerError``.
    """

    closed_error = ClosedEnvironmentError

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        observation_mode: str | tuple = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        timeout: float = 120.0,
        max_restarts: int = 0,
        spin_s: float | None = None,
        check_values: bool = False,
    ):
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        if not (observation_mode in ("same", "different") or (
                isinstance(observation_mode, tuple) and len(observation_mode) == 2
                and all(isinstance(s, gym.Space) for s in observation_mode))):
            raise ValueError("Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                             f"observation space, actual got {observation_mode}")
        self.env_fns, self.shared_memory, self.copy, self.context, self.daemon = (
            env_fns, shared_memory, copy, context, daemon)
        self.observation_mode = observation_mode
        self._state: str | None = None  # "reset" / "step" / "call" while an *_async call is pending
        self._finish: Callable | None = None  # how the pending *_async call finishes (see _start)
        self._mode = _MODES[self.autoreset_mode]
        self._core = EngineCore(env_fns, owner=type(self).__name__, mode=self._mode, num_workers=num_workers,
                                envs_per_worker=envs_per_worker, start_method=context, timeout=timeout,
                                max_restarts=max_restarts, spin_s=spin_s, check_values=check_values,
                                pickled="gymnasium" if shared_memory else "any",
                                post_final_observation=self._mode == SAME_STEP)
        try:
            self._set_spaces(self._core.spaces)
        except BaseException:
            self._core.close()
            raise
        self.num_envs = self._core.num_envs

    def _set_spaces(self, per_env: list[dict]) -> None:
        first = per_env[0]
        n = len(per_env)
        self.single_action_space = first["action_space"]
        self.action_space = batch_space(self.single_action_space, n)
        for i, env in enumerate(per_env):
            if env["action_space"] != self.single_action_space:
                raise SpaceMismatchError(f"env {i} has action space {env['action_space']}, env 0 "
                                         f"{self.single_action_space}: all envs must share one action space.")
        observation_spaces = [env["observation_space"] for env in per_env]
        mode = self.observation_mode
        if isinstance(mode, tuple):
            self.observation_space, self.single_observation_space = mode
        elif mode == "same":
            self.single_observation_space = observation_spaces[0]
            for i, space in enumerate(observation_spaces):
                if space != self.single_observation_space:
                    raise SpaceMismatchError(  # gymnasium's words first: code written for AsyncVectorEnv reads them
                        f"{type(self).__name__}(..., observation_mode='same') however some of the sub-environments "
                        "observation spaces are not equivalent. If this is intentional, use "
                        f"`observation_mode='different'` instead (env {i} has observation space {space}, env 0 "
                        f"{self.single_observation_space}; 'different' allows spaces that differ in bounds but share "
                        "shape and dtype).")
            self.observation_space = batch_space(self.single_observation_space, n)
        else:
            self.single_observation_space = observation_spaces[0]
            self.observation_space = batch_differing_spaces(observation_spaces)
        if mode != "same":
            for i, space in enumerate(observation_spaces):
                if not is_space_dtype_shape_equiv(space, observation_spaces[0]):
                    raise SpaceMismatchError(f"env {i} has observation space {space}, env 0 {observation_spaces[0]}: "
                                             "their shapes or dtypes differ, so they cannot be batched.")
        self.metadata = {**first["metadata"], "autoreset_mode": self.autoreset_mode}
        self.render_mode = first["render_mode"]

    # ----------------------------------------------------------------- seeds
    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's ``np_random_seed`` (a tuple of ``num_envs``)."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of each env's ``np_random`` generator (a tuple of ``num_envs``)."""
        return self.get_attr("np_random")

    # ----------------------------------------------------------------- reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env, or those in ``options["reset_mask"]`` (bool ``[num_envs]``, at least one True); the
        other envs keep their state. ``seed``: an int (env ``i`` gets ``seed + i``) or one seed (or None) per env;
        ``options`` (less ``reset_mask``) go to every reset env. Returns ``(observations, infos)``: observations
        of all envs (the current ones where an env was not reset) and the reset envs' infos."""
        plan = self._reset_plan(seed, options)
        self._idle("reset")
        with self._closed_under("reset"):
            self._core.reset(*plan)
            return self._reset_result()

    def reset_async(self, seed: int | Sequence[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Begin :meth:`reset` on the workers and return; :meth:`reset_wait` returns its result."""
        plan = self._reset_plan(seed, options)
        self._idle("reset_async")
        self._start("reset", lambda: self._core.start_reset(*plan), self._core.finish_reset)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The result of the pending :meth:`reset_async`; ``multiprocessing.TimeoutError`` after ``timeout``
        seconds (the reset goes on: call ``reset_wait`` again, or ``close``)."""
        with self._closed_under("reset_wait"):
            self._wait("reset", timeout)
            return self._reset_result()

    def _reset_plan(self, seed, options) -> tuple:
        n = self.num_envs
        if seed is None:
            seeds = [None] * n
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"reset(seed=...) takes an int or one seed per env ({n}), got {len(seeds)} seeds.")
        mask = None
        if options is not None:
            options = dict(options)
            if "reset_mask" in options:
                mask = _checked_mask(options.pop("reset_mask"), n)
        return mask, seeds, [options] * n

    def _reset_result(self) -> tuple[Any, dict[str, Any]]:
        posts = self._core.reset_posts()
        infos: dict[str, Any] = {}
        for i in sorted(posts):
            infos = self._add_info(infos, posts[i], i)
        return self._core.observations.batch("root", self.copy), infos

    # ----------------------------------------------------------------- step
    def step(self, actions) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action (``actions``: a batch of the ``action_space``); returns
        ``(observations, rewards, terminations, truncations, infos)`` as the ``autoreset_mode`` defines them."""
        self._idle("step")
        with self._closed_under("step"):
            self._core.write_actions(actions)
            self._core.step()
            return self._step_result()

    def step_async(self, actions) -> None:
        """Check and write ``actions``, begin the step on the workers and return; :meth:`step_wait` returns it."""
        self._idle("step_async")
        with self._closed_under("step_async"):
            self._core.write_actions(actions)
        self._start("step", self._core.start_step, self._core.finish_step)

    def step_wait(self, timeout: float | None = None):
        """The result of the pending :meth:`step_async`; ``multiprocessing.TimeoutError`` after ``timeout``
        seconds (the step goes on: call ``step_wait`` again, or ``close``)."""
        with self._closed_under("step_wait"):
            self._wait("step", timeout)
            return self._step_result()

    def _step_result(self):
        core = self._core
        rewards = core.reward.astype(np.float64)
        terminations = core.terminated.copy()
        truncations = core.truncated.copy()
        posts = core.take_posts()
        infos: dict[str, Any] = {}
        if self._mode == SAME_STEP:
            observations = core.observations.batch("root", self.copy)
            ended = np.flatnonzero(core.done).tolist()
            if ended or posts:
                infos = self._same_step_infos(ended, posts or ({}, {}, {}))
        else:
            observations = core.observations.batch("next", self.copy)
            if posts:
                for i in sorted(posts[STEP]):
                    infos = self._add_info(infos, posts[STEP][i], i)
        return observations, rewards, terminations, truncations, infos

    def _same_step_infos(self, ended: list[int], posts) -> dict[str, Any]:
        """Step infos; an env that ended gets ``final_obs``, ``final_info`` (its step info) and its reset info."""
        step_infos = posts[STEP]
        reset_infos = posts[RESET]
        finals = posts[FINAL]
        per_env = dict(step_infos)
        for i in ended:
            final = finals[i] if i in finals else self._core.observations.row("next", i)
            per_env[i] = {"final_info": step_infos.get(i, {}), "final_obs": final, **reset_infos.get(i, {})}
        infos: dict[str, Any] = {}
        for i in sorted(per_env):
            infos = self._add_info(infos, per_env[i], i)
        return infos

    # ----------------------------------------------------------------- calls
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's attribute ``name`` (``get_wrapper_attr``), called with ``args``/``kwargs`` when callable."""
        self._idle("call")
        with self._closed_under("call"):
            return tuple(self._call(name, args, kwargs))

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Begin :meth:`call` on the workers and return; :meth:`call_wait` returns its result."""
        self._idle("call_async")
        _check_call_name(name)
        self._start("call", lambda: self._core.start_request("call", range(self.num_envs), (name, args, kwargs)),
                    self._core.finish_request)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The result of the pending :meth:`call_async` (``multiprocessing.TimeoutError`` after ``timeout`` s)."""
        with self._closed_under("call_wait"):
            return tuple(self._wait("call", timeout))

    def _call(self, name: str, args: tuple, kwargs: dict) -> list:
        _check_call_name(name)
        return self._core.request("call", range(self.num_envs), (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute ``name`` (as :meth:`call`: a method is called)."""
        return self.call(name)

    def set_attr(self, name: str, values: list | tuple | object) -> None:
        """Set ``name`` on every env (``set_wrapper_attr``): ``values`` a list/tuple of one value per env, or one
        value for all."""
        self._idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr takes one value for all envs or one per env ({self.num_envs}), got "
                             f"{len(values)} values.")
        with self._closed_under("set_attr"):
            self._core.request("set_wrapper_attr", range(self.num_envs), [(name, value) for value in values])

    def render(self) -> tuple[Any, ...] | None:
        """Each env's ``render()``."""
        return self.call("render")

    # ----------------------------------------------------------------- state
    def _idle(self, what: str) -> None:
        """Raise unless this env is open and no *_async call is pending."""
        self._check_open(what)
        if self._state is not None:
            raise AlreadyPendingCallError(f"Calling `{what}` while waiting for a pending call to `{self._state}` to "
                                          f"complete: call {self._state}_wait() first.", self._state)

    def _start(self, name: str, begin: Callable, finish: Callable) -> None:
        """``begin()`` the ``name`` call on the workers; :meth:`_wait` gives ``finish(timeout)``'s result."""
        with self._closed_under(f"{name}_async"):
            begin()
        self._state = name
        self._finish = finish

    def _wait(self, name: str, timeout: float | None):
        self._check_open(f"{name}_wait")
        if self._state != name:
            raise NoAsyncCallError(f"Calling `{name}_wait` without any prior call to `{name}_async`.", name)
        try:
            result = self._finish(timeout)
        except multiprocessing.TimeoutError:
            raise multiprocessing.TimeoutError(f"{name}_wait() timed out after {timeout} s; the {name} goes on: call "
                                               f"{name}_wait() again for its result, or close().") from None
        except BaseException:
            self._state = self._finish = None
            raise
        self._state = self._finish = None
        return result

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop the workers and free the shared memory. A pending ``*_async`` call is waited for (up to
        ``timeout`` s) unless ``terminate``; then the workers are stopped under it."""
        if self._state is not None:
            warn_caller(f"Calling `close` while waiting for a pending call to `{self._state}` to complete.")
            if not terminate:
                with contextlib.suppress(Exception):  # (its result is dropped; close goes on)
                    self._finish(timeout)
            self._state = self._finish = None
        self._core.close()

    def __del__(self):
        if not getattr(self, "closed", True) and "_core" in self.__dict__:
            self.close(terminate=True)

    def __repr__(self) -> str:
        core = self.__dict__.get("_core")
        split = f", workers={core.num_workers}x{core.envs_per_worker}" if core is not None else ""
        return f"{type(self).__name__}(num_envs={self.num_envs}{split})"


def _check_call_name(name: str) -> None:
    if name in ("reset", "step", "close"):
        raise ValueError(f"call({name!r}) would go around the vector env; use its {name}() method instead.")


def _checked_mask(mask, n: int) -> np.ndarray:
    """``options["reset_mask"]`` checked as gymnasium's vector envs check it, with their messages."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError("`options['reset_mask']` must contain a boolean array with at least one True value, got "
                         f"reset_mask={mask}")
    return mask.copy()
