"""What the two vector facades (``vector.ParallelVectorEnv``, ``sb3_vec_env.ParallelVecEnv``) share: a
ParallelEnv running the users' gymnasium envs behind ``vector_worker.EngineEnv``, the infos they post, numpy
in and out of the buffers (``vector_layout``), calls into the workers, and the errors raised in the main
process.

Every env is built in its worker (``vector_worker.WorkerFactory``), never here: the spaces, metadata and
render mode of each env are asked from the workers after the start-up.
"""
from __future__ import annotations

import builtins
import multiprocessing
import os
import pickle
import types
import uuid
import weakref
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from . import vector_worker
from .errors import EnvWorkerError, SpecMismatchError, WorkerError
from .factories import check_factory
from .parallel import ParallelEnv
from .protocol import unpickled_exception
from .vector_layout import Actions, Observations, PickledActions, PickledObservations
from .vector_worker import FINAL, NEXT_OBS, NEXT_STEP, RESET, ROOT_OBS, STEP, WorkerFactory, travels_pickled


class SpaceMismatchError(SpecMismatchError, RuntimeError):
    """The envs of one vector env disagree on their spaces (a ``SpecMismatchError`` that is also a
    ``RuntimeError``, the error gymnasium's vector envs raise for it)."""


class VectorEngine(ParallelEnv):
    """A ParallelEnv that reaches the ``vector_worker.EngineEnv`` of every env with requests (see :meth:`serve`).
    The caller's torch threads are left as they are (its training process is not TorchRL's); its ``owner`` (in
    messages and worker names) is the face's class name."""

    adjusts_caller_threads = False

    def serve(self, requests: dict) -> list:
        """``EngineEnv.serve_requests(requests)`` on every env (through ``env_attribute``, which asks again when
        a worker was replaced on the way): the replies, one list per env in env order."""
        if self.is_closed:
            raise RuntimeError(f"this {self.owner} is closed; its workers were stopped.")
        return self.env_attribute(("serve_requests",), "call", (requests,))


