"""The worker side of the vector faces (``gymnasium_vector.py``, ``sb3_vec_env.py``): what runs inside ParallelEnv's
workers.

Each user env is built in its worker by a :class:`WorkerFactory` and stepped by the engine behind an
:class:`EngineEnv`, which adds what the facades need on top of the engine's steps:

- **posts**: every non-empty info dict an env returns is pickled and posted for the main process (kind ``STEP``: the
  step's info; ``RESET``: the info of a reset; ``FINAL``: the raw final observation, when the facade asks for it).
  The engine carries the posts with the worker's answer to the step or reset (``EnvGroup.take_posts``), and a
  worker whose envs posted nothing sends no answer: envs without infos cost one ``if`` per step.
- **autoreset modes**: the engine resets an env in the step where it ended, through :meth:`EngineEnv.engine_autoreset`
  (see ``libs/gym.py``). ``SAME_STEP`` resets it then; ``NEXT_STEP`` keeps the final state for one more step and
  resets on the following one (whose action is ignored); ``DISABLED`` keeps the final state until the main process
  asks for a reset. ``reset()`` runs only the resets the main process asks for (and a restarted worker's first one;
  after a step that restarted workers, the main process gives their envs ``NEXT_STEP``'s reset step itself, see
  ``core.EngineCore.step``).
- **observation spaces** as the engine sees them (:func:`engine_space`): bounds dropped (envs of one batch may
  differ in bounds), ``Discrete``/``MultiDiscrete`` as integer ``Box`` (values are moved as they are, no
  ``start`` shift), unsigned integers wider than a byte in a wider signed type (:data:`WIDENED`), a
  ``Dict``/``Tuple`` under one key ``"obs"``.
- **pickled spaces** (:func:`travels_pickled`; ``pickled="any"``: gymnasium's ``shared_memory=False``, any space
  the buffers cannot hold, e.g. Text, Graph, Sequence, OneOf, a space class of the user's own; ``"gymnasium"``:
  its ``shared_memory=True``, the same but for a space class of the user's own; ``None``: none) are
  given to the engine as the one-byte :data:`PLACEHOLDER`; each observation the engine gets is posted pickled
  (``NEXT_OBS`` from a step, ``ROOT_OBS`` from a reset). Such an action space is a :data:`PLACEHOLDER` too: the
  main process sends each env's action with the ``set_action`` call before the step.
- **calls**: :meth:`EngineEnv.serve_requests` runs requests (``get_attr``, ``env_method``, ...) on its env; the
  main process reaches it through ParallelEnv's ``env_attribute``. Every result comes back pickled, or as the
  exception it raised, so one bad value never breaks the exchange.
"""
from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..engine.errors import pickled_exception
from ..engine.group import env_index
from ..libs import native_env

SAME_STEP = "same-step"
NEXT_STEP = "next-step"
DISABLED = "disabled"
#: kinds of posts (see the module docstring)
STEP = 0
RESET = 1
FINAL = 2
NEXT_OBS = 3
ROOT_OBS = 4
#: what the engine holds for a space it cannot (pickled spaces, see the module docstring); its value is always 0
PLACEHOLDER = spaces.Box(0, 1, (1,), np.uint8)
_PLACEHOLDER_VALUE = np.zeros(1, np.uint8)
_NO_INFO: dict = {}  # what EngineEnv hands the engine as info (the engine ignores it; infos are posted)


class UnsupportedSpaceError(TypeError, ValueError):
    """A space the shared buffers cannot hold (anything but Box, Discrete, MultiDiscrete, MultiBinary, Dict,
    Tuple)."""


# ----------------------------------------------------------------- spaces
def engine_space(space: spaces.Space, pickled: str | None = None) -> spaces.Space:
    """The observation space the engine is given for an env whose own space is ``space`` (see the module
    docstring); :data:`PLACEHOLDER` when it travels pickled (:func:`travels_pickled`); raises
    :class:`UnsupportedSpaceError` for other spaces the shared buffers cannot hold."""
    if travels_pickled(space, pickled):
        return PLACEHOLDER
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return spaces.Dict({"obs": _buffer_space(space)})
    return _buffer_space(space)


