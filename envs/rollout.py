"""The lean rollout loops of BatchedEnv (random actions, a policy), which use only the env's buffer API (see
``batched.py``): each step lands in ``[*env.batch_size, T]`` storage (time last, TorchRL's rollout layout) through
``engine.recording.StepRecorder``, or is recorded by the workers themselves (``engine.worker_rollout``). Their
storage is recycled memory (``engine/recycle.py``) or, when the caller passes ``out``, the caller's own."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from .engine.recording import StepRecorder, rollout_template


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