def split_envs(num_envs: int, num_workers: int | None, envs_per_worker: int | None, owner: str) -> tuple[int, int]:
    """``(num_workers, envs_per_worker)`` for ``num_envs`` envs: as given (they must multiply to ``num_envs``),
    or by default the largest number of workers that divides ``num_envs`` and fits in the usable cores."""
    for name, value in (("num_workers", num_workers), ("envs_per_worker", envs_per_worker)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{owner}: {name} must be an int >= 1 (or None), got {value!r}.")
    if num_workers is None and envs_per_worker is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_workers = max(d for d in range(1, min(num_envs, cores) + 1) if num_envs % d == 0)
    elif num_workers is None:
        num_workers = num_envs // envs_per_worker
    envs_per_worker = envs_per_worker or num_envs // num_workers
    if num_workers * envs_per_worker != num_envs:
        raise ValueError(f"{owner}: {num_envs} envs cannot be split into num_workers={num_workers} x "
                         f"envs_per_worker={envs_per_worker}; choose values that multiply to {num_envs}.")
    return num_workers, envs_per_worker


def check_start_method(method: str | None, owner: str) -> str | None:
    """``method`` if it is one of this platform's start methods (or None: the engine's default); else the
    ``ValueError`` of ``multiprocessing.get_context``, naming the choices."""
    if method is None:
        return None
    try:
        multiprocessing.get_context(method)
    except ValueError as err:
        raise ValueError(f"{err}: {owner} takes one of {multiprocessing.get_all_start_methods()} "
                         "(or None for the default, 'fork' on Linux).") from None
    return method


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
    """The context of :meth:`EngineWorkers._closed_under` (a class: a generator-made context costs microseconds per
    step)."""

    __slots__ = ("face", "what")

    def __init__(self, face: EngineWorkers, what: str):
        self.face, self.what = face, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is None or not issubclass(kind, Exception) or not self.face._core.closing:
            return False
        raise self.face.closed_error(f"{type(self.face).__name__} was closed (from another thread or a signal "
                                     f"handler?) while {self.what}() ran; make a new one to go on.") from None


class Translated:
    """The context of :meth:`EngineCore._translated`: an env's :class:`EnvWorkerError` raised as
    :func:`worker_exception` makes it."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is not None and issubclass(kind, EnvWorkerError):
            raise worker_exception(exc, exc.original) from None
        return False


TRANSLATED = Translated()


class EngineCore:
    """The envs of ``env_fns`` in ``num_workers`` processes of ``envs_per_worker`` envs each (env ``i`` in worker
    ``i // envs_per_worker``), stepped with autoreset ``mode`` (``vector_worker.SAME_STEP`` / ``NEXT_STEP`` /
    ``DISABLED``). ``pickled`` (None, ``"gymnasium"`` or ``"any"``): which spaces the buffers cannot hold travel
    pickled instead of being refused (``vector_worker.travels_pickled``).

    Attributes: ``num_envs``; ``spaces`` (per env: ``{"observation_space", "action_space", "metadata",
    "render_mode"}``, asked from the workers); ``observations`` (:class:`~.vector_layout.Observations`, or
    :class:`~.vector_layout.PickledObservations`); ``actions`` (their writer);
    ``reward``, ``terminated``, ``truncated`` (numpy views ``[num_envs]`` of the last step's results);
    ``done`` (bool ``[num_envs]``).
    """

    def __init__(self, env_fns: Sequence[Callable], *, owner: str, mode: str, num_workers: int | None = None,
                 envs_per_worker: int | None = None, start_method: str | None = None, timeout: float = 120.0,
                 max_restarts: int = 0, spin_s: float | None = None, raw_final: bool = False,
                 patch: Callable | None = None, check_values: bool = False, pickled: str | None = None):
        if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence) or not env_fns:
            raise TypeError(f"{owner} takes a non-empty list of env constructors, one per env, got {env_fns!r}.")
        fns = list(env_fns)
        for fn in fns:
            check_factory(fn, owner)
        self.owner, self.num_envs, self.closing, self.mode = owner, len(fns), False, mode
        workers, k = split_envs(self.num_envs, num_workers, envs_per_worker, owner)
        self.num_workers, self.envs_per_worker = workers, k
        self.token = uuid.uuid4().hex
        self._posted: dict[int, dict] = {}  # env index -> {kind: pickled value} taken from the engine, not yet read
        factories = [WorkerFactory(self.token, w, w * k, fns[w * k : (w + 1) * k], mode, raw_final, patch, pickled)
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
        """Step every env with the actions written; results in the buffers and the posts."""
        engine = self.engine
        restarts = list(engine.restarts)
        with self._translated():
            engine.step_buffers()
        if engine.restarts != restarts and self.mode == NEXT_STEP:  # their envs report a truncation: see EngineEnv
            k = self.envs_per_worker
            replaced = [w for w, (now, before) in enumerate(zip(engine.restarts, restarts)) if now != before]
            self.request("reset_on_step", [w * k + j for w in replaced for j in range(k)])
        self._take_observations()

    def _take_observations(self) -> None:
        if isinstance(self.observations, PickledObservations):
            self.observations.update(self._take(NEXT_OBS, ROOT_OBS + 1))

    def reset(self, mask: np.ndarray | None, seeds: Sequence, options: Sequence) -> None:
        """Reset every env (``mask`` None) or those where ``mask`` (bool ``[num_envs]``) is True; env ``i`` with
        ``seeds[i]`` and ``options[i]`` (None: none). The observations are then in the root buffer."""
        chosen = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        prepared = [i for i in chosen if seeds[i] is not None or options[i] is not None]
        if prepared:
            self.request("prepare_reset", prepared, [(seeds[i], options[i]) for i in prepared])
        self.engine.discard_pending_resets()  # envs that ended in the last step are reset again, for real
        with self._translated():
            if mask is None:
                self.engine.reset()
            else:
                reset = torch.as_tensor(np.asarray(mask, dtype=bool)).reshape(self.num_envs, 1)
                self.engine.reset(TensorDict({"_reset": reset}, batch_size=[self.num_envs]))
        self._take_observations()

    def take_posts(self) -> list[dict] | None:
        """What the envs posted since the last call: ``[step infos, reset infos, final observations]``, each
        ``{env index: value}``; None when nothing was posted (the common case: one check of the lengths)."""
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
        found = False
        for i in list(posted):
            values = posted[i]
            for kind in range(first, stop):
                blob = values.pop(kind, None)
                if blob is not None:
                    posts[kind - first][i] = _posted_value(blob, i)
                    found = True
            if not values:
                del posted[i]
        return posts if found else None

    def reset_posts(self) -> dict:
        """``{env index: reset info}`` posted by the last reset (other posts are dropped)."""
        posts = self.take_posts()
        return {} if posts is None else posts[RESET]

    # ----------------------------------------------------------------- calls
    def request(self, op: str, indices, args: tuple | list = ()) -> list:
        """Run ``vector_worker.OPS[op]`` on env ``i`` for each ``i`` in ``indices`` (in that order) with ``args``
        (one tuple for all, or a list of one tuple per index); the results in the same order. An exception
        raised by an env is raised here, with the env index and the worker's traceback in a note."""
        indices = [int(i) for i in indices]
        requests: dict[int, list] = {}
        for position, i in enumerate(indices):
            requests.setdefault(i, []).append((position, op, args[position] if isinstance(args, list) else args))
        replies: list = [None] * len(indices)
        for env_replies in self._serve(requests):
            for position, *reply in env_replies:
                replies[position] = reply
        return [_result(*reply, i, op) for reply, i in zip(replies, indices)]

    def _serve(self, requests: dict) -> list:
        with self._translated():
            return self.engine.serve(requests)

    def _translated(self) -> Translated:
        """Raise an env's exception as :func:`worker_exception` makes it."""
        return TRANSLATED

    # ----------------------------------------------------------------- closing
    def close(self) -> None:
        """Stop the workers and free the buffers; idempotent."""
        self.closing = True
        self.observations = self.actions = None
        self.reward = self.terminated = self.truncated = self.done = None
        self._finalizer()


def _posted_value(blob: bytes, index: int):
    """A value env ``index`` posted (``vector_worker.EngineEnv``), unpickled."""
    try:
        return pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - one clear error for any unpickling failure
        raise TypeError(f"env {index}: an info it returned cannot be read in the main process "
                        f"({type(exc).__name__}: {exc}).") from exc


def _result(ok: bool, blob: bytes | None, text: str, index: int, op: str):
    """A reply of ``serve``: the value, or raise the env's exception."""
    if ok:
        try:
            return pickle.loads(blob)
        except Exception as exc:  # noqa: BLE001 - one clear error for any unpickling failure
            raise TypeError(f"env {index}: the result of {op!r} cannot be read in the main process "
                            f"({type(exc).__name__}: {exc}).") from None
    error = unpickled_exception(blob)
    if error is None:
        error = RuntimeError(text.splitlines()[0] if text else f"env {index} failed in {op!r}")
    if hasattr(error, "add_note"):
        error.add_note(f"(raised by env {index} in its worker process, during {op!r})\n{text.rstrip()}")
    raise error


# ----------------------------------------------------------------- env errors as their own type
_COMBINED: dict[type, type | None] = {}


def worker_exception(err: EnvWorkerError, original: BaseException | None) -> BaseException:
    """``err`` as an exception that is both an :class:`EnvWorkerError` (worker index, message, the worker's
    traceback) and an instance of the type the env raised (``original``'s, or the type of that name among the
    builtins, gymnasium's errors and this package's), so that ``except ValueError`` catches an env's
    ``ValueError`` as it would in a single process. When no such type can be made (its layout forbids it),
    ``original`` itself with ``err`` as its cause; ``err`` when neither is known."""
    cls = type(original) if isinstance(original, Exception) else _exception_type(err.exc_type)
    if cls is None or issubclass(cls, WorkerError):
        return err
    combined = _combined(cls)
    if combined is None:
        if original is None:
            return err
        original.__cause__ = err
        return original
    try:
        new = combined(str(err))
    except Exception:  # noqa: BLE001 - a type whose constructor refuses the message: raise the original
        if original is None:
            return err
        original.__cause__ = err
        return original
    new.__dict__.update(err.__dict__)
    return new


def _exception_type(name: str) -> type | None:
    cls = getattr(vector_worker, name, None) or getattr(builtins, name, None) or getattr(gym.error, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def _message_init(self, message: str) -> None:
    BaseException.__init__(self, message)  # the attributes of the EnvWorkerError are copied in afterwards


def _combined(cls: type) -> type | None:
    if cls not in _COMBINED:
        try:
            _COMBINED[cls] = types.new_class(f"Worker{cls.__name__}", (EnvWorkerError, cls), exec_body=lambda ns: (
                ns.update({"__module__": __name__, "__init__": _message_init,
                           "__doc__": f"A {cls.__name__} raised by an env in its worker."})))
        except TypeError:  # e.g. OSError: its instance layout cannot be combined with another
            _COMBINED[cls] = None
    return _COMBINED[cls]
