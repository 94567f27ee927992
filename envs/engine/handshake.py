"""ParallelEnv's half of the start-up handshake (``protocol.py``): the workers' specs agree, the shared buffers are
allocated from them once, and every worker gets the buffers and the masks."""
from __future__ import annotations

import torch

from .shared import EnvSpecs, allocate_buffers, forget_caches, in_shared_memory
from .specs import agreed_specs


class BufferHandshake:
    """ParallelEnv's half of the start-up handshake (``protocol.py``): the workers' specs must agree (with
    each other, and a restarted worker's with the first start's); the first start allocates the shared
    buffers from them; every worker gets the buffers and the reset mask."""

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.specs: EnvSpecs | None = None
        self.buffers = self.reset_tensor = self.step_tensor = None

    def setup(self, infos: dict[int, EnvSpecs]) -> dict:
        self.specs = agreed_specs(self.specs, infos,
                                  "All constructors of one ParallelEnv must build envs with the same specs.")
        if self.buffers is None:  # the first start, or a start after close()
            self.buffers = allocate_buffers(self.specs, self.num_envs, shared=True)
            reset = torch.zeros(self.num_envs, self.specs.batch_numel, dtype=torch.bool)
            self.reset_tensor = in_shared_memory(reset, "the reset masks")
            self.step_tensor = in_shared_memory(torch.zeros(self.num_envs, dtype=torch.bool), "the step masks")
        return {w: (self.buffers, self.reset_tensor, self.step_tensor) for w in infos}

    def ready(self, replies: dict) -> None:
        pass

    def release(self) -> None:
        """Drop the buffers, so that their shared memory (and its file descriptors) is freed at once."""
        forget_caches(self.buffers)
        self.buffers = self.reset_tensor = self.step_tensor = None
