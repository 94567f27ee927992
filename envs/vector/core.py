"""What the two vector facades (``gymnasium_vector.ParallelVectorEnv``, ``sb3_vec_env.ParallelVecEnv``) share: a
ParallelEnv running the users' gymnasium envs behind ``worker.EngineEnv`` (each built in its worker, never
here: the spaces, metadata and render mode of each env are asked from the workers after the start-up), the infos
they post, calls into the workers (their errors: ``errors.py``), and numpy in and out of the step buffers:
observations read in the structure of a gym space, actions checked and written.

Buffer keys (``worker.engine_space`` decides them): a plain observation space lives under ``"observation"``;
a ``Dict``/``Tuple`` one under ``("obs", ...)`` with the space's keys (``"0"``, ``"1"``, ... for a ``Tuple``).
Actions live under ``"action"`` (``("action", key, ...)`` for ``Dict``/``Tuple`` spaces), with the ``start`` of
``Discrete``/``MultiDiscrete`` spaces removed (the workers add it back). Spaces the buffers cannot hold travel
pickled instead when the facade allows it (``shared_memory=False``): :class:`PickledObservations` keeps each env's
last posted observation, :class:`PickledActions` sends each env's action with a call.
"""
from __future__ import annotations

import copy as copying
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from tensordict import TensorDictBase

from ..engine.errors import EnvWorkerError, SpecMismatchError
from ..engine.platform_policy import check_start_method, split_envs
from ..engine.shared import key_tuple, numpy_view
from ..factories import check_factory
from ..parallel import ParallelEnv
from .errors import SpaceMismatchError, call_result, unpickled, worker_exception
from .worker import FINAL, NEXT_OBS, NEXT_STEP, RESET, ROOT_OBS, STEP, WorkerFactory, travels_pickled


class VectorEngine(ParallelEnv):
    """The ParallelEnv of the facades: the caller's torch threads are left as they are (its training process is not
    TorchRL's); its ``owner`` (in messages and worker names) is the face's class name."""

    adjusts_caller_threads = False


class EngineWorkers:
    """What both facades share about their engine (the facade keeps its :class:`EngineCore` in ``_core`` and
    its own ``closed`` flag): its workers, and the check that it is still open."""

    #: the error a call on a closed facade raises (gymnasium's facade raises gymnasium's own)
    closed_error: type[Exception] = RuntimeError

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise self.closed_error(f"{what}() was called on a closed {type(self).__name__}.")
        if self._core.is_closed:
            raise self.closed_error(f"{what}() was called on a {type(self).__name__} that shut down after a "
                                    "worker died or hung (the error raised then said which); make a new one.")

    def _closed_under(self, what: str) -> ClosedUnder:
        """Whatever fails inside, because ``close()`` ran meanwhile (from another thread or a signal handler,
        while ``what`` waited for the workers), is raised as the :attr:`closed_error`."""
        return ClosedUnder(self, what)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return self._core.engine.worker_pids

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return self._core.engine.restarts


class ClosedUnder:
    """The context of a facade's ``_closed_under`` (see :class:`EngineWorkers`; a class: a generator-made
    context costs microseconds per step)."""

    __slots__ = ("face", "what")

    def __init__(self, face, what: str):
        self.face = face
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is None or not issubclass(kind, Exception) or not self.face._core.closing:
            return False
        raise self.face.closed_error(f"{type(self.face).__name__} was closed (from another thread or a signal "
                                     f"handler?) while {self.what}() ran; make a new one to go on.") from None


