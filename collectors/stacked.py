"""Batches stacked step by step, for envs whose entries cannot have a batch storage allocated once.

Most envs have fixed shapes and tensor entries: their batches are written into storage allocated once (in shared
memory for the process collectors; see ``loop.py``). Two kinds cannot be:

- *dynamic* entries: a dimension of -1 in the spec (a shape that changes from step to step), other than the -1 a
  heterogeneous, lazily stacked spec shows for entries whose shape differs between agents (those have one shape
  per agent, and their storage is a lazy stack of fixed-shape ones);
- *non-tensor* entries (TorchRL ``NonTensor`` specs: strings, objects).

For those the collector loop steps the env as TorchRL's does with ``use_buffers=False``: each step's TensorDict is
kept, and the batch is their lazy stack along time, a ``LazyStackedTensorDict`` ``[*env batch, T]`` (an unbatched
env's steps ``[1, T]``). The process collectors' workers send such batches through their pipe (pickled) instead of
shared memory.
"""
from __future__ import annotations

from tensordict import LazyStackedTensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor, StackedComposite
from torchrl.envs import EnvBase


def stacking_reason(env: EnvBase) -> str | None:
    """Why ``env``'s batches must be stacked step by step (its dynamic or non-tensor entries, named), or None."""
    specs = (env.full_observation_spec, env.full_reward_spec, env.full_done_spec, env.full_action_spec)
    non_tensor = [key for spec in specs for key in spec.keys(True, True) if isinstance(spec[key], NonTensor)]
    dynamic = [key for spec in specs for key in dynamic_keys(spec)]
    if not (non_tensor or dynamic):
        return None
    kinds = [f"non-tensor entries {non_tensor}"] * bool(non_tensor) + [f"dynamic shapes {dynamic}"] * bool(dynamic)
    return " and ".join(kinds)


def dynamic_keys(spec: Composite, prefix: tuple = ()) -> list[tuple]:
    """The keys of ``spec``'s leaves with a dimension of -1, but for the entries of a heterogeneous stack whose
    every part has fixed shapes."""
    if isinstance(spec, StackedComposite):
        found = {key for part in spec.unbind(spec.stack_dim) for key in dynamic_keys(part, prefix)}
        return sorted(found, key=str)
    found = []
    for key, sub in spec.items():
        key = (*prefix, key)
        if isinstance(sub, Composite):
            found += dynamic_keys(sub, key)
        elif -1 in sub.shape:
            found.append(key)
    return found


def stack_steps(steps: list[TensorDictBase], time_dim: int) -> LazyStackedTensorDict:
    """The batch: ``steps`` (one TensorDict per step, of the env's batch shape) lazily stacked at ``time_dim``."""
    return LazyStackedTensorDict.lazy_stack(steps, dim=time_dim)


def reshape_leading(td: TensorDictBase, lead: int, shape: tuple) -> TensorDictBase:
    """``td`` (batch ``[*a, *rest]``, ``len(a) == lead``) with its first ``lead`` batch dims reshaped to ``shape``:
    ``[*shape, *rest]``, as views where the leaves allow. Unlike ``TensorDictBase.reshape`` it takes lazy stacks
    whose stack dim is in ``rest`` (heterogeneous entries, one per agent), part by part."""
    rest = td.batch_size[lead:]
    if isinstance(td, LazyStackedTensorDict):
        if td.stack_dim < lead:
            raise ValueError(f"cannot reshape the batch dims {tuple(td.batch_size[:lead])} of a TensorDict stacked "
                             f"lazily along one of them (dim {td.stack_dim}).")
        parts = [reshape_leading(part, lead, shape) for part in td.tensordicts]
        return LazyStackedTensorDict.lazy_stack(parts, dim=td.stack_dim - lead + len(shape))
    if not any(isinstance(value, LazyStackedTensorDict) for value in td.values(True)):
        return td.reshape(*shape, *rest)
    out = td.empty(batch_size=(*shape, *rest))
    for key, value in td.items():
        if isinstance(value, TensorDictBase):
            out.set(key, reshape_leading(value, lead, shape))
        else:
            out.set(key, value.reshape(*shape, *value.shape[lead:]))
    return out