def travels_pickled(space: spaces.Space, pickled: str | None) -> bool:
    """Whether values of ``space`` travel pickled: the buffers cannot hold them, and ``pickled`` is ``"any"``, or
    ``"gymnasium"`` and every space in it (at any depth) is one of gymnasium's classes or a subclass of one (Text,
    OneOf, Graph, Sequence, ...; not a space class of the user's own, which ``AsyncVectorEnv(shared_memory=True)``
    refuses)."""
    if pickled is None:
        return False
    try:
        _buffer_space(space)
    except UnsupportedSpaceError:
        return pickled == "any" or _gymnasium_classes(space)
    return False


def _gymnasium_classes(space: spaces.Space) -> bool:
    if isinstance(space, (spaces.Dict, spaces.Tuple, spaces.OneOf)):
        return all(_gymnasium_classes(sub) for sub in (space.spaces.values() if isinstance(space, spaces.Dict)
                                                         else space.spaces))
    if isinstance(space, (spaces.Sequence, spaces.Graph)):
        subs = [space.feature_space] if isinstance(space, spaces.Sequence) else [space.node_space, space.edge_space]
        return all(sub is None or _gymnasium_classes(sub) for sub in subs)
    return isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Text))


#: integer dtypes the buffers hold in a wider signed type (the main process casts them back)
WIDENED = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64),
           np.dtype(np.uint64): np.dtype(np.int64)}


