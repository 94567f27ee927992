"""BatchedEnv: the TorchRL ``EnvBase`` face shared by SerialEnv and ParallelEnv.

A subclass owns ``num_envs`` envs and implements six hooks: ``_run_step(mask)``, ``_run_reset(mask)``,
``_run_set_seed(seed, static_seed, episodes)``, ``_run_env_attribute(...)``, ``_shutdown()`` and ``_start_again()``.
Everything else — specs, action checks, ``reset`` / ``step`` / ``step_and_maybe_reset`` / ``rollout``, seeding,
forwarding (``forwarding.py``), ``close`` — lives here.

The step buffers (``shared.py``) belong to this class: no other module touches their internals. The lean
loops (``rollout.py``, the collectors' loop, ``AsyncParallelEnv``) use the buffer API: ``root_buffer``,
``next_buffer``, ``action_buffers``, ``next_done``, ``step_buffers()``, ``keep_pending_resets()`` and
``discard_pending_resets()``; ``rollout.StepRecorder`` copies the buffers into ``[num_envs, T]`` storage.
``device``: where the caller's specs and outputs live; the envs and buffers stay on the CPU.

Auto-reset: every step resets the envs that ended and leaves their reset observation in the root buffer.
``step_and_maybe_reset`` returns it directly; after a plain ``step``, a ``reset`` whose ``"_reset"`` mask
covers those envs returns the same observation without resetting them twice.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite
from torchrl.envs import EnvBase

from .engine.platform_policy import built_on_cpu
from .engine.recycle import Recycler
from .engine.shared import EnvObjects, EnvSpecs, forget_caches, key_tuple
from .engine.stepper import FAMILY_STEPPER, ROAD_ATTRIBUTE
from .engine.values import check_finite
from .factories import update_slot_kwargs
from .forwarding import Forwarding
from .inputs import (
    action_check,
    checked_actions,
    copier,
    fill_not_stepped,
    leaf_copier,
    plain_tensordict,
    reset_mask,
    root_merger,
    step_mask,
    value_checker,
)
from .rollout import batched_rollout
from .thread_guard import CallState, one_thread


def complete_done_spec(spec: Composite, device) -> None:
    """TorchRL's completion of a done spec, in place: a ``"terminated"`` beside a lone ``"done"`` and the reverse,
    both in an empty group, one shape per group (a ``ValueError`` otherwise); nested groups alike."""
    shape = None
    for key, item in list(spec.items()):
        if key == "done" and "terminated" not in spec.keys():
            spec["terminated"] = item.clone()
        elif key == "terminated" and "done" not in spec.keys():
            spec["done"] = item.clone()
        elif isinstance(item, Composite):
            complete_done_spec(item, device)
        elif shape is None:
            shape = item.shape
        elif shape != item.shape:
            raise ValueError(f"All shapes should match in done_spec {spec} (shape={shape}, key={key}).")
    if spec.is_empty():
        for key in ("done", "terminated"):
            spec[key] = Categorical(n=2, shape=(*spec.shape, 1), dtype=torch.bool, device=device)


class BatchedEnv(Forwarding, EnvBase):
    """``num_envs`` envs with one set of specs, batch size ``[num_envs, *B]`` (``B``: one env's batch shape,
    ``()`` unless the envs are batched TorchRL envs; see the module docstring). Done flags and resets are per
    element of that batch (``num_envs * prod(B)`` of them, flattened in the masks below)."""

    def __init__(self, specs: EnvSpecs, num_envs: int, buffers: TensorDictBase, check_actions: bool | str = True,
                 owner: str | None = None, device: torch.device | None = None):
        self._in_use = threading.RLock()
        self._closing = threading.RLock()  # held by close() from beginning to end (see _wait_for_close)
        self._calls = CallState()
        super().__init__(batch_size=torch.Size([num_envs, *specs.batch_shape]), device=torch.device("cpu"))
        self.owner = owner or type(self).__name__  # who this env is to the user, in error messages
        self.num_envs = num_envs
        self._num_elements = num_envs * specs.batch_numel
        self._cast = None  # a device other than the CPU where the caller's outputs go (see ``to``)
        self.full_observation_spec = specs.observation.expand(num_envs, *specs.batch_shape)
        self.full_action_spec = specs.action.expand(num_envs, *specs.batch_shape)
        self._cpu_action_spec = self.full_action_spec  # the buffers' and the action checks', whatever ``device``
        self.full_reward_spec = specs.reward.expand(num_envs, *specs.batch_shape)
        self.full_done_spec = specs.done.expand(num_envs, *specs.batch_shape)
        action_check(check_actions)  # (a clear error for an unknown mode)
        self.check_actions = check_actions
        #: opt-in: refuse NaN and infinite observations and rewards after every step and reset (see values.py)
        self.check_values = False
        self._env_specs = specs  # one env's, unbatched: a restart must build envs with the same
        self._objects = EnvObjects(specs.non_tensor_keys(), num_envs)  # non-tensor entries (not in the buffers)
        self._non_tensor_keys = self._objects.keys
        self._value_checks = {key: value_checker(spec) for key, spec in self._cpu_action_spec.items(True, True)}
        #: memory for big outputs (rollouts, step results), reused once nothing holds them (see ``recycle.py``)
        self.recycler = Recycler()
        self._bind_buffers(buffers)
        self.to(device or "cpu")
        self._finalizer = weakref.finalize(self, type(self)._finalize, weakref.ref(self))
        self._forwarding = True  # from here on, unknown public attributes are looked up on the envs

    def roads(self) -> list[str]:
        """How each env is stepped, one line per env, in env order: ``"native: ..."`` for a TorchRL ``GymEnv`` /
        ``GymWrapper`` whose gymnasium env tdcollect steps with TorchRL's data, ``"TorchRL's step"`` (with the reason,
        for a ``GymEnv`` the native road does not cover) for a TorchRL env stepped through its own
        ``step_and_maybe_reset``, ``"its family's stepper"`` for an env of another family (stepped natively). The
        roads and what each covers: the docs' TorchRL page."""
        return self.env_attribute(("__dict__", "get"), "call", (ROAD_ATTRIBUTE, FAMILY_STEPPER))

    def _bind_buffers(self, buffers: TensorDictBase) -> None:
        """Take ``buffers`` (see ``shared.py``) as this env's step buffers: at construction and at a restart."""
        self._step_buffers = buffers  # not "_buffers": that name is nn.Module's (EnvBase is a Module)
        self._root = buffers.get("root")
        self._next = buffers.get("next")
        self._action_slots = [
            (key, buffers.get(("action", *key_tuple(key))), self._cpu_action_spec[key])
            for key in self._cpu_action_spec.keys(True, True)
        ]
        done = self._next.get("done", None)
        if done is not None and done.numel() == self._num_elements:  # one flag per element: a view, always current
            self._next_done = done.numpy().reshape(self._num_elements)
            self._done_leaves = None
        else:  # only nested done keys (e.g. one per agent group): any of them, gathered after each step
            flags = [key for key in self.done_keys if key_tuple(key)[-1] == "done"] or self.done_keys
            self._done_leaves = [self._next.get(key).numpy().reshape(self._num_elements, -1) for key in flags]
            self._next_done = np.zeros(self._num_elements, dtype=bool)
        # elements that ended in the last step and whose reset observation already sits in the root buffer
        self._pending_reset = np.zeros(self._num_elements, dtype=bool)
        self._bind_copiers()
        self._next_batch = self._next.batch_size
        # the input's entries the next root does not carry (the step's replace them; the actions stay, as TorchRL's
        # step_mdp keeps them)
        replaced = [*self.reward_keys, *self._root.keys(True, True)]
        # with only top-level keys, step and step_and_maybe_reset build their outputs without TensorDict's generic path
        self._flat_keys = (all(isinstance(key, str) for key in [*self.action_keys, *replaced])
                           and not self._non_tensor_keys and self._copy_next_leaves is not None)
        self._not_carried_to_next_root = {"next", "_step", *replaced}
        self._common_actions = [(key, buffer, buffer.shape, self._value_checks[key])  # see _common_step
                                for key, buffer, _ in self._action_slots] if self._flat_keys else None
        # after a step where no env ended, the root's entries are the next step's: shared, as TorchRL's step_mdp does
        self._root_keys = list(self._root.keys(True, True))
        self._root_from_next = (not self._non_tensor_keys
                                and set(self._root_keys) <= set(self._next.keys(True, True)))
        # the generic step's next root, built level by level (None: TensorDict's exclude, clone and update build it)
        self._merge_root = None if self._non_tensor_keys else root_merger(
            self._root_keys, ["next", "_step", *self.reward_keys])
        self._next_only = [key for key in self._next.keys() if key not in self._root.keys()]  # (e.g. the reward)
        self._touched_since_start = False  # reset, stepped or seeded since this start (see update_kwargs)
        self.is_closed = False

    def _bind_copiers(self) -> None:
        """The copies of the buffers a caller gets, on ``self._cast`` when set (see ``recycle.py``)."""
        recycler = self.recycler
        cast = self._cast
        self._copy_root = copier(self._root, recycler, cast)
        self._copy_next = copier(self._next, recycler, cast)
        self._copy_next_leaves = leaf_copier(self._next, recycler, cast)  # the common step's (flat keys)
        self._copy_root_leaves = leaf_copier(self._root, recycler, cast)

    def to(self, device) -> BatchedEnv:
        """``EnvBase.to``: specs and outputs on ``device`` from now on (the envs and buffers stay on the CPU)."""
        super().to(device)
        self._cast = None if self.device.type == "cpu" else self.device
        if not self.is_closed:  # (a closed env binds them at its start)
            self._bind_copiers()
        return self

    # ----------------------------------------------------------------- hooks for subclasses
    def _run_step(self, mask: np.ndarray | None = None) -> list | None:
        """Step every env, or those where ``mask`` (bool ``[num_envs]``) is True (leaving the others' rows).
        Returns the envs' non-tensor entries when they have some: ``[(env index, {"root": td, "next": td})]``."""
        raise NotImplementedError

    def _run_reset(self, mask: np.ndarray | None) -> list | None:
        """Reset every env, or the elements where ``mask`` (bool, one per element) is True; returns non-tensor
        entries as :meth:`_run_step` does."""
        raise NotImplementedError

    def _run_set_seed(self, seed: int | None, static_seed: bool, episodes: bool = False) -> int | None:
        """Seed the envs in order, chaining seeds (see ``EnvGroup.set_seed``, ``episodes`` too); return the next
        seed."""
        raise NotImplementedError

    def _run_env_attribute(self, path: tuple[str, ...], op: str, args: tuple, kwargs: dict | None) -> list:
        """``forwarding.resolve_on_env`` on every env, in env order."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def _create_done_specs(self) -> None:
        """As TorchRL's (:func:`complete_done_spec`), but with no closure: TorchRL's is a recursive closure over the
        env, a reference cycle that would keep a dropped env (its workers, its shared memory) until the garbage
        collector runs."""
        if not self.auto_complete_done_specs:
            return
        done = self.output_spec.get("full_done_spec", None)
        if done is None:
            done = Composite(shape=self.output_spec.shape, device=self.output_spec.device)
        locked = self.is_spec_locked
        if locked:
            self.is_spec_locked = False
        complete_done_spec(done, self.device)
        self.output_spec["full_done_spec"] = done
        if locked:
            self.is_spec_locked = True

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
        """bool ``[num_envs * prod(B)]``: which envs (elements of batched envs) ended in the last step (a view of
        ``next_buffer["done"]``; with only nested done keys, any of them)."""
        return self._next_done

    @one_thread
    def step_buffers(self, mask: np.ndarray | None = None) -> None:
        """Step every env (or, with ``mask``, bool ``[num_envs]``, those where it is True) with the actions in
        :attr:`action_buffers`; the results are in :attr:`next_buffer` and :attr:`root_buffer` (where an env
        ended, it was reset, and a later ``reset`` with a ``"_reset"`` mask covering it returns that observation
        without resetting it again). With ``mask``, the rows of the other envs are left as they were."""
        self._step_envs(mask)

    def _step_envs(self, mask: np.ndarray | None, keep_resets: bool = True) -> None:
        if not self._touched_since_start:  # (see update_kwargs; setting it every step costs more than the test)
            self._touched_since_start = True
        objects = self._run_step(mask)
        if objects:  # (envs with non-tensor entries)
            self._objects.keep(objects)
        self._after_step(mask, keep_resets)

    def _after_step(self, mask: np.ndarray | None, keep_resets: bool = True) -> None:
        if self.check_values:
            check_finite(self._next, self.owner, "step()")  # (see values.py)
        if self._done_leaves is not None:
            np.logical_or.reduce([leaf.any(1) for leaf in self._done_leaves], out=self._next_done)
        if mask is None:
            self._pending_reset[:] = self._next_done if keep_resets else False
        else:
            stepped = np.repeat(mask, self._num_elements // self.num_envs)
            self._pending_reset[stepped] = self._next_done[stepped]

    def keep_pending_resets(self) -> None:
        """Remember which envs ended in the last step: their reset observation sits in the root buffer and
        answers the next ``reset`` whose ``"_reset"`` mask covers them (they are not reset twice)."""
        self._pending_reset[:] = self._next_done

    def discard_pending_resets(self) -> None:
        """Forget which envs ended in the last step: their reset observation in the root buffer no longer
        stands for a reset (the envs were reset or stepped in another way since)."""
        self._pending_reset[:] = False

    # ----------------------------------------------------------------- EnvBase API
    @one_thread
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        self._ensure_open()
        self._touched_since_start = True
        mask = None if tensordict is None else reset_mask(tensordict, self.reset_keys, self._num_elements)
        if mask is None:
            self._objects.keep(self._run_reset(None))
            self._pending_reset[:] = False
        else:
            to_reset = mask & ~self._pending_reset
            if to_reset.any():
                self._objects.keep(self._run_reset(to_reset))
            self._pending_reset[mask] = False
        if self.check_values:
            check_finite(self._root, self.owner, "reset()")
        return self._objects.added_to(self._copy_root(), "root")

    @one_thread
    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``EnvBase.step``; its common case (see :meth:`_common_step`; no ``"next"`` entry in the input, no
        ``run_type_checks``) without ``EnvBase``'s processing: the buffers hold every done key, in the spec's shapes."""
        if "next" not in tensordict.keys() and not self.run_type_checks and self._common_step(tensordict, True):
            next_ = plain_tensordict(self._copy_next_leaves(), self._next_batch, tensordict.device)
            tensordict._tensordict["next"] = next_
            return tensordict
        return super().step(tensordict)

    @one_thread  # (TorchRL's TransformedEnv calls it directly)
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        mask = step_mask(tensordict, self.num_envs, self._num_elements, self.owner)
        self._step_in_place(tensordict, mask)
        return self._next_output(tensordict, mask)

    def _next_output(self, tensordict: TensorDictBase, mask: np.ndarray | None) -> TensorDictBase:
        """The caller's copy of the next buffer (after a partial step, see :func:`.inputs.fill_not_stepped`)."""
        out = self._copy_next()
        if mask is not None:
            fill_not_stepped(out, tensordict, mask)
            self._objects.not_stepped(np.flatnonzero(~mask).tolist())
        return self._objects.added_to(out, "next")

    @one_thread
    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the envs that ended (TorchRL semantics).

        Returns ``(tensordict, next_root)``: ``tensordict`` with a ``"next"`` entry (observation, reward,
        done flags: the terminal observation where an env ended) and the root for the next action (the
        reset observation where an env ended, with the input's other keys, its actions among them, carried over,
        as TorchRL's ``step_mdp`` carries them).
        """
        if self._common_step(tensordict, keep_resets=False):  # built without TensorDict's generic paths
            leaves = self._copy_next_leaves()  # (None or the CPU)
            batch = self._next_batch
            device = tensordict.device
            tensordict._tensordict["next"] = plain_tensordict(leaves, batch, device)
            if self._root_from_next and not np.count_nonzero(self._next_done):
                root = dict(leaves)  # the step's tensors, shared
                for key in self._next_only:
                    del root[key]
            else:
                root = self._copy_root_leaves()
            skip = self._not_carried_to_next_root
            for key, value in tensordict._tensordict.items():  # the input's other entries (e.g. a policy's outputs)
                if key not in skip:
                    root[key] = value
            return tensordict, plain_tensordict(root, batch, device)
        mask = step_mask(tensordict, self.num_envs, self._num_elements, self.owner)
        self._step_in_place(tensordict, mask)
        self._pending_reset[:] = False
        out = self._next_output(tensordict, mask)
        tensordict.set("next", out)
        if self._root_from_next and mask is None and not np.count_nonzero(self._next_done):
            root = out  # the step's tensors, shared (as in the common path)
        else:
            root = self._objects.added_to(self._copy_root(), "root")
        next_root = None
        if self._merge_root is not None and self._cast is None and getattr(tensordict.device, "type", "cpu") == "cpu":
            next_root = self._merge_root(tensordict, root)
        if next_root is None:
            next_root = tensordict.exclude("next", "_step", *self.reward_keys)
            if any(isinstance(value, TensorDictBase) for value in next_root.values()):
                # exclude() shares nested tensordicts with its input; new ones, so that writing the next root's
                # nested entries leaves the step just returned intact (leaves stay shared)
                next_root = next_root.clone(recurse=False)
            next_root.update(root if root is not out else out.select(*self._root_keys))
        return tensordict, next_root

    def _common_step(self, tensordict: TensorDictBase, keep_resets: bool) -> bool:
        """The common step in few Python operations (flat keys, CPU outputs, a plain TensorDict of the batch size
        holding CPU actions of the buffers' shapes and dtypes, inside their spec): actions in, every env stepped
        (``keep_resets``: see :meth:`keep_pending_resets`). False, nothing done, for anything else."""
        actions = self._common_actions
        if (actions is None or type(tensordict) is not TensorDict or self.is_closed or self._cast is not None
                or tensordict.batch_size != self._next_batch or getattr(tensordict.device, "type", "cpu") != "cpu"
                or tensordict.is_locked or tensordict._td_dim_names is not None or "_step" in tensordict._tensordict):
            return False
        entries = tensordict._tensordict
        checked = action_check(self.check_actions)[0] is not None
        values = [entries.get(key) for key, _, _, _ in actions]
        for value, (_, buffer, shape, check) in zip(values, actions):
            if (type(value) is not torch.Tensor or value.shape != shape or value.dtype != buffer.dtype
                    or not value.is_cpu or value.requires_grad or (checked and not check(value))):
                return False
        for value, (_, buffer, _, _) in zip(values, actions):
            buffer.copy_(value)
        self._step_envs(None, keep_resets)
        return True

    def _step_in_place(self, tensordict: TensorDictBase, mask: np.ndarray | None) -> None:
        """Copy the actions in (checked), step every env (or those where ``mask`` is True); the results are left
        in the buffers."""
        self._ensure_open()
        self._write_actions(tensordict)
        self._step_envs(mask)

    @one_thread
    def write_actions(self, tensordict: TensorDictBase, check: tuple | None = None) -> None:
        """Copy the action entries of ``tensordict`` into the action buffer, after checking them.

        Raises ``ValueError`` naming the key and the expected shape/dtype when an action does not fit.
        """
        self._write_actions(tensordict, check)

    def _write_actions(self, tensordict: TensorDictBase, check: tuple | None = None) -> None:
        values = self.checked_actions(tensordict, self.num_envs, self._value_checks, check)
        for (_, buffer, _), value in zip(self._action_slots, values):
            # (an action that requires grad must not tie the buffers to its graph)
            buffer.copy_(value.detach() if value.requires_grad else value)

    def checked_actions(self, tensordict: TensorDictBase, n: int, value_checks: dict,
                        check: tuple | None = None) -> list[torch.Tensor]:
        """The action entries of ``tensordict`` for ``n`` envs, checked (see :func:`.inputs.checked_actions`;
        ``check`` defaults to ``check_actions``'s)."""
        check = action_check(self.check_actions) if check is None else check
        return checked_actions(tensordict, n, self._action_slots, value_checks, check, self.owner)

    @one_thread
    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed the envs as TorchRL's ``SerialEnv`` / ``ParallelEnv`` do: env 0 gets ``seed``, env ``i + 1`` the
        seed its predecessor returned (``seed_generator(seed)``, or the same seed with ``static_seed``). A TorchRL
        env is seeded at once through its own ``set_seed``; any other env at its next reset. Returns
        the seed for an env created after these (as ``EnvBase.set_seed``)."""
        return self._seed(seed, static_seed, episodes=False)

    @one_thread
    def seed_episodes(self, seed: int | None, static_seed: bool = False) -> int | None:
        """:meth:`set_seed`, and the next reset starts the episodes these seeds start. Any reset after a seed does,
        except for an env whose seeding is itself a reset (TorchRL's ``GymEnv`` resets the gymnasium env with the
        seed): its next reset would start the episode after the seeded one; here it starts the seeded one again.
        That is the state TorchRL's ``Collector.set_seed`` leaves its envs in (it steps on from it, with the
        observation it held from before the seed): the collectors seed so, then reset. Returns the next seed."""
        return self._seed(seed, static_seed, episodes=True)

    def _seed(self, seed: int | None, static_seed: bool, episodes: bool) -> int | None:
        self._ensure_open()
        self._touched_since_start = True
        return self._run_set_seed(None if seed is None else int(seed), static_seed, episodes)

    def _set_seed(self, seed: int | None) -> None:
        self.set_seed(seed)

    def update_kwargs(self, kwargs: dict | list[dict]) -> None:
        """Update the constructors' keyword arguments (one dict for every env slot, or one per slot), applied when
        the envs are built next: at once if this env was not reset, stepped nor seeded since it started (as
        TorchRL's envs, which start lazily), else at its next start after ``close()``."""
        update_slot_kwargs(self.create_env_kwargs, kwargs, "num_workers")
        if not self.is_closed and not self._touched_since_start:
            self.close()
            self.start()

    @one_thread
    def rollout(self, max_steps: int, policy=None, callback=None, *, auto_reset: bool = True,
                break_when_any_done: bool | None = None, break_when_all_done: bool | None = None,
                tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """Like ``EnvBase.rollout``: a TensorDict of batch ``[num_envs, steps]`` (time last, its dim named
        ``"time"``). With ``auto_reset=False`` the rollout starts from ``tensordict``, which receives the first step
        (its action and ``"next"``), as with ``EnvBase.rollout``. Its paths, its storage and ``out``: see
        :func:`.rollout.batched_rollout`."""
        return batched_rollout(self, max_steps, policy, callback, auto_reset, break_when_any_done,
                               break_when_all_done, tensordict, kwargs)

    # ----------------------------------------------------------------- closing
    def close(self, *, raise_if_closed: bool = False) -> None:
        """Stop everything this env started; idempotent."""
        if self.__dict__.get("is_closed", True):
            return
        with self._closing:
            if self.is_closed:  # (closed by another thread's close() while this one waited for it)
                return
            calls = self._calls
            calls.closer = threading.get_ident()  # (a call from another thread meanwhile waits, then fails)
            held = self._in_use.acquire(blocking=False)  # this thread's own call, or none: held while shutting down
            if not held:  # another thread is in a call: it ends with the "closed" error, and never starts this env
                calls.closes += 1
            try:
                self.is_closed = True
                self._shutdown()
                self._forget_buffers()
            finally:
                calls.closer = None
                if held:
                    self._in_use.release()

    def _wait_for_close(self) -> None:
        """Wait until the ``close()`` under way in another thread has ended."""
        with self._closing:
            pass

    def _forget_buffers(self) -> None:
        """Drop every view of the buffers so their memory (and, when shared, its file descriptor) is freed."""
        forget_caches(self._step_buffers)
        self._step_buffers = self._root = self._next = self._next_done = None
        self._copy_root = self._copy_next = self._copy_next_leaves = self._copy_root_leaves = None  # buffer views too
        self._done_leaves = None
        self._action_slots = []
        self._common_actions = None
        if "recycler" in self.__dict__:
            self.recycler.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @staticmethod
    def _finalize(ref) -> None:
        if (env := ref()) is not None:
            env.close()

    def _ensure_open(self) -> None:
        if self.is_closed:
            if self._calls.closed_under:
                raise self.closed_under_error("a call")
            self.start()

    def closed_under_error(self, call: str) -> RuntimeError:
        """The one error of a call in flight when ``close()`` came from another thread (or a signal handler)."""
        return RuntimeError(f"this {self.owner} was closed (from another thread or a signal handler?) while "
                            f"{call}{'()' if call.isidentifier() else ''} ran; it starts again at its next call.")

    @one_thread
    @built_on_cpu
    def start(self) -> None:
        """Start this env again if it was closed; a no-op while it is open. As with TorchRL's batched envs, a
        closed env restarts by itself at its next ``reset`` / ``step`` / ``rollout`` (e.g. after TorchRL's
        ``Collector`` closed it at ``total_frames``): fresh envs (and workers), the same specs, unseeded, to be
        reset before they are stepped."""
        if self.is_closed:
            self._bind_buffers(self._start_again())

    def __del__(self):
        with contextlib.suppress(Exception):  # nothing useful can be done at garbage collection
            self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_envs={self.num_envs}, closed={self.is_closed}, "
                f"observation keys={list(self.full_observation_spec.keys(True, True))})")


def built_again(cls: type, arguments: dict) -> BatchedEnv:
    """A batched env of ``cls`` built with ``arguments``: what a pickled ParallelEnv or SerialEnv becomes (see
    their ``__reduce__``)."""
    return cls(**arguments)


def stands_in_for_torchrl(cls: type) -> bool:
    """Whether ``cls`` is a class ``tdcollect run`` made to stand in for one of TorchRL's (``cli/swap.py`` gives it
    the TorchRL class it replaces as ``torchrl_class``): a subclass of tdcollect's, named and placed as TorchRL's."""
    return "torchrl_class" in cls.__dict__


def own_class(env: BatchedEnv) -> type:
    """The class a pickle of ``env`` is built again as: its own, but for a class that stands in for TorchRL's under
    ``tdcollect run`` (named as TorchRL's, so a pickle by name could reach TorchRL's own class in another process):
    then the tdcollect class it extends."""
    return next(cls for cls in type(env).__mro__ if not stands_in_for_torchrl(cls))
