"""The lean rollout loops of BatchedEnv (time is the last batch dimension: ``[num_envs, steps]``)."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase


def random_rollout(env, root: TensorDictBase, max_steps: int, break_when_any_done: bool) -> TensorDictBase:
    """Random actions from ``env.action_spec``, drawn for all steps at once; each step's buffers are copied
    into storage preallocated for ``max_steps`` (one ``foreach`` copy for root, one for next)."""
    n = env.num_envs
    # uninitialised: every entry is written below (zero-filling image storage costs as much as the copies)
    storage = env.fake_tensordict().unsqueeze(1).expand(n, max_steps).apply(
        lambda x: torch.empty(x.shape, dtype=x.dtype))
    storage.update(env.full_action_spec.rand((max_steps,)).transpose(0, 1))
    root_keys = list(env._root.keys(True, True))
    next_keys = list(env._next.keys(True, True))
    root_src = [env._root.get(k) for k in root_keys]
    next_src = [env._next.get(k) for k in next_keys]
    root_dst = [storage.get(k) for k in root_keys]
    next_dst = [storage.get(("next", *_as_tuple(k))) for k in next_keys]
    action_pairs = [
        (buffer, storage.get(key)) for key, buffer, _ in env._action_slots
    ]
    torch._foreach_copy_([d[:, 0] for d in root_dst], [root.get(k) for k in root_keys])
    steps = max_steps
    for t in range(max_steps):
        for buffer, actions in action_pairs:
            buffer.copy_(actions[:, t])
        env._run_step()
        torch._foreach_copy_([d[:, t] for d in next_dst], next_src)
        if break_when_any_done and env._next_done.any():
            steps = t + 1
            break
        if t + 1 < max_steps:
            torch._foreach_copy_([d[:, t + 1] for d in root_dst], root_src)
    env._pending_reset[:] = env._next_done
    return storage if steps == max_steps else storage[:, :steps]


def policy_rollout(env, root: TensorDictBase, policy, max_steps: int, break_when_any_done: bool) -> TensorDictBase:
    """One policy call and one ``step_and_maybe_reset`` per step; the steps are stacked at the end."""
    steps = []
    td = root
    for _ in range(max_steps):
        td = policy(td)
        td, next_root = env.step_and_maybe_reset(td)
        steps.append(td)
        if break_when_any_done and env._next_done.any():
            env._pending_reset[:] = env._next_done
            break
        td = next_root
    return torch.stack(steps, dim=env.batch_dims)


def _as_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)
