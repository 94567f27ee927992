"""Policy weights in shared memory: one set that the main process updates in place and workers read.

``SharedWeights(policy)`` puts the parameters and buffers of ``policy`` in shared memory: on the CPU the module's
own tensors move there (as TorchRL's collectors do: the workers then act with the trainer's weights as they are, and
an in-place edit such as an optimizer step reaches them at their next forward; ``update_policy_weights_`` marks a new
version), elsewhere a CPU copy is made, updated by ``update_policy_weights_``. A worker whose policy runs on
the CPU *binds* its module to those tensors (no copy at all: an update is visible at its next forward); a worker
whose policy runs elsewhere *pulls* them into its own copy at the start of each batch when ``version`` changed.
Each worker reports the version it acted with.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from tdcollect.envs.engine.shared import in_shared_memory

from .policies import policy_module


def policy_weights_of(source) -> TensorDictBase:
    """The weights of a policy as a TensorDict of its parameters and buffers (sharing their memory):
    ``source`` is a policy as the user passed it or as a collector wrapped it, any ``nn.Module``, or already
    a TensorDict of weights (returned as it is). Keys are those of the user's module."""
    if isinstance(source, TensorDictBase):
        return source
    module = policy_module(source)
    if module is None:
        raise TypeError(f"policy weights come from an nn.Module or a TensorDict of its weights, got "
                        f"{type(source).__name__}.")
    return TensorDict.from_module(module).data


def requested_weights(policy_weights, kwargs: dict, ignored: tuple[str, ...] = ()):
    """The weights an ``update_policy_weights_`` call asks for: ``policy_weights``, or TorchRL's keywords
    ``policy_or_weights`` and ``weights_dict={"policy": weights}``; the keywords in ``ignored`` are accepted and
    dropped, any other is a ``TypeError``."""
    weights = kwargs.pop("policy_or_weights", policy_weights)
    by_model = kwargs.pop("weights_dict", None)  # TorchRL's {model id: weights}; the policy is the one model here
    if by_model is not None:
        if set(by_model) - {"policy"}:
            raise ValueError(f"update_policy_weights_(weights_dict=...): only the policy's weights (key 'policy') "
                             f"reach the workers, got keys {sorted(by_model)}.")
        weights = by_model.get("policy", weights)
    for name in ignored:
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"update_policy_weights_ got unexpected arguments {sorted(kwargs)}.")
    return weights


class SharedWeights:
    def __init__(self, module):
        weights = policy_weights_of(module)
        on_cpu = all(leaf.device.type == "cpu" for leaf in weights.values(True, True))
        self.params = in_shared_memory(weights if on_cpu else weights.to("cpu").clone(), "the policy's shared weights")
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()

    def publish(self, source) -> None:
        """Copy new weights in place (from a policy or module of the same structure, or a TensorDict of
        them; see :func:`policy_weights_of`)."""
        weights = policy_weights_of(source)
        if not _same_memory(weights, self.params):  # the module's own (shared) tensors: nothing to copy
            self.params.update_(weights)
        self.version += 1

    def bind(self, module) -> None:
        """Make ``module`` (on the CPU) use the shared tensors themselves as its parameters."""
        self.params.to_module(module)

    def pull(self, module_params: TensorDictBase, version_held: int) -> int:
        """Copy into ``module_params`` if a newer version was published; returns the version now held."""
        version = int(self.version)
        if version != version_held:
            module_params.update_(self.params)
        return version


def _same_memory(a: TensorDictBase, b: TensorDictBase) -> bool:
    """Whether the leaves of ``a`` are those of ``b`` (same keys, same memory)."""
    leaves_b = dict(b.items(True, True))
    return all(key in leaves_b and leaf.data_ptr() == leaves_b[key].data_ptr()
               for key, leaf in a.items(True, True))
