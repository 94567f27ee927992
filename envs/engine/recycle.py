"""Recycled output memory: the storage of big rollouts and batches reuses memory that nobody holds any more.

Fresh memory costs a page fault per 4 KiB page on first touch (the kernel zeroes every page): for image
observations that is most of the cost of copying a step into a new rollout (measured on Pong frames: 0.50 ms to
copy 1.6 MB into fresh memory, 0.09 ms into memory touched before). So the output storage of rollouts and
collector batches comes from a :class:`Recycler`, which hands out tensors over numpy buffers it keeps, and gives a
buffer out again only when no tensor, view or numpy array over it is left anywhere: a storage the user holds is
never written behind their back.

How "nobody holds it" is known: ``torch.from_numpy`` makes the tensor's storage own a reference to the numpy
buffer for as long as any tensor or view over that storage lives (numpy views over it hold one too). When the
buffer's reference count is down to the recycler's own, nothing else can read or write that memory.

Only buffers of at least ``min_bytes`` are recycled (smaller ones come from the allocator's own free lists and
are cheap). The recycler keeps at most ``keep`` buffers of one size and ``max_bytes`` in all; what it lets go
is freed as soon as the user lets go of it too. ``clear()`` drops every buffer (the env's ``close()`` does).

:class:`OutputSlots` applies the same rule to memory the workers write: a ParallelEnv step's big leaves are
copied by the workers into a free slot, and this process hands the slot out as the step's own tensors, without
copying a frame itself.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import weakref
from collections import OrderedDict

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from .portability import is_linux

#: Buffers smaller than this come straight from the allocator (measured: a 800 KB clone 253 µs, into recycled
#: memory 69 µs; below ~128 KB the allocator reuses its own free lists).
MIN_BYTES = 256 << 10
#: Buffers of one size kept for reuse: leaves often have the same size (an observation and the next one), and
#: a loop may hold one or two batches while it asks for the next.
KEEP = 6
#: Bytes the recycler may keep in all.
MAX_BYTES = 1 << 30
#: New buffers of at least this size are mapped from the kernel directly, in 4 KiB pages, and their pages are
#: faulted in by a background thread while the caller starts writing into them. numpy's own big allocations ask
#: for transparent huge pages, whose first touch on this project's VM (``madvise`` defrag: the kernel compacts
#: memory to find 2 MiB pages) made a fresh env's first Pong rollout (160 MB of new storage) run at 0.46-0.63x
#: a serial loop, against 1.0-1.2x from the second on (``benchmarks/first_rollout.py``).
MAPPED_BYTES = 4 << 20
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault the pages in, writable, leaving their contents as they are
_libc = None

# References to a kept buffer while nobody else holds one: the recycler's list and getrefcount's argument.
_OWN_REFS = 2
# ... to each of a group of arrays (see unheld): their container, the loop's name and getrefcount's argument
_GROUP_REFS = 3


class Recycler:
    """Hands out uninitialised tensors whose memory is reused once nobody holds it (see the module docstring)."""

    def __init__(self, keep: int = KEEP, min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES):
        self.keep = keep
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self._buffers: OrderedDict[int, list[np.ndarray]] = OrderedDict()  # nbytes -> kept buffers, oldest first

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype``: recycled memory when some is free."""
        shape = torch.Size(shape)
        nbytes = shape.numel() * dtype.itemsize
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype, device="cpu")  # (even under a default-device context)
        return torch.from_numpy(self._buffer(nbytes)).view(dtype).view(shape)

    def empty_like(self, template: TensorDictBase) -> TensorDictBase:
        """A TensorDict with ``template``'s keys, shapes, dtypes and batch size (not its names), uninitialised."""
        return template.apply(lambda x: self.empty(x.shape, x.dtype))

    def clone(self, tensordict: TensorDictBase) -> TensorDictBase:
        """A copy of ``tensordict`` (tensor leaves only) in recycled memory (lazily stacked: ``clone()``)."""
        if holds_lazy_stacks(tensordict):
            return tensordict.clone()
        out = self.empty_like(tensordict)
        out.update_(tensordict)
        return out

    def stack(self, tensordicts: list[TensorDictBase], dim: int) -> TensorDictBase:
        """``torch.stack(tensordicts, dim)`` (``dim`` >= 0, within the batch dims) into recycled memory."""
        if _direct(tensordicts):  # e.g. a rollout of a policy that requires grad (out= cannot carry a graph)
            return torch.stack(tensordicts, dim)
        first = tensordicts[0]
        batch = list(first.batch_size)
        batch.insert(dim, len(tensordicts))
        return torch.stack(tensordicts, dim, out=self.empty_like(first.unsqueeze(dim).expand(*batch)))

    def cat(self, tensordicts: list[TensorDictBase], dim: int) -> TensorDictBase:
        """``torch.cat(tensordicts, dim)`` (``dim`` >= 0, within the batch dims) into recycled memory."""
        if _direct(tensordicts):
            return torch.cat(tensordicts, dim)
        first = tensordicts[0]
        batch = list(first.batch_size)
        batch[dim] = sum(td.batch_size[dim] for td in tensordicts)
        one = first[(slice(None),) * dim + (slice(0, 1),)]  # nested TensorDicts keep their own batch dims
        return torch.cat(tensordicts, dim, out=self.empty_like(one.expand(*batch)))

    def clear(self) -> None:
        """Let go of every kept buffer."""
        self._buffers.clear()

    @property
    def kept_bytes(self) -> int:
        return sum(nbytes * len(buffers) for nbytes, buffers in self._buffers.items())

    def _buffer(self, nbytes: int) -> np.ndarray:
        buffers = self._buffers.setdefault(nbytes, [])
        self._buffers.move_to_end(nbytes)
        for i in range(len(buffers)):
            if sys.getrefcount(buffers[i]) <= _OWN_REFS:
                buffers.append(buffers.pop(i))  # most recently handed out last
                return buffers[-1]
        buffer = _fresh(nbytes)
        buffers.append(buffer)
        if len(buffers) > self.keep:
            buffers.pop(0)
        self._trim()
        return buffer

    def _trim(self) -> None:
        """Drop the least recently used sizes until the kept bytes fit ``max_bytes``."""
        while self.kept_bytes > self.max_bytes and self._buffers:
            nbytes, buffers = next(iter(self._buffers.items()))
            buffers.pop(0)
            if not buffers:
                del self._buffers[nbytes]


