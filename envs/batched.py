"""BatchedEnv: the TorchRL ``EnvBase`` face shared by SerialEnv and ParallelEnv.

A subclass owns ``num_envs`` envs and implements four hooks: ``_run_step()``, ``_run_reset(mask)``,
``_run_set_seeds(seeds)``, ``_shutdown()``. Everything else — specs, action checks, ``reset`` / ``step`` /
``step_and_maybe_reset`` / ``rollout``, ``close`` — lives here.

The step buffers (``shared.py``) belong to this class: no other module touches their internals. The lean
loops (``rollout.py``, the collectors' loop, ``AsyncParallelEnv``) use the buffer API: ``root_buffer``,
``next_buffer``, ``action_buffers``, ``next_done``, ``step_buffers()``, ``keep_pending_resets()`` and
``discard_pending_resets()``; ``recorder.StepRecorder`` copies the buffers into ``[num_envs, T]`` storage.

Auto-reset: every step resets the envs that ended and leaves their reset observation in the root buffer.
``step_and_maybe_reset`` returns it directly; after a plain ``step``, a ``reset`` whose ``"_reset"`` mask
covers those envs returns the same observation without resetting them twice.
"""
from __future__ import annotations

import functools
import gc
import threading
import weakref

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from .rollout import policy_rollout, random_rollout
from .shared import EnvSpecs, key_tuple
from .specs import value_checker


def _one_thread(method):
    """Refuse a call while another thread is inside a guarded method of the same env: a batched env steps
    one batch at a time, and two threads would mix their data silently. (Reentrant within one thread.)"""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        lock = self._in_use
        if not lock.acquire(blocking=False):
            raise RuntimeError(
                f"{self.owner}.{method.__name__}() was called while another thread is stepping or resetting this "
                "env; a batched env steps one batch at a time. Give each thread its own env, or serialize the "
                "calls with a lock."
            )
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release()

    return guarded


