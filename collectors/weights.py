"""Policy weights in shared memory: one copy that the main process updates in place and workers read.

``SharedWeights(policy)`` copies the parameters and buffers of ``policy`` into shared memory.
A worker whose policy runs on the CPU *binds* its module to those tensors (no copy at all: an update is
visible at its next forward); a worker whose policy runs elsewhere *pulls* them into its own copy at the
start of each batch when ``version`` changed. Each worker reports the version it acted with.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn


class SharedWeights:
    def __init__(self, module: nn.Module):
        self.params = TensorDict.from_module(module).data.to("cpu").clone().share_memory_()
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()

    def publish(self, source: nn.Module | TensorDictBase) -> None:
        """Copy new weights in place (from a module with the same structure, or a TensorDict of them)."""
        new = TensorDict.from_module(source).data if isinstance(source, nn.Module) else source
        self.params.update_(new)
        self.version += 1

    def bind(self, module: nn.Module) -> None:
        """Make ``module`` (on the CPU) use the shared tensors themselves as its parameters."""
        self.params.to_module(module)

    def pull(self, module_params: TensorDictBase, seen: int) -> int:
        """Copy into ``module_params`` if a newer version was published; returns the version now held."""
        version = int(self.version)
        if version != seen:
            module_params.update_(self.params)
        return version
