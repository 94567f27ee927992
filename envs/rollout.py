"""How a batched env's steps land in ``[*env.batch_size, T]`` storage (time last, TorchRL's rollout layout):
:class:`StepRecorder`, the one engine that copies the step buffers into storage (used by the lean rollouts here and
by the collectors' loop), and the lean rollout loops of BatchedEnv, which use only the env's buffer API (see
``batched.py``). Their storage is recycled memory (``recycle.py``) or, when the caller passes ``out``, the caller's
own."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from .shared import key_tuple, numpy_view

TORCH_COPY_BYTES = 16384  # leaves of at least this many bytes per step are copied by torch, smaller ones by numpy


class StepRecorder:
    """Copies between step buffers and column ``t`` of ``storage``.

    ``storage`` (batch ``[*batch, T]``, time at dim ``tdim``) must hold the keys of ``root`` (observation keys, done
    flags), the ``actions`` keys and ``"next"`` with the keys of ``next_`` (observation keys, reward, done flags);
    ``root`` and ``next_`` are laid out as a batched env's root and next buffers (batch ``[*batch]``), ``actions``
    is ``[(action key, buffer)]``. :meth:`of` makes one for a ``BatchedEnv``; a ParallelEnv worker makes one over its
    rows of a rollout's storage (``env_worker.Recording``).
    """

    def __init__(self, storage: TensorDictBase, root: TensorDictBase, next_: TensorDictBase, actions: list,
                 tdim: int):
        self.root_keys = list(root.keys(True, True))
        self.next_keys = list(next_.keys(True, True))
        self.action_keys = [key for key, _ in actions]
        self._root = _ColumnCopy([(storage.get(k), root.get(k)) for k in self.root_keys], tdim)
        self._next = _ColumnCopy([(storage.get(("next", *key_tuple(k))), next_.get(k)) for k in self.next_keys],
                                 tdim)
        self._actions = _ColumnCopy([(storage.get(k), buffer) for k, buffer in actions], tdim)

    @classmethod
    def of(cls, env, storage: TensorDictBase) -> StepRecorder:
        """The recorder of ``env`` (a ``BatchedEnv``) into ``storage`` (batch ``[*env.batch_size, T]``)."""
        return cls(storage, env.root_buffer, env.next_buffer, env.action_buffers, env.batch_dims)

    def record_root(self, t: int) -> None:
        """Root buffer -> ``storage[:, t]`` (the state the step's action is taken in)."""
        self._root.to_storage(t)

    def record_next(self, t: int) -> None:
        """Next buffer -> ``storage["next"][:, t]`` (what the step returned)."""
        self._next.to_storage(t)

    def record_actions(self, t: int) -> None:
        """Action buffers -> ``storage[:, t]``."""
        self._actions.to_storage(t)

    def load_actions(self, t: int) -> None:
        """``storage[:, t]`` -> action buffers (actions drawn or written into the storage beforehand)."""
        self._actions.from_storage(t)


class _ColumnCopy:
    """``(storage leaf [*batch, T, ...], buffer leaf [*batch, ...])`` pairs, time at dim ``tdim`` (the number of
    batch dims). Small leaves go through numpy views made once (a numpy slice costs a fraction of a torch view),
    large ones through torch (faster on big blocks)."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], tdim: int = 1):
        def large(buffer):
            return buffer.numel() * buffer.element_size() >= TORCH_COPY_BYTES

        self.small = [(numpy_view(dst), numpy_view(src)) for dst, src in pairs if not large(src)]
        self.large = [(dst, src) for dst, src in pairs if large(src)]
        self.tdim = tdim
        self._lead = (slice(None),) * tdim

    def to_storage(self, t: int) -> None:
        at = (slice(None), t) if self.tdim == 1 else (*self._lead, t)
        for dst, src in self.small:
            dst[at] = src
        for dst, src in self.large:
            dst.select(self.tdim, t).copy_(src)

    def from_storage(self, t: int) -> None:
        at = (slice(None), t) if self.tdim == 1 else (*self._lead, t)
        for dst, src in self.small:
            src[...] = dst[at]
        for dst, src in self.large:
            src.copy_(dst.select(self.tdim, t))


def random_rollout(env, root: TensorDictBase, max_steps: int, break_when_any_done: bool,
                   out: TensorDictBase | None = None) -> TensorDictBase:
    """Random actions from ``env.action_spec``, drawn for all steps at once; each step's buffers are copied
    into storage preallocated for ``max_steps``."""
    tdim = env.batch_dims
    rolls = getattr(env, "worker_rollouts", None)  # a ParallelEnv: its workers record the steps
    storage = rolls.storage(max_steps) if rolls is not None and out is None else None
    if storage is None:
        rolls = None
        template = rollout_template(env, max_steps)
        # uninitialised: every entry is written below (zero-filling image storage costs as much as the copies)
        storage = env.recycler.empty_like(template) if out is None else checked_out(out, template)
    actions = env.full_action_spec.rand((max_steps,))  # [max_steps, *batch]: time first
    storage.update_(actions.transpose(0, 1) if tdim == 1 else actions.permute(*range(1, tdim + 1), 0))
    for key in env.root_buffer.keys(True, True):
        storage.get(key).select(tdim, 0).copy_(root.get(key))
    if rolls is not None:
        steps = _in_workers(env, rolls, max_steps, break_when_any_done)
    else:
        steps = _stepped(env, StepRecorder.of(env, storage), max_steps, break_when_any_done)
    return storage if steps == max_steps else storage[..., :steps]


def rollout_template(env, max_steps: int) -> TensorDictBase:
    """Zeros shaped as a rollout of ``env`` (``[*env.batch_size, max_steps]``, expanded: no memory per step)."""
    return env.fake_tensordict().unsqueeze(-1).expand(*env.batch_size, max_steps)


def _in_workers(env, rolls, max_steps: int, break_when_any_done: bool) -> int:
    """The workers record the steps themselves (see ``worker_rollout.py``): all at once, or one at a time when the
    done flags must be read (``break_when_any_done``) or the values checked after each step."""
    if not (break_when_any_done or env.check_values):
        rolls.run(0, max_steps)
        return max_steps
    for t in range(max_steps):
        rolls.run(t, t + 1)
        if break_when_any_done and env.next_done.any():
            return t + 1
    return max_steps


def _stepped(env, recorder: StepRecorder, max_steps: int, break_when_any_done: bool) -> int:
    """One step after the other, each copied into the storage; returns the steps taken."""
    next_done = env.next_done  # kept: close() from another thread drops the env's own reference
    for t in range(max_steps):
        recorder.load_actions(t)
        env.step_buffers()
        recorder.record_next(t)
        if break_when_any_done and next_done.any():
            return t + 1
        if t + 1 < max_steps:
            recorder.record_root(t + 1)
    return max_steps


def policy_rollout(env, root: TensorDictBase, policy, max_steps: int, break_when_any_done: bool,
                   out: TensorDictBase | None = None) -> TensorDictBase:
    """One policy call and one ``step_and_maybe_reset`` per step; the steps are stacked at the end."""
    steps = []
    td = root
    for _ in range(max_steps):
        policy_out = policy(td)
        if policy_out is not td:  # a policy that returns a new TensorDict: its entries join the state, as in TorchRL
            td.update(policy_out)
        td, next_root = env.step_and_maybe_reset(td)
        steps.append(td)
        if break_when_any_done and env.next_done.any():
            env.keep_pending_resets()
            break
        td = next_root
    if out is None:
        return env.recycler.stack(steps, env.batch_dims)
    storage = checked_out(out, steps[0].unsqueeze(env.batch_dims).expand(*env.batch_size, max_steps))
    if len(steps) == max_steps:
        return torch.stack(steps, env.batch_dims, out=storage)
    return torch.stack(steps, env.batch_dims, out=storage[..., :len(steps)])


def checked_out(out: TensorDictBase, template: TensorDictBase) -> TensorDictBase:
    """``out`` if it can hold a rollout shaped like ``template`` (same batch size; every key of ``template`` with
    the same shape and dtype), else a ValueError that says what differs."""
    if not isinstance(out, TensorDictBase):
        raise TypeError(f"rollout(out=...) takes a TensorDict, got {type(out).__name__}.")
    if out.batch_size != template.batch_size:
        raise ValueError(f"rollout(out=...): out has batch size {tuple(out.batch_size)}, the rollout needs "
                         f"{tuple(template.batch_size)} ([*env.batch_size, max_steps]).")
    for key, leaf in template.items(True, True):
        have = out.get(key, None)
        if have is None or have.shape != leaf.shape or have.dtype != leaf.dtype:
            found = "missing" if have is None else f"{tuple(have.shape)} {have.dtype}"
            raise ValueError(f"rollout(out=...): out[{key!r}] must be {tuple(leaf.shape)} {leaf.dtype}, found "
                             f"{found}; pass an earlier rollout's output of the same length.")
    return out


def batched_rollout(env, max_steps: int, policy, callback, auto_reset: bool, break_when_any_done: bool | None,
                    break_when_all_done: bool | None, tensordict: TensorDictBase | None,
                    kwargs: dict) -> TensorDictBase:
    """``env.rollout(...)`` (see ``BatchedEnv.rollout``): the lean paths, or ``EnvBase.rollout`` for a callback,
    the rarer options (``set_truncated``, ``actions``), non-tensor entries and outputs on another device than the CPU.

    On a lean path, random actions are drawn from ``action_spec`` all at once and every step is copied into
    preallocated storage; with a policy, one policy call and one ``step_and_maybe_reset`` per step. The storage is
    new memory the caller owns, or memory of an earlier rollout that nothing holds any more (``recycle.py``): a
    rollout the caller still holds is never written again. ``out`` (a TensorDict of batch ``[num_envs, max_steps]``
    with this rollout's keys, e.g. an earlier rollout's output) opts in to writing into the caller's own storage; it
    is returned (cut to the steps taken when an episode ended)."""
    rare = {k: v for k, v in kwargs.items() if v is not None and v is not False}
    rare.pop("return_contiguous", None)
    rare.pop("trust_policy", None)
    storing_device = rare.pop("storing_device", None)
    out = rare.pop("out", None)
    if callback is not None or break_when_all_done or rare or env._non_tensor_keys or env._cast is not None:
        return EnvBase.rollout(
            env, max_steps, policy, callback, auto_reset=auto_reset, break_when_any_done=break_when_any_done,
            break_when_all_done=break_when_all_done, tensordict=tensordict, storing_device=storing_device,
            **{**kwargs, "out": out},
        )
    env._ensure_open()
    break_when_any_done = True if break_when_any_done is None else break_when_any_done
    root = env.reset() if auto_reset else tensordict
    if root is None:
        raise ValueError("rollout(auto_reset=False) needs the initial state as `tensordict`.")
    if policy is None:
        out = random_rollout(env, root, max_steps, break_when_any_done, out)
    else:
        out = policy_rollout(env, root, policy, max_steps, break_when_any_done, out)
    if not auto_reset:
        tensordict.update(out[..., 0])  # as EnvBase.rollout: the input becomes the first step
    out.refine_names(..., "time")
    return out if storing_device is None else out.to(storing_device)