def _buffer_space(space: spaces.Space) -> spaces.Space:
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return spaces.Box(-np.inf, np.inf, shape=space.shape, dtype=space.dtype)
    integer_spaces = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete)
    if isinstance(space, integer_spaces) and np.issubdtype(space.dtype, np.integer):
        dtype = WIDENED.get(np.dtype(space.dtype), space.dtype)
        info = np.iinfo(dtype)
        return spaces.Box(info.min, info.max, shape=space.shape, dtype=dtype)
    if isinstance(space, spaces.Box):
        return space
    if isinstance(space, spaces.MultiBinary):
        return space
    if isinstance(space, spaces.Dict):
        return spaces.Dict({key: _buffer_space(sub) for key, sub in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return spaces.Tuple([_buffer_space(sub) for sub in space.spaces])
    dynamic = isinstance(space, (spaces.Text, spaces.Sequence, spaces.Graph, spaces.OneOf))
    raise UnsupportedSpaceError(
        f"observation space {space!r} cannot be moved through shared memory"
        # gymnasium's AsyncVectorEnv says this for such spaces, and code written for it looks for these words
        f"{' (it has a dynamic shape so its not possible to make a static shared memory.)' if dynamic else ''}: "
        "the vector facades support Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of these; "
        "ParallelVectorEnv(..., shared_memory=False) sends any other space's values pickled."
    )


def engine_action_space(space: spaces.Space) -> tuple[spaces.Space, Callable | None]:
    """``(the action space the engine is given, a function casting its actions back, or None)``: a Box or
    MultiDiscrete of a :data:`WIDENED` dtype (at any depth of a Dict/Tuple) is given in the wider type, which
    the buffers can hold."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        names = list(space.spaces) if isinstance(space, spaces.Dict) else list(range(len(space.spaces)))
        parts = {name: engine_action_space(space[name]) for name in names}
        casts = {name: cast for name, (_, cast) in parts.items() if cast is not None}
        if not casts:
            return space, None
        if isinstance(space, spaces.Dict):
            wide = spaces.Dict({name: sub for name, (sub, _) in parts.items()})
            return wide, lambda a: {name: casts[name](v) if name in casts else v for name, v in a.items()}
        wide = spaces.Tuple([parts[j][0] for j in names])
        return wide, lambda a: tuple(casts[j](v) if j in casts else v for j, v in enumerate(a))
    dtype = np.dtype(space.dtype) if isinstance(space, (spaces.Box, spaces.MultiDiscrete)) else None
    if dtype not in WIDENED:
        return space, None
    wide = WIDENED[dtype]
    if isinstance(space, spaces.Box):
        wide_space = spaces.Box(space.low.astype(wide), space.high.astype(wide), dtype=wide)
    else:
        wide_space = spaces.MultiDiscrete(space.nvec.astype(wide), dtype=wide, start=space.start.astype(wide))
    return wide_space, lambda a: np.asarray(a).astype(dtype)


# ----------------------------------------------------------------- the env the engine steps
class EngineEnv(gym.Env):
    """The user's env (``self.env``) as the engine steps it, with the facade's autoreset ``mode``; posts infos
    (``post_final_observation``: also the final observation of a non-Box space, as the env returned it;
    ``pickled``: spaces the buffers cannot hold travel pickled, see the module docstring)."""

    def __init__(self, env: gym.Env, index: int, mode: str, post_final_observation: bool, pickled: str | None = None):
        self.env = env
        self._stepped = native_env(env)  # what steps and resets it: env, or a family's native stand-in for it
        self.index = index
        self.mode = mode
        # a Box observation is read back from the buffers exactly; any other is posted as the env returned it
        self.post_final_observation = post_final_observation and not isinstance(env.observation_space, spaces.Box)
        self.observation_space = engine_space(env.observation_space, pickled)
        self._posts_obs = self.observation_space is PLACEHOLDER
        if travels_pickled(env.action_space, pickled):
            self.action_space = PLACEHOLDER
            self._cast_action = None
        else:
            self.action_space, self._cast_action = engine_action_space(env.action_space)
        self._sent_action = None  # the next action, when actions travel pickled (``set_action``)
        self._nested = isinstance(env.observation_space, (spaces.Dict, spaces.Tuple)) and not self._posts_obs
        self._reset_on_step = False  # NEXT_STEP: the next step resets the env instead of stepping it
        self._final = None  # the final observation, given back when a reset is held back
        self._pending: tuple | None = None  # (seed, options) for the next reset the main process asks for
        self.posts: dict[int, bytes] = {}  # kind -> pickled value, until the engine takes them

    def take_posts(self) -> dict[int, bytes]:
        """``{kind: pickled value}`` posted since the last call (empty: none); the engine sends them with the
        worker's answer (see ``EnvGroup.take_posts``)."""
        posts = self.posts
        if posts:
            self.posts = {}
        return posts

    def _post(self, kind: int, value) -> None:
        try:
            self.posts[kind] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - one clear error for any pickling failure
            what = {FINAL: "final observation", NEXT_OBS: "observation", ROOT_OBS: "observation"}.get(kind, "info")
            raise TypeError(f"env {self.index}: its {what} cannot be sent to the main process "
                            f"({type(exc).__name__}: {exc}); return picklable values.") from exc

    def _out(self, obs, kind: int):
        """``obs`` as the engine takes it: under ``"obs"`` for a Dict/Tuple space; for a pickled space, posted
        (``kind``: ``NEXT_OBS`` or ``ROOT_OBS``) and :data:`PLACEHOLDER`'s value for the engine."""
        if self._posts_obs:
            self._post(kind, obs)
            return _PLACEHOLDER_VALUE
        return {"obs": obs} if self._nested else obs

    def step(self, action):
        if self._reset_on_step:
            self._reset_on_step = False
            obs, info = self._stepped.reset()
            if info:
                self._post(STEP, info)
            return self._out(obs, NEXT_OBS), 0.0, False, False, _NO_INFO
        if self.action_space is PLACEHOLDER:
            action, self._sent_action = self._sent_action, None
        elif self._cast_action is not None:
            action = self._cast_action(action)
        obs, reward, terminated, truncated, info = self._stepped.step(action)
        if info:
            self._post(STEP, info)
        if terminated or truncated:
            self._final = obs
            if self.post_final_observation:
                self._post(FINAL, obs)
        return self._out(obs, NEXT_OBS), reward, terminated, truncated, _NO_INFO

    def reset(self, *, seed=None, options=None):
        """A reset the main process asked for (with the ``(seed, options)`` of ``prepare_reset``, if any), or a
        restarted worker's first one."""
        self._reset_on_step = False
        self._final = None
        if self._pending is not None:
            seed, options = self._pending
            self._pending = None
        obs, info = self._stepped.reset(seed=seed, options=options)
        if info:
            self._post(RESET, info)
        return self._out(obs, ROOT_OBS), _NO_INFO

    def engine_autoreset(self):
        """The engine's reset right after the step that ended an episode, as ``mode`` says."""
        if self.mode == SAME_STEP:
            obs, info = self._stepped.reset()
            if info:
                self._post(RESET, info)
            return self._out(obs, ROOT_OBS), _NO_INFO
        self._reset_on_step = self.mode == NEXT_STEP
        return self._out(self._final, ROOT_OBS), _NO_INFO  # NEXT_STEP, DISABLED: the final state for now

    def serve_requests(self, requests: dict) -> list[tuple]:
        """Run this env's entries of ``requests`` (``{env index: [(position, op, args)]}``, see :data:`OPS`), in
        order; ``[(position, ok, blob, text)]``: ``ok`` True and ``blob`` the pickled result, or ``ok`` False and
        ``blob`` the pickled exception (None if it cannot be pickled) with ``text`` its type, message and
        traceback. The main process sends every env the same dict through ParallelEnv's ``env_attribute``."""
        out = []
        for position, op, args in requests.get(self.index, ()):
            try:
                value = OPS[op](self, *args)
                out.append((position, True, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), ""))
            except Exception as exc:  # noqa: BLE001 - sent back to the main process, raised there
                out.append((position, False, pickled_exception(exc), _describe(exc)))
        return out

    def close(self):
        self.env.close()


class WorkerFactory:
    """The constructor ParallelEnv gets for a worker whose first env is env ``first_index``: builds each of the
    worker's envs from its own function of ``env_fns`` (one per env, in order; which one: ``group.env_index``) and
    wraps it in an :class:`EngineEnv`. ``wrap_env``: an optional function applied to each env first (module-level, so
    that it travels by reference)."""

    def __init__(self, first_index: int, env_fns: Sequence[Callable], mode: str, post_final_observation: bool,
                 wrap_env: Callable | None = None, pickled: str | None = None):
        self.first_index = first_index
        self.env_fns = list(env_fns)
        self.mode = mode
        self.post_final_observation = post_final_observation
        self.wrap_env = wrap_env
        self.pickled = pickled

    def __call__(self) -> EngineEnv:
        index = env_index()
        env = self.env_fns[index - self.first_index]()
        if self.wrap_env is not None:
            env = self.wrap_env(env)
        if not isinstance(env, gym.Env):
            raise TypeError(f"env {index}: its constructor returned {type(env).__module__}.{type(env).__name__}, "
                            "not a gymnasium.Env; the vector facades step gymnasium envs.")
        return EngineEnv(env, index, self.mode, self.post_final_observation, self.pickled)


# ----------------------------------------------------------------- calls
def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}"


