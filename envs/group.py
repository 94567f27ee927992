"""EnvGroup: k envs in one process stepping into a ``[k]`` slice of the buffers.

This is what :class:`~tdcollect.envs.SerialEnv` runs in the main process and what every
:class:`~tdcollect.envs.ParallelEnv` worker runs in its own process, so both produce the same data.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from .adapters import block_stepper, make_stepper
from .shared import BufferViews, EnvSpecs
from .specs import check_same_specs


class EnvGroup:
    """Builds one env per factory (here, in this process) and steps them one after the other.

    ``first_index`` is the global index of the group's first env (used in error messages).
    """

    def __init__(self, factories: Sequence[Callable[[], Any]], owner: str, first_index: int = 0):
        self.steppers = []
        self.first_index = first_index
        try:
            for fn in factories:
                self.steppers.append(make_stepper(fn(), owner))
            self.specs: EnvSpecs = self.steppers[0].specs
            check_same_specs({f"env {first_index + i}": stepper.specs for i, stepper in enumerate(self.steppers)},
                             "All envs of one batched env must share their specs.")
        except BaseException:
            self.close()
            raise
        self._seeds: list[int | None] = [None] * len(self.steppers)
        self._block = None

    def __len__(self) -> int:
        return len(self.steppers)

    def bind(self, buffers: TensorDictBase) -> None:
        """Point every stepper at its row of ``buffers`` (batch ``[len(self)]``, see ``shared.py``)."""
        views = BufferViews(buffers, self.first_index)
        for i, stepper in enumerate(self.steppers):
            stepper.bind(views, i)
        self._block = block_stepper(self.steppers, views)

    def set_seeds(self, seeds: Sequence[int]) -> None:
        """Seeds used by each env's next reset (then forgotten: later resets continue its RNG)."""
        self._seeds = list(seeds)

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Reset every env (``mask is None``) or those where ``mask`` (bool ``[k]``) is True."""
        for i, stepper in enumerate(self.steppers):
            if mask is None or mask[i]:
                stepper.reset(self._seeds[i])
                self._seeds[i] = None

    def step(self) -> None:
        """Step every env with its row of the action buffer (auto-resetting the ones that end); as one block
        when the envs allow it (see ``adapters.block_stepper``)."""
        if self._block is not None:
            self._block.step()
            return
        for stepper in self.steppers:
            stepper.step()

    def close(self) -> None:
        for stepper in self.steppers:
            try:
                stepper.close()
            except Exception:  # noqa: BLE001 - closing must go on for the other envs
                pass
        self.steppers = []
        self._block = None
