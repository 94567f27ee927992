"""A TorchRL env's ``step_mdp`` (the state it is stepped from next: the step's observations and done flags, the
input's other entries), replayed from a recording of TorchRL's own call.

TorchRL's ``_StepMDP`` walks its key trees through TensorDict's generic paths at every step (~20 µs for a
PettingZoo MPE env). What it builds depends only on the keys it is given, in their order, and on the env's specs:
which entries come from the input (``"root"``), which from the step's ``"next"``, in which order, and the batch
size and device of each level. :class:`RecordedStepMdp` records that from TorchRL's own output (each leaf found,
as the very same tensor, in the input or in ``"next"`` at the same key) and replays it while the inputs have
the recorded keys, in the recorded order, at every level it reads, their leaves tensors, and the env's
``_step_mdp`` is the recorded one (specs changed: a new one). Anything else goes through TorchRL's call, which is
recorded in turn (the last few layouts are kept: an env's state after a reset has its keys in another order than
after a step).
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from ..inputs import plain_tensordict

#: layouts kept per env (after a reset, after a step: two in practice)
KEPT_LAYOUTS = 4
#: recordings that found no layout (an output TorchRL builds otherwise than by sharing tensors) before giving up
FAILED_RECORDINGS = 4


class RecordedStepMdp:
    """``__call__(state) -> next state``: ``env._step_mdp(state)`` (``state`` holding the step's ``"next"``), the
    same keys in the same order at every level, the same tensors (shared, as TorchRL shares them), new
    tensordicts, the same batch sizes and devices."""

    def __init__(self, env):
        self.env = env
        self._mdp = None
        self._layouts: list = []
        self._failures = 0

    def __call__(self, state: TensorDictBase) -> TensorDictBase:
        mdp = self.env._step_mdp
        if mdp is not self._mdp:  # (new specs, new rules)
            self._mdp = mdp
            self._layouts = []
        if type(state) is TensorDict:
            next_td = state._tensordict.get("next")
            for layout in self._layouts:
                out = _replayed(layout, state, next_td)
                if out is not None:
                    return out
        out = mdp(state)
        if self._failures < FAILED_RECORDINGS:
            layout = _recorded(out, state, state.get("next", None))
            if layout is None:
                self._failures += 1
            else:
                self._layouts = [layout, *self._layouts][:KEPT_LAYOUTS]
        return out


def _keys(td) -> tuple | None:
    """The keys of a plain TensorDict level, in order; None where there is no such level."""
    return None if td is None else tuple(td._tensordict)


def _plain(td) -> bool:
    return type(td) is TensorDict and td._td_dim_names is None


def _recorded(out, state, next_td):
    """The layout of one level of ``out``: ``(state keys, next keys, entries, batch size, device)`` with
    ``entries`` ``[(key, "root" | "next" | nested layout)]``; None where ``out`` is built otherwise than from
    ``state``'s and ``next_td``'s tensors at the same keys, a tensor is in both (no telling where TorchRL took it
    from), or a level is not a plain TensorDict."""
    if not _plain(out) or (state is not None and not _plain(state)) or (next_td is not None and not _plain(next_td)):
        return None
    entries = []
    for key, value in out._tensordict.items():
        in_state = None if state is None else state._tensordict.get(key)
        in_next = None if next_td is None else next_td._tensordict.get(key)
        if type(value) is torch.Tensor:
            if value is in_state and value is in_next:  # (the env hands back a tensor of its input: which one?)
                return None
            if value is in_state:
                entries.append((key, "root"))
            elif value is in_next:
                entries.append((key, "next"))
            else:
                return None
            continue
        if value is in_state or value is in_next:  # (a tensordict shared as it is: not TorchRL's way, not replayed)
            return None
        nested = _recorded(value, in_state if isinstance(in_state, TensorDictBase) else None,
                           in_next if isinstance(in_next, TensorDictBase) else None)
        if nested is None:
            return None
        entries.append((key, nested))
    return _keys(state), _keys(next_td), entries, out.batch_size, out.device


def _replayed(layout, state, next_td) -> TensorDict | None:
    """One level built from ``layout``; None where ``state`` or ``next_td`` have other keys, another order, or
    anything but tensors where the layout takes them."""
    state_keys, next_keys, entries, batch_size, device = layout
    if state_keys is not None and (type(state) is not TensorDict or state._td_dim_names is not None
                                   or tuple(state._tensordict) != state_keys):
        return None
    if next_keys is not None and (type(next_td) is not TensorDict or next_td._td_dim_names is not None
                                  or tuple(next_td._tensordict) != next_keys):
        return None
    out = {}
    for key, source in entries:
        if source == "root":
            value = state._tensordict[key]
        elif source == "next":
            value = next_td._tensordict[key]
        else:
            value = _replayed(source, None if source[0] is None else state._tensordict[key],
                              None if source[1] is None else next_td._tensordict[key])
            if value is None:
                return None
            out[key] = value
            continue
        if type(value) is not torch.Tensor:
            return None
        out[key] = value
    return plain_tensordict(out, batch_size, device)