class EngineCore:
    """The envs of ``env_fns`` in ``num_workers`` processes of ``envs_per_worker`` envs each (env ``i`` in worker
    ``i // envs_per_worker``), stepped with autoreset ``mode`` (``worker.SAME_STEP`` / ``NEXT_STEP`` /
    ``DISABLED``). ``pickled`` (None, ``"gymnasium"`` or ``"any"``): which spaces the buffers cannot hold travel
    pickled instead of being refused (``worker.travels_pickled``).

    Attributes: ``num_envs``; ``spaces`` (per env: ``{"observation_space", "action_space", "metadata",
    "render_mode"}``, asked from the workers); ``observations`` (:class:`Observations`, or
    :class:`PickledObservations`); ``actions`` (their writer);
    ``reward``, ``terminated``, ``truncated`` (numpy views ``[num_envs]`` of the last step's results);
    ``done`` (bool ``[num_envs]``).
    """

    def __init__(self, env_fns: Sequence[Callable], *, owner: str, mode: str, num_workers: int | None = None,
                 envs_per_worker: int | None = None, start_method: str | None = None, timeout: float = 120.0,
                 max_restarts: int = 0, spin_s: float | None = None, post_final_observation: bool = False,
                 wrap_env: Callable | None = None, check_values: bool = False, pickled: str | None = None):
        if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence) or not env_fns:
            raise TypeError(f"{owner} takes a non-empty list of env constructors, one per env, got {env_fns!r}.")
        fns = list(env_fns)
        for fn in fns:
            check_factory(fn, owner)
        self.owner = owner
        self.num_envs = len(fns)
        self.closing = False
        self.mode = mode
        workers, k = split_envs(self.num_envs, num_workers, envs_per_worker, owner)
        self.num_workers = workers
        self.envs_per_worker = k
        self._posted: dict[int, dict] = {}  # env index -> {kind: pickled value} taken from the engine, not yet read
        self._reset_steps: np.ndarray | None = None  # see start_step
        # what finish_* needs of start_*: (envs not stepped, restarts before), the reset mask, (op, indices)
        self._stepping: tuple = (None, [])
        self._resetting: np.ndarray | None = None
        self._requested: tuple = ("", [])
        factories = [WorkerFactory(w * k, fns[w * k : (w + 1) * k], mode, post_final_observation, wrap_env, pickled)
                     for w in range(workers)]
        try:
            self.engine = VectorEngine(
                workers, factories, envs_per_worker=k, mp_start_method=check_start_method(start_method, owner),
                timeout=timeout, check_actions=False, check_values=check_values, max_restarts=max_restarts,
                spin_s=spin_s, owner=owner)
        except EnvWorkerError as err:
            raise worker_exception(err, err.original) from None
        except SpecMismatchError as err:
            raise SpaceMismatchError(str(err)) from None
        self._finalizer = weakref.finalize(self, self.engine.close)
        try:
            self.spaces = self.request("spaces", range(self.num_envs))
            engine, observation_space, action_space = (
                self.engine, self.spaces[0]["observation_space"], self.spaces[0]["action_space"])
            self.observations = (PickledObservations(observation_space, self.num_envs)
                                 if travels_pickled(observation_space, pickled) else
                                 Observations(observation_space, engine.root_buffer, engine.next_buffer))
            self.actions = (PickledActions(action_space, self.num_envs, self._send_actions)
                            if travels_pickled(action_space, pickled) else
                            Actions(action_space, engine.action_buffers, self.num_envs))
            self.reward, self.terminated, self.truncated = (
                engine.next_buffer.get(key).numpy()[:, 0] for key in ("reward", "terminated", "truncated"))
            self.done = engine.next_done
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- stepping
    @property
    def is_closed(self) -> bool:
        """True once closed, or once the engine shut itself down (a worker died or hung)."""
        return not self._finalizer.alive or self.engine.is_closed

    def write_actions(self, actions) -> None:
        """Check ``actions`` (a batch in the structure of the action space) and copy them into the buffers."""
        self.actions.write(actions)

    def _send_actions(self, per_env: list) -> None:
        self.request("set_action", range(self.num_envs), [(action,) for action in per_env])

    def step(self) -> None:
        """Step every env with the actions written (:meth:`start_step`, :meth:`finish_step`): buffers and posts."""
        self.start_step()
        self.finish_step()

    def start_step(self) -> None:
        """Begin the step on the workers. ``NEXT_STEP``: the envs of a worker restarted during the last step (which
        reported them truncated, in their reset state) are not stepped: their step is the reset step that follows
        an episode's end (that state, reward 0, no flags)."""
        reset_steps, self._reset_steps = self._reset_steps, None
        self._stepping = (reset_steps, list(self.engine.restarts))
        self._engine(self.engine.begin, "step", None if reset_steps is None else ~reset_steps)

    def finish_step(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s for the step :meth:`start_step` began (``ParallelEnv.finish``); take its results."""
        self._engine(self.engine.finish, timeout)
        reset_steps, restarts = self._stepping
        if reset_steps is not None:
            for flags in (self.reward, self.terminated, self.truncated, self.done):
                flags[reset_steps] = 0
        if self.engine.restarts != restarts and self.mode == NEXT_STEP:
            replaced = np.not_equal(self.engine.restarts, restarts)
            self._reset_steps = np.repeat(replaced, self.envs_per_worker)
        self._take_observations()

    def _take_observations(self) -> None:
        if isinstance(self.observations, PickledObservations):
            self.observations.update(self._take(NEXT_OBS, ROOT_OBS + 1))

    def reset(self, mask: np.ndarray | None, seeds: Sequence, options: Sequence) -> None:
        """Reset every env (``mask`` None) or those where ``mask`` (bool ``[num_envs]``) is True; env ``i`` with
        ``seeds[i]`` and ``options[i]`` (None: none); the observations in the root buffer. Blocking: both halves."""
        self.start_reset(mask, seeds, options)
        self.finish_reset()

    def start_reset(self, mask: np.ndarray | None, seeds: Sequence, options: Sequence) -> None:
        """Begin the reset on the workers (see :meth:`reset`)."""
        chosen = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        prepared = [i for i in chosen if seeds[i] is not None or options[i] is not None]
        if prepared:
            self.request("prepare_reset", prepared, [(seeds[i], options[i]) for i in prepared])
        self.engine.discard_pending_resets()  # envs that ended in the last step are reset again, for real
        self._resetting = None if mask is None else np.asarray(mask, dtype=bool)
        self._engine(self.engine.begin, "reset", self._resetting)

    def finish_reset(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s for the reset :meth:`start_reset` began (see ``ParallelEnv.finish``)."""
        self._engine(self.engine.finish, timeout)
        if self._reset_steps is not None:  # a reset replaces the reset step a restart left them (see start_step)
            self._reset_steps = None if self._resetting is None else self._reset_steps & ~self._resetting
        self._take_observations()

    def take_posts(self) -> list[dict] | None:
        """``[step infos, reset infos, final observations]`` posted since the last call (see :meth:`_take`)."""
        return self._take(STEP, FINAL + 1)

    def _take(self, first: int, stop: int) -> list[dict] | None:
        """The posts of kinds ``first`` to ``stop - 1`` (one ``{env index: value}`` per kind), then forgotten; None
        when there are none. The engine's posts of other kinds are kept for a later call."""
        posted = self._posted
        for i, values in self.engine.take_posts().items():
            posted.setdefault(i, {}).update(values)
        if not posted:
            return None
        posts: list[dict] = [{} for _ in range(stop - first)]
        for i in list(posted):
            values = posted[i]
            for kind in range(first, stop):
                blob = values.pop(kind, None)
                if blob is not None:
                    posts[kind - first][i] = unpickled(blob, i, "an info it returned")
            if not values:
                del posted[i]
        return posts if any(posts) else None

    def reset_posts(self) -> dict:
        """``{env index: reset info}`` posted by the last reset (other posts are dropped)."""
        posts = self.take_posts()
        return {} if posts is None else posts[RESET]

    # ----------------------------------------------------------------- calls
    def request(self, op: str, indices, args: tuple | list = ()) -> list:
        """Run ``worker.OPS[op]`` on env ``i`` for each ``i`` in ``indices`` (in that order) with ``args``
        (one tuple for all, or a list of one tuple per index); the results in the same order. An exception
        raised by an env is raised here, with the env index and the worker's traceback in a note. Blocking."""
        self.start_request(op, indices, args)
        return self.finish_request()

    def start_request(self, op: str, indices, args: tuple | list = ()) -> None:
        """Begin the requests (see :meth:`request`): every env gets them all, and runs its own
        (``EngineEnv.serve_requests``)."""
        indices = [int(i) for i in indices]
        self._requested = (op, indices)
        requests = {}
        for position, i in enumerate(indices):
            requests.setdefault(i, []).append((position, op, args[position] if isinstance(args, list) else args))
        self._engine(self.engine.begin, "call", call=(("serve_requests",), "call", (requests,), None))

    def finish_request(self, timeout: float | None = None) -> list:
        """Wait up to ``timeout`` s for the requests :meth:`start_request` began (see ``ParallelEnv.finish``);
        their results, in the order of its ``indices``."""
        per_env = self._engine(self.engine.finish, timeout)
        op, indices = self._requested
        replies: list = [None] * len(indices)
        for env_replies in per_env:
            for position, *reply in env_replies:
                replies[position] = reply
        return [call_result(*reply, i, op) for reply, i in zip(replies, indices)]

    @staticmethod
    def _engine(method: Callable, *args, **kwargs):
        """``method(*args, **kwargs)`` of the engine; an env's :class:`EnvWorkerError` raised as
        :func:`~.errors.worker_exception` makes it (the env's own type)."""
        try:
            return method(*args, **kwargs)
        except EnvWorkerError as err:
            raise worker_exception(err, err.original) from None

    # ----------------------------------------------------------------- closing
    def close(self) -> None:
        """Stop the workers and free the buffers; idempotent."""
        self.closing = True
        self.observations = self.actions = None
        self.reward = self.terminated = self.truncated = self.done = None
        self._finalizer()


# ----------------------------------------------------------------- numpy in and out of the buffers
class Observations:
    """Batches ``[num_envs, ...]`` (and single rows) of observations, in the structure of ``space`` (the envs'
    own observation space): arrays of the space's dtypes, dicts of arrays, tuples of arrays, nested as the space
    is."""

    def __init__(self, space: spaces.Space, root: TensorDictBase, next_: TensorDictBase):
        key = ("obs",) if isinstance(space, (spaces.Dict, spaces.Tuple)) else ("observation",)
        self._trees = {"root": _tree(space, root, key), "next": _tree(space, next_, key)}

    def batch(self, which: str, copy: bool = True):
        """All envs' observations in buffer ``which`` (``"root"``: the state the next action is taken in;
        ``"next"``: what the last step returned); ``copy=False``: views, overwritten by the next step."""
        return _read(self._trees[which], slice(None), copy)

    def row(self, which: str, i: int):
        """Env ``i``'s observation in buffer ``which`` (a copy)."""
        return _read(self._trees[which], i, True)


class PickledObservations:
    """The same interface as :class:`Observations` for a space the buffers cannot hold: each env's last
    observation as its env posted it (pickled, ``worker.NEXT_OBS`` / ``ROOT_OBS``), batched as gymnasium
    batches such a space (``concatenate``: a tuple with one entry per env)."""

    def __init__(self, space: spaces.Space, num_envs: int):
        self.space = space
        self.num_envs = num_envs
        self._last = {"root": [None] * num_envs, "next": [None] * num_envs}

    def update(self, posts: list[dict] | None) -> None:
        """Take ``[{env: observation from a step}, {env: observation from a reset}]``: an env reset in a step
        (autoreset, or a restarted worker) has the reset one as ``"root"``; without a step, as ``"next"`` too."""
        if posts is None:
            return
        stepped, reset = posts
        for i, obs in stepped.items():
            self._last["next"][i] = self._last["root"][i] = obs
        for i, obs in reset.items():
            self._last["root"][i] = obs
            if i not in stepped:
                self._last["next"][i] = obs

    def batch(self, which: str, copy: bool = True):
        values = concatenate(self.space, self._last[which], create_empty_array(self.space, self.num_envs))
        return copying.deepcopy(values) if copy else values

    def row(self, which: str, i: int):
        return copying.deepcopy(self._last[which][i])


class PickledActions:
    """Actions of a space the buffers cannot hold (``space``: one env's): :meth:`write` splits a batch (of the
    batched space, e.g. a tuple with one action per env) into one action per env, as gymnasium does
    (``iterate``), and hands them to ``send`` (``send(actions)``: one call to every env)."""

    def __init__(self, space: spaces.Space, num_envs: int, send):
        self.batched = batch_space(space, num_envs)
        self.num_envs = num_envs
        self.send = send

    def write(self, actions) -> None:
        per_env = list(iterate(self.batched, actions))
        if len(per_env) != self.num_envs:
            raise ValueError(f"actions hold {len(per_env)} actions, expected one per env ({self.num_envs}).")
        self.send(per_env)


def _tree(space: spaces.Space, td: TensorDictBase, key: tuple):
    if isinstance(space, spaces.Dict):
        return dict, [(name, _tree(sub, td, (*key, name))) for name, sub in space.spaces.items()]
    if isinstance(space, spaces.Tuple):
        return tuple, [(None, _tree(sub, td, (*key, str(j)))) for j, sub in enumerate(space.spaces)]
    view = numpy_view(td.get(key))
    return None, (view, None if view.dtype == space.dtype else np.dtype(space.dtype))


def _read(node, index, copy: bool):
    kind, content = node
    if kind is None:
        view, dtype = content
        value = view[index]
        if dtype is not None:  # held in a wider type (worker.WIDENED)
            return np.asarray(value).astype(dtype)[()] if np.ndim(value) == 0 else value.astype(dtype)
        return value.copy() if copy else value
    if kind is dict:
        return {name: _read(child, index, copy) for name, child in content}
    return tuple(_read(child, index, copy) for _, child in content)


class Actions:
    """Writes a batch of actions (the structure of the batched action space: an array ``[num_envs, ...]``, or a
    dict / tuple of them; for Dict / Tuple spaces also a list of one action per env) into the action buffers,
    after checking shapes and integer dtypes. Values are not checked against the space: as in gymnasium's own
    vector envs, that is the env's business (and the env's error names it).

    Raises ``TypeError`` for a scalar where a batch is expected or a non-integer value for a discrete space,
    ``ValueError`` for a wrong shape."""

    def __init__(self, space: spaces.Space, action_buffers: list[tuple], num_envs: int):
        buffers = {key_tuple(key): numpy_view(tensor) for key, tensor in action_buffers}
        self.num_envs = num_envs
        self._root = _action_tree(space, buffers, ("action",))

    def write(self, actions) -> None:
        _write(self._root, actions, "actions")


def _action_tree(space: spaces.Space, buffers: dict, key: tuple):
    if isinstance(space, spaces.Dict):
        return dict, [(name, _action_tree(sub, buffers, (*key, name))) for name, sub in space.spaces.items()]
    if isinstance(space, spaces.Tuple):
        return tuple, [(j, _action_tree(sub, buffers, (*key, str(j)))) for j, sub in enumerate(space.spaces)]
    discrete = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))
    start = getattr(space, "start", None) if not isinstance(space, spaces.MultiBinary) else None
    shift = start if start is not None and np.any(start != 0) else None  # the workers add it back
    return None, (space, buffers[key], discrete, shift)