class OutputSlots:
    """Slots for the big leaves of a ParallelEnv step's output, which the workers fill and this process hands out
    uncopied.

    :meth:`hold` takes the slots: ``buffers``, batch ``[count, num_envs]``, the leaves ``("next", key)`` for each of
    ``keys``, in memory the workers write (shared memory). After the workers copied a step's leaves into slot ``p``,
    :meth:`leaves` gives the step's ``"next"`` leaves in ``order``: the ``keys`` as tensors over slot ``p``, the
    others as ``copy_small()`` copies them. A slot is filled again only when :meth:`free` finds that nothing holds
    it (no tensor, view or numpy array: the rule of the module docstring). To torch the tensors handed out are
    plain CPU tensors, not shared ones: one sent to another process is copied on the way, as any other. A process
    forked from this one would share the slots' memory instead: before any fork, every env retires its slots (the
    next step makes new ones; the old ones are never filled again), so a child holding a frame sees it as it was.

    The env's state around them: ``keys`` (its "next" leaves that slots hold or would hold), ``made`` (it tried to
    make them), ``restarts`` (its pool's replacement counts when the workers were given the slots), ``wanted`` (a
    caller took the last step's outputs: the next step fills a slot), ``filled`` (the slot the last step filled, or
    None)."""

    def __init__(self):
        self.wanted = False
        self.keys = []
        self.forget()
        retire_before_fork(self)

    def forget(self) -> None:
        """No slots (the env closed: the tensors handed out stay valid, their memory lives as long as they do)."""
        self.made = False
        self.buffers = None
        self.restarts = None
        self.filled = None
        self._arrays = []

    def hold(self, buffers: TensorDictBase, keys: list[str], order: list[str], copy_small) -> None:
        self.buffers = buffers
        self._arrays = [tuple(slot.get(("next", key)).numpy() for key in keys) for slot in buffers.unbind(0)]
        self.keys = keys
        self._order = order
        self._copy_small = copy_small
        self._last = -1

    def free(self) -> int | None:
        """A slot that nothing holds (looking from the one after the last handed out), or None."""
        count = len(self._arrays)
        for i in range(1, count + 1):
            p = (self._last + i) % count
            if unheld(self._arrays[p]):
                return p
        return None

    def leaves(self, p: int) -> dict:
        """``{key: tensor}`` of the step the workers copied into slot ``p``, in ``order``."""
        self._last = p
        out = self._copy_small()
        out.update(zip(self.keys, map(torch.from_numpy, self._arrays[p])))
        return {key: out[key] for key in self._order}

    def retire(self) -> None:
        """Never fill the slots handed out so far again (before a fork of this process)."""
        self.made = False  # (only a flag: a step on another thread may be handing one out)