class BatchedEnv(EnvBase):
    """``num_envs`` envs with one set of specs, batch size ``[num_envs]`` (see the module docstring)."""

    def __init__(self, specs: EnvSpecs, num_envs: int, buffers: TensorDictBase, check_actions: bool = True,
                 owner: str | None = None):
        self._in_use = threading.RLock()
        super().__init__(batch_size=torch.Size([num_envs]), device=torch.device("cpu"))
        self.owner = owner or type(self).__name__  # who this env is to the user, in error messages
        self.num_envs = num_envs
        self.full_observation_spec = specs.observation.expand(num_envs)
        self.full_action_spec = specs.action.expand(num_envs)
        self.full_reward_spec = specs.reward.expand(num_envs)
        self.full_done_spec = specs.done.expand(num_envs)
        self.check_actions = check_actions
        self._env_specs = specs  # one env's, unbatched: a restart must build envs with the same
        self._value_checks = {key: value_checker(self.full_action_spec[key])
                              for key in self.full_action_spec.keys(True, True)}
        self._bind_buffers(buffers)
        self._finalizer = weakref.finalize(self, type(self)._finalize, weakref.ref(self))

    def _bind_buffers(self, buffers: TensorDictBase) -> None:
        """Take ``buffers`` (see ``shared.py``) as this env's step buffers: at construction and at a restart."""
        self._step_buffers = buffers  # not "_buffers": that name is nn.Module's (EnvBase is a Module)
        self._root = buffers.get("root")
        self._next = buffers.get("next")
        self._action_slots = [
            (key, buffers.get(("action", *key_tuple(key))), self.full_action_spec[key])
            for key in self.full_action_spec.keys(True, True)
        ]
        self._next_done = self._next.get("done").numpy().reshape(self.num_envs)
        # envs that ended in the last step and whose reset observation already sits in the root buffer
        self._pending_reset = np.zeros(self.num_envs, dtype=bool)
        self.is_closed = False

    # ----------------------------------------------------------------- hooks for subclasses
    def _run_step(self) -> None:
        raise NotImplementedError

    def _run_reset(self, mask: np.ndarray | None) -> None:
        raise NotImplementedError

    def _run_set_seeds(self, seeds: list[int]) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def _start_again(self) -> TensorDictBase:
        """Build the envs (and workers) anew after ``close()``, with the same specs; returns new buffers."""
        raise NotImplementedError

    # ----------------------------------------------------------------- buffer API
    @property
    def root_buffer(self) -> TensorDictBase:
        """The state the next action is taken in, ``[num_envs]``: observation keys and done flags (after a
        step, the reset observation where an env ended). A view, overwritten by the next step or reset."""
        return self._root

    @property
    def next_buffer(self) -> TensorDictBase:
        """What the last step returned, ``[num_envs]``: observation keys, reward and done flags (the terminal
        observation where an env ended). A view, overwritten by the next step."""
        return self._next

    @property
    def action_buffers(self) -> list[tuple]:
        """``[(action key, tensor [num_envs, ...])]`` in ``action_keys`` order: what :meth:`step_buffers`
        sends to the envs. Writing them skips the checks of :meth:`write_actions`."""
        return [(key, buffer) for key, buffer, _ in self._action_slots]

    @property
    def next_done(self) -> np.ndarray:
        """bool ``[num_envs]``: which envs ended in the last step (a view of ``next_buffer["done"]``)."""
        return self._next_done

    @_one_thread
    def step_buffers(self) -> None:
        """Step every env with the actions in :attr:`action_buffers`; the results are in
        :attr:`next_buffer` and :attr:`root_buffer` (where an env ended, it was reset, and a later
        ``reset`` with a ``"_reset"`` mask covering it returns that observation without resetting it again)."""
        self._run_step()
        self.keep_pending_resets()

    def keep_pending_resets(self) -> None:
        """Remember which envs ended in the last step: their reset observation sits in the root buffer and
        answers the next ``reset`` whose ``"_reset"`` mask covers them (they are not reset twice)."""
        self._pending_reset[:] = self._next_done

    def discard_pending_resets(self) -> None:
        """Forget which envs ended in the last step: their reset observation in the root buffer no longer
        stands for a reset (the envs were reset or stepped in another way since)."""
        self._pending_reset[:] = False

    # ----------------------------------------------------------------- EnvBase API
    @_one_thread
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        self._ensure_open()
        mask = None
        if tensordict is not None:
            reset = tensordict.get("_reset", None)
            if reset is not None:
                mask = reset.reshape(self.num_envs).cpu().numpy().astype(bool)
        if mask is None:
            self._run_reset(None)
            self._pending_reset[:] = False
        else:
            to_reset = mask & ~self._pending_reset
            if to_reset.any():
                self._run_reset(to_reset)
            self._pending_reset[mask] = False
        return self._root.clone()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.step_in_place(tensordict)
        return self._next.clone()

    @_one_thread
    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the envs that ended (TorchRL semantics).

        Returns ``(tensordict, next_root)``: ``tensordict`` with a ``"next"`` entry (observation, reward,
        done flags: the terminal observation where an env ended) and the root for the next action (the
        reset observation where an env ended, with the input's other keys carried over).
        """
        self.step_in_place(tensordict)
        self._pending_reset[:] = False
        tensordict.set("next", self._next.clone())
        next_root = tensordict.exclude("next", *self.action_keys, *self.reward_keys)
        if any(isinstance(value, TensorDictBase) for value in next_root.values()):
            # exclude() shares nested tensordicts with its input; new ones, so that writing the next root's
            # nested entries leaves the step just returned intact (leaves stay shared)
            next_root = next_root.clone(recurse=False)
        next_root.update(self._root.clone())
        return tensordict, next_root

    @_one_thread
    def step_in_place(self, tensordict: TensorDictBase) -> None:
        """The lean step: copy the actions in (checked), step every env, leave the results in the buffers."""
        self._ensure_open()
        self.write_actions(tensordict)
        self.step_buffers()

    @_one_thread
    def write_actions(self, tensordict: TensorDictBase, check: bool | None = None) -> None:
        """Copy the action entries of ``tensordict`` into the action buffer, after checking them.

        Raises ``ValueError`` naming the key and the expected shape/dtype when an action does not fit.
        """
        values = self.checked_actions(tensordict, self.num_envs, self._value_checks, check)
        for (_, buffer, _), value in zip(self._action_slots, values):
            buffer.copy_(value)

    def checked_actions(self, tensordict: TensorDictBase, n: int, value_checks: dict,
                        check: bool | None = None) -> list[torch.Tensor]:
        """The action entries of ``tensordict`` for ``n`` envs, in action-slot order, after checking their
        shape, dtype and (when ``check``, default ``check_actions``) values with ``value_checks[key]``.

        Raises ``KeyError`` for a missing entry and ``ValueError`` naming the key and what was expected.
        """
        check = self.check_actions if check is None else check
        values = []
        for key, buffer, spec in self._action_slots:
            expected = (n, *buffer.shape[1:])
            value = tensordict.get(key, None)
            if value is None:
                raise KeyError(
                    f"the input tensordict has no {key!r} entry; {self.owner} expects one of "
                    f"shape {expected} and dtype {buffer.dtype}."
                )
            if tuple(value.shape) != expected or value.dtype != buffer.dtype:
                raise ValueError(
                    f"{key!r} has shape {tuple(value.shape)} and dtype {value.dtype}, but "
                    f"{self.owner} expects shape {expected} ({n} envs x "
                    f"{tuple(buffer.shape[1:])}) and dtype {buffer.dtype}; action spec: "
                    f"{type(spec).__name__}."
                )
            if check and not value_checks[key](value):
                raise ValueError(
                    f"{key!r} holds values outside its spec ({_bounds(spec)}"
                    f"{', NaN and infinities excluded' if value.dtype.is_floating_point else ''}); nothing was "
                    "sent to the envs. A policy that diverged, or actions on another scale than the spec's?"
                )
            values.append(value)
        return values

    @_one_thread
    def _set_seed(self, seed: int | None) -> None:
        """Env ``i`` is seeded with ``seed + i`` at its next reset."""
        self._ensure_open()
        if seed is not None:
            self._run_set_seeds([int(seed) + i for i in range(self.num_envs)])

    @_one_thread
    def rollout(self, max_steps: int, policy=None, callback=None, *, auto_reset: bool = True,
                break_when_any_done: bool | None = None, break_when_all_done: bool | None = None,
                tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """Like ``EnvBase.rollout``: a TensorDict of batch ``[num_envs, steps]`` (time last).

        Without a callback and the rarer options (``out``, ``set_truncated``, ``actions``) it takes a lean
        path: random actions are drawn from ``action_spec`` all at once and every step is copied into
        preallocated storage; with a policy, one policy call and one ``step_and_maybe_reset`` per step.
        """
        rare = {k: v for k, v in kwargs.items() if v not in (None, False)}
        rare.pop("return_contiguous", None)
        rare.pop("trust_policy", None)
        storing_device = rare.pop("storing_device", None)
        if callback is not None or break_when_all_done or rare:
            return super().rollout(
                max_steps, policy, callback, auto_reset=auto_reset, break_when_any_done=break_when_any_done,
                break_when_all_done=break_when_all_done, tensordict=tensordict, storing_device=storing_device,
                **kwargs,
            )
        self._ensure_open()
        break_when_any_done = True if break_when_any_done is None else break_when_any_done
        root = self.reset() if auto_reset else tensordict
        if root is None:
            raise ValueError("rollout(auto_reset=False) needs the initial state as `tensordict`.")
        if policy is None:
            out = random_rollout(self, root, max_steps, break_when_any_done)
        else:
            out = policy_rollout(self, root, policy, max_steps, break_when_any_done)
        return out if storing_device is None else out.to(storing_device)

    # ----------------------------------------------------------------- closing
    def close(self, *, raise_if_closed: bool = False) -> None:
        """Stop everything this env started; idempotent."""
        if self.__dict__.get("is_closed", True):
            return
        self.is_closed = True
        self._shutdown()
        # drop every view of the buffers so their memory (and, when shared, its file descriptor) is freed
        self._step_buffers = self._root = self._next = self._next_done = None
        self._action_slots = []
        gc.collect(1)  # tensordict views form young reference cycles; collect them so the memory goes now

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @staticmethod
    def _finalize(ref) -> None:
        env = ref()
        if env is not None:
            env.close()

    def _ensure_open(self) -> None:
        if self.is_closed:
            self.start()

    @_one_thread
    def start(self) -> None:
        """Start this env again if it was closed; a no-op while it is open. As with TorchRL's batched envs, a
        closed env restarts by itself at its next ``reset`` / ``step`` / ``rollout`` (e.g. after TorchRL's
        ``Collector`` closed it at ``total_frames``): fresh envs (and workers), the same specs, unseeded, to be
        reset before they are stepped."""
        if self.is_closed:
            self._bind_buffers(self._start_again())

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing useful can be done at garbage collection
            pass

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, closed={self.is_closed}, "
            f"observation keys={list(self.full_observation_spec.keys(True, True))})"
        )



def _bounds(spec) -> str:
    space = getattr(spec, "space", None)
    n = getattr(space, "n", None)
    if n is not None:
        return f"integers in [0, {n - 1}]"
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is not None:
        return f"values in [{low.min().item():g}, {high.max().item():g}]"
    return type(spec).__name__
