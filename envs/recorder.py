"""StepRecorder: the one engine that copies a batched env's step buffers into ``[*env.batch_size, T]`` storage
(time last, TorchRL's rollout layout). Used by the lean rollout and by the collectors' loop."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .shared import key_tuple, numpy_view

LARGE_BYTES = 16384  # leaves of at least this many bytes per step are copied by torch, smaller ones by numpy


class StepRecorder:
    """Copies between the buffers of ``env`` (a ``BatchedEnv``) and column ``t`` of ``storage``.

    ``storage`` (batch ``[*env.batch_size, T]``) must hold the env's root keys (observation keys, done flags),
    its action keys and ``"next"`` with its next keys (observation keys, reward, done flags). ``results``: where
    to read the root and next from instead of the env's buffers (``"root"`` and ``"next"`` laid out as them: one
    of the env's staging copies).
    """

    def __init__(self, env, storage: TensorDictBase, results: TensorDictBase | None = None):
        root, next_ = (env.root_buffer, env.next_buffer) if results is None else (results["root"], results["next"])
        self.root_keys = list(root.keys(True, True))
        self.next_keys = list(next_.keys(True, True))
        self.action_keys = [key for key, _ in env.action_buffers]
        tdim = env.batch_dims
        self._root = _ColumnCopy([(storage.get(k), root.get(k)) for k in self.root_keys], tdim)
        self._next = _ColumnCopy([(storage.get(("next", *key_tuple(k))), next_.get(k)) for k in self.next_keys],
                                 tdim)
        self._actions = _ColumnCopy([(storage.get(k), buffer) for k, buffer in env.action_buffers], tdim)

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
            return buffer.numel() * buffer.element_size() >= LARGE_BYTES

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