_RETIRE_BEFORE_FORK: weakref.WeakSet = weakref.WeakSet()


def retire_before_fork(holder) -> None:
    """Call ``holder.retire()`` before any fork of this process, as long as ``holder`` lives: for memory handed out
    that the workers may fill again (output slots, rollout storages), which a forked child would share."""
    _RETIRE_BEFORE_FORK.add(holder)


def _retire_before_fork() -> None:
    for holder in list(_RETIRE_BEFORE_FORK):
        holder.retire()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_retire_before_fork)


def unheld(arrays) -> bool:
    """Whether nothing but ``arrays`` (a list or tuple of numpy arrays that a tensor handed out may be over) holds
    any of them: no tensor, view or numpy array of their memory is left (the rule of the module docstring)."""
    return all(sys.getrefcount(array) <= _GROUP_REFS for array in arrays)


def numpy_of(value: torch.Tensor) -> np.ndarray | None:
    """``value.numpy()``, or None for a dtype numpy lacks (bfloat16)."""
    try:
        return value.numpy()
    except TypeError:
        return None


def _fresh(nbytes: int) -> np.ndarray:
    """New memory for a buffer (see ``MAPPED_BYTES``): big ones mapped in 4 KiB pages and faulted in by a background
    thread (the writes that race with it are safe: it changes no byte), small ones from the allocator."""
    if nbytes < MAPPED_BYTES or not is_linux():
        return np.empty(nbytes, dtype=np.uint8)
    buffer = np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)
    threading.Thread(target=populate, args=(buffer,), name="tdcollect-prefault", daemon=True).start()
    return buffer


def populate(array: np.ndarray) -> None:
    """Fault the pages of ``array`` (contiguous) in, writable, leaving its bytes as they are (the GIL is released
    meanwhile); nothing where the kernel cannot."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = array.ctypes.data & ~(mmap.PAGESIZE - 1)  # (madvise takes whole pages)
    _libc.madvise(start, array.ctypes.data + array.nbytes - start, _MADV_POPULATE_WRITE)  # (array keeps it mapped)


def _direct(tensordicts: list[TensorDictBase]) -> bool:
    """True when the result must come from torch's own op, not ``out=`` storage: when the first tensordict holds
    lazily stacked entries (heterogeneous shapes, e.g. one per agent: no one-piece storage), or when autograd
    records and a leaf of the first or last tensordict requires grad (their result must then carry the graph)."""
    first = tensordicts[0]
    if holds_lazy_stacks(first):
        return True
    if not torch.is_grad_enabled():
        return False
    ends = (first, tensordicts[-1])
    return any(getattr(leaf, "requires_grad", False) for td in ends for leaf in td.values(True, True))


def holds_lazy_stacks(td: TensorDictBase) -> bool:
    """Whether ``td`` is or holds a lazily stacked TensorDict (heterogeneous entries: no one-piece storage)."""
    return isinstance(td, LazyStackedTensorDict) or any(isinstance(value, LazyStackedTensorDict)
                                                        for value in td.values(True))
