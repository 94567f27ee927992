"""The lean rollout loops of BatchedEnv (time is the last batch dimension: ``[*env.batch_size, steps]``); they use
only the env's buffer API (see ``batched.py``)."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .recorder import StepRecorder


def random_rollout(env, root: TensorDictBase, max_steps: int, break_when_any_done: bool) -> TensorDictBase:
    """Random actions from ``env.action_spec``, drawn for all steps at once; each step's buffers are copied
    into storage preallocated for ``max_steps``."""
    tdim = env.batch_dims
    # uninitialised: every entry is written below (zero-filling image storage costs as much as the copies)
    storage = env.fake_tensordict().unsqueeze(-1).expand(*env.batch_size, max_steps).apply(
        lambda x: torch.empty(x.shape, dtype=x.dtype))
    actions = env.full_action_spec.rand((max_steps,))  # [max_steps, *batch]: time first
    storage.update(actions.transpose(0, 1) if tdim == 1 else actions.permute(*range(1, tdim + 1), 0))
    recorder = StepRecorder(env, storage)
    next_done = env.next_done  # kept: close() from another thread drops the env's own reference
    for key in recorder.root_keys:
        storage.get(key).select(tdim, 0).copy_(root.get(key))
    steps = max_steps
    for t in range(max_steps):
        recorder.load_actions(t)
        env.step_buffers()
        recorder.record_next(t)
        if break_when_any_done and next_done.any():
            steps = t + 1
            break
        if t + 1 < max_steps:
            recorder.record_root(t + 1)
    return storage if steps == max_steps else storage[..., :steps]


def policy_rollout(env, root: TensorDictBase, policy, max_steps: int, break_when_any_done: bool) -> TensorDictBase:
    """One policy call and one ``step_and_maybe_reset`` per step; the steps are stacked at the end."""
    steps = []
    td = root
    for _ in range(max_steps):
        out = policy(td)
        if out is not td:  # a policy that returns a new TensorDict: its entries join the state, as in TorchRL
            td.update(out)
        td, next_root = env.step_and_maybe_reset(td)
        steps.append(td)
        if break_when_any_done and env.next_done.any():
            env.keep_pending_resets()
            break
        td = next_root
    return torch.stack(steps, dim=env.batch_dims)