def _call(env: EngineEnv, name: str, args: tuple, kwargs: dict):
    value = env.env.get_wrapper_attr(name)
    return value(*args, **kwargs) if callable(value) else value


def _method(env: EngineEnv, name: str, args: tuple, kwargs: dict):
    return env.env.get_wrapper_attr(name)(*args, **kwargs)


def _has_attr(env: EngineEnv, name: str) -> bool:
    try:
        env.env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True


def _is_wrapped(env: EngineEnv, wrapper_class: type) -> bool:
    inner = env.env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, wrapper_class):
            return True
        inner = inner.env
    return False


def _spaces(env: EngineEnv) -> dict:
    user = env.env
    return {"observation_space": user.observation_space, "action_space": user.action_space,
            "metadata": dict(getattr(user, "metadata", {}) or {}), "render_mode": getattr(user, "render_mode", None)}


def _prepare_reset(env: EngineEnv, seed, options) -> None:
    env._pending = (seed, options)


#: op name -> function(engine env, *args); what :meth:`EngineEnv.serve_requests` can run
OPS = {
    "call": _call,  # gymnasium: get_wrapper_attr(name), called with (args, kwargs) if callable
    "get_attr": lambda env, name: env.env.get_wrapper_attr(name),
    "set_wrapper_attr": lambda env, name, value: env.env.set_wrapper_attr(name, value),
    "setattr": lambda env, name, value: setattr(env.env, name, value),  # on the outermost wrapper
    "env_method": _method,
    "has_attr": _has_attr,
    "is_wrapped": _is_wrapped,
    "render": lambda env: env.env.render(),
    "spaces": _spaces,
    "prepare_reset": _prepare_reset,  # (seed, options) for the env's next reset asked by the main process
    "set_action": lambda env, action: setattr(env, "_sent_action", action),  # actions that travel pickled
}