def _write(node, value, where: str) -> None:
    kind, content = node
    if kind is dict:
        if _per_env(value, Mapping):  # one dict per env (a list of samples of the single action space)
            value = {name: [action[name] for action in value] for name, _ in content}
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be a dict of batches (Dict action space), got {type(value).__name__}.")
        for name, child in content:
            if name not in value:
                raise KeyError(f"{where} has no entry {name!r}; the action space has keys {[n for n, _ in content]}.")
            _write(child, value[name], f"{where}[{name!r}]")
        return
    if kind is tuple:
        if isinstance(value, list) and _per_env(value, (tuple, list)) and all(len(v) == len(content) for v in value):
            value = tuple([action[j] for action in value] for j, _ in content)  # one tuple per env
        if not isinstance(value, (tuple, list)) or len(value) != len(content):
            raise TypeError(f"{where} must be a tuple of {len(content)} batches (Tuple action space), got "
                            f"{type(value).__name__}.")
        for j, child in content:
            _write(child, value[j], f"{where}[{j}]")
        return
    space, buffer, discrete, shift = content
    array = np.asarray(value)
    if array.shape != buffer.shape:
        n = buffer.shape[0]
        if array.ndim == 0:
            raise TypeError(f"{where} must hold one action per env ({n} envs, shape {buffer.shape}), got a scalar.")
        raise ValueError(f"{where} has shape {array.shape}, expected {buffer.shape} ({n} envs x "
                         f"{tuple(space.shape)}, {space}).")
    if discrete and array.dtype.kind not in "iub":
        _check_integers(space, array, where)
    buffer[...] = array if shift is None else array - shift


def _per_env(value, kind) -> bool:
    """Whether ``value`` is a list/tuple of per-env actions of type ``kind`` (not a batch)."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, kind) for v in value)


def _check_integers(space, array: np.ndarray, where: str) -> None:
    """Raise ``TypeError`` unless ``array`` (not of an integer dtype) holds whole numbers."""
    if array.dtype.kind != "f":
        raise TypeError(f"{where} has dtype {array.dtype}; a {type(space).__name__} action space takes integers.")
    if not np.all(np.floor(array) == array):
        raise TypeError(f"{where} holds non-integer values for a {type(space).__name__} action space.")
