"""How a batched env's steps land in ``[*batch, T]`` storage (time last, TorchRL's rollout layout):
:class:`StepRecorder`, the one piece that copies the step buffers into storage, used by the lean rollouts
(``tdcollect.envs.rollout``), by a worker recording its rows of a rollout (``worker.py``) and by the collectors' loop.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .shared import key_tuple, numpy_view

TORCH_COPY_BYTES = 16384  # leaves of at least this many bytes per step are copied by torch, smaller ones by numpy


class StepRecorder:
    """Copies between step buffers and column ``t`` of ``storage``.

    ``storage`` (batch ``[*batch, T]``, time at dim ``tdim``) must hold the keys of ``root`` (observation keys, done
    flags), the ``actions`` keys and ``"next"`` with the keys of ``next_`` (observation keys, reward, done flags);
    ``root`` and ``next_`` are laid out as a batched env's root and next buffers (batch ``[*batch]``), ``actions``
    is ``[(action key, buffer)]``. :meth:`of` makes one for a ``BatchedEnv``; a ParallelEnv worker makes one over its
    rows of a rollout's storage (``worker.Recording``).
    """

    def __init__(self, storage: TensorDictBase, root: TensorDictBase, next_: TensorDictBase, actions: list,
                 tdim: int):
        self.root_keys = list(root.keys(True, True))
        self.next_keys = list(next_.keys(True, True))
        self.action_keys = [key for key, _ in actions]
        self._root = _ColumnCopy([(storage.get(k), root.get(k)) for k in self.root_keys], tdim)
        self._next = _ColumnCopy([(storage.get(("next", *key_tuple(k))), next_.get(k)) for k in self.next_keys],
                                 tdim)
        self._actions = _ColumnCopy([(storage.get(k), buffer) for k, buffer in actions], tdim)

    @classmethod
    def of(cls, env, storage: TensorDictBase) -> StepRecorder:
        """The recorder of ``env`` (a ``BatchedEnv``) into ``storage`` (batch ``[*env.batch_size, T]``)."""
        return cls(storage, env.root_buffer, env.next_buffer, env.action_buffers, env.batch_dims)

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
            return buffer.numel() * buffer.element_size() >= TORCH_COPY_BYTES

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


def rollout_template(env, max_steps: int) -> TensorDictBase:
    """Zeros shaped as a rollout of ``env`` (``[*env.batch_size, max_steps]``, expanded: no memory per step)."""
    return env.fake_tensordict().unsqueeze(-1).expand(*env.batch_size, max_steps)
