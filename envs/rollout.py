"""The lean rollout loops of BatchedEnv (time is the last batch dimension: ``[num_envs, steps]``)."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .shared import numpy_view


def random_rollout(env, root: TensorDictBase, max_steps: int, break_when_any_done: bool) -> TensorDictBase:
    """Random actions from ``env.action_spec``, drawn for all steps at once; each step's buffers are copied
    into storage preallocated for ``max_steps``. The per-step copies go through numpy views made once
    (a numpy slice costs a fraction of a torch view)."""
    n = env.num_envs
    # uninitialised: every entry is written below (zero-filling image storage costs as much as the copies)
    storage = env.fake_tensordict().unsqueeze(1).expand(n, max_steps).apply(
        lambda x: torch.empty(x.shape, dtype=x.dtype))
    storage.update(env.full_action_spec.rand((max_steps,)).transpose(0, 1))
    root_keys = list(env._root.keys(True, True))
    next_keys = list(env._next.keys(True, True))
    # (destination [num_envs, steps, ...], source [num_envs, ...]) pairs
    actions = [(numpy_view(buffer), numpy_view(storage.get(key))) for key, buffer, _ in env._action_slots]
    roots = [(storage.get(k), env._root.get(k)) for k in root_keys]
    nexts = [(storage.get(("next", *_as_tuple(k))), env._next.get(k)) for k in next_keys]
    for key, (dst, _) in zip(root_keys, roots):
        dst[:, 0] = root.get(key)
    small_roots, large_roots = _split_by_size(roots)
    small_nexts, large_nexts = _split_by_size(nexts)
    steps = max_steps
    for t in range(max_steps):
        for buffer, drawn in actions:
            buffer[...] = drawn[:, t]
        env._run_step()
        for dst, src in small_nexts:
            dst[:, t] = src
        for dst, src in large_nexts:
            dst.select(1, t).copy_(src)
        if break_when_any_done and env._next_done.any():
            steps = t + 1
            break
        if t + 1 < max_steps:
            for dst, src in small_roots:
                dst[:, t + 1] = src
            for dst, src in large_roots:
                dst.select(1, t + 1).copy_(src)
    env._pending_reset[:] = env._next_done
    return storage if steps == max_steps else storage[:, :steps]


def _split_by_size(pairs, large_bytes: int = 16384):
    """(small pairs as numpy arrays, large pairs as tensors): numpy slices are cheaper to make, torch copies
    large blocks faster."""
    small = [(numpy_view(dst), numpy_view(src)) for dst, src in pairs if src.numel() * src.element_size() < large_bytes]
    large = [(dst, src) for dst, src in pairs if src.numel() * src.element_size() >= large_bytes]
    return small, large


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
