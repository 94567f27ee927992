"""The step buffers: one TensorDict per batched env, allocated once, optionally in shared memory.

Layout (batch size ``[num_envs, *B]``, ``B`` one env's batch shape, ``()`` unless the envs are batched TorchRL
envs; every leaf's first dimension is the env index)::

    buffers["root"]    observation keys + "done"/"terminated"/"truncated"  -- the state an action is taken in
                       (after a step: the next observation, or the reset observation where the env was done)
    buffers["next"]    observation keys + "reward" + done keys               -- what the last step returned
    buffers["action"]  action keys (``"action"``, possibly nested)           -- written by the main process

A worker binds to its slice ``buffers[start:stop]``; all views share storage with the main process' tensors,
so nothing is pickled per step. Also here: the bookkeeping of the shared segments' handles offered to workers
(``unfetched_fds``) and of the segments a dead worker left half made (``reap``); reading nested entries of step
data (``entries_at``) and building plain TensorDicts around given entries (``is_plain``, ``plain_tensordict``).
"""
from __future__ import annotations

import errno
import mmap
import multiprocessing.reduction
import multiprocessing.resource_sharer
import os
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor, StackedComposite

from .errors import ArgumentError, SharedMemoryError, open_files_error
from .portability import SHM_DIR, is_out_of_files, leftover_shm_files, open_files_limit, shm_free_bytes


@dataclass
class EnvSpecs:
    """The full specs of one env (all ``Composite``), of shape ``batch_shape``: ``()`` for an unbatched env
    (a gymnasium env, an unbatched TorchRL env, ...), the env's ``batch_size`` for a batched TorchRL env."""

    observation: Composite
    action: Composite
    reward: Composite
    done: Composite

    @property
    def batch_shape(self) -> torch.Size:
        return self.observation.shape

    @property
    def batch_numel(self) -> int:
        """Elements in one env's batch (1 for an unbatched env)."""
        return self.batch_shape.numel()

    def root_spec(self) -> Composite:
        return merge_specs(self.observation, self.done)

    def next_spec(self) -> Composite:
        return merge_specs(self.observation, self.reward, self.done)

    def buffer_spec(self) -> Composite:
        return Composite(
            root=self.root_spec(), next=self.next_spec(), action=self.action.clone(), shape=self.batch_shape
        )

    def non_tensor_keys(self) -> tuple[list, list]:
        """``(root keys, next keys)`` of the non-tensor entries (TorchRL ``NonTensor`` specs: strings, objects):
        they have no place in the buffers and travel by pipe after each step and reset (see ``protocol.py``)."""
        return non_tensor_keys(self.root_spec()), non_tensor_keys(self.next_spec())

    def as_composite(self) -> Composite:
        """All four specs in one Composite (used to compare the specs of two envs)."""
        return Composite(
            observation=self.observation,
            action=self.action,
            reward=self.reward,
            done=self.done,
            shape=(),
        )


class EnvObjects:
    """The envs' non-tensor entries (strings, objects: ``keys``), which no buffer holds: each env's last ``"root"``
    and ``"next"`` TensorDict of them, as its steps and resets returned them, added to a caller's outputs."""

    def __init__(self, keys: tuple[list, list], num_envs: int):
        self.keys = list(dict.fromkeys([*keys[0], *keys[1]]))  # (``EnvSpecs.non_tensor_keys``: root's, next's)
        self.last = {"root": [None] * num_envs, "next": [None] * num_envs}

    def keep(self, objects: list | None) -> None:
        """Keep what a step or reset returned: ``[(env index, {"root": td, "next": td or None})]``, or None."""
        for i, entries in objects or ():
            self.last["root"][i] = entries["root"]
            if entries["next"] is not None:
                self.last["next"][i] = entries["next"]

    def not_stepped(self, envs: list[int]) -> None:
        """Envs a partial step left out: what they hold stands for their ``"next"``."""
        for i in envs:
            self.last["next"][i] = self.last["root"][i]

    def added_to(self, out: TensorDictBase, which: str) -> TensorDictBase:
        """``out`` with the envs' last entries (``which``: ``"root"`` or ``"next"``), stacked over the envs (one
        value per env), once every env has some."""
        kept = self.last[which]
        if self.keys and all(entry is not None for entry in kept):
            stacked = torch.stack(kept)
            for key in self.keys:
                value = stacked.get(key, None)
                if value is not None:
                    out.set(key, value)
        return out


def merge_specs(*specs: Composite) -> Composite:
    """One Composite with the entries of all ``specs`` (cloned). A group key present in several (e.g.
    ``"agents"`` holding observations and rewards) is merged level by level, keeping its shape."""
    merged = Composite(shape=specs[0].shape)
    for spec in specs:
        _merge_into(merged, spec)
    return merged


def _merge_into(target: Composite, spec: Composite) -> None:
    for key in spec.keys():
        sub = spec[key]
        if key in target.keys() and isinstance(sub, Composite) and isinstance(target[key], Composite):
            _merge_into(target[key], sub)
        else:
            target[key] = sub.clone()


def non_tensor_keys(spec: Composite) -> list:
    """The keys of ``spec``'s ``NonTensor`` leaves."""
    return [key for key in spec.keys(True, True) if isinstance(spec[key], NonTensor)]


def unbufferable(spec: Composite) -> str | None:
    """Why entries of ``spec`` (a buffer spec, see :meth:`EnvSpecs.buffer_spec`) cannot have buffers allocated once
    (a message that says how to fix it), or None when they can."""
    dynamic = [f"{key} {tuple(spec[key].shape)}" for key in spec.keys(True, True) if -1 in spec[key].shape]
    if dynamic:
        more = f" and {len(dynamic) - 4} more" if len(dynamic) > 4 else ""
        return (f"the envs' specs are dynamic (a dimension of -1, from shapes that change or from heterogeneous "
                f"entries stacked lazily: {', '.join(dynamic[:4])}{more}): the buffers, allocated once, need fixed "
                "shapes. Pad the entries to a fixed size in the env (or a transform), or use "
                "torchrl.envs.ParallelEnv(..., use_buffers=False) for these envs.")
    stacked = [key for key in spec.keys(True) if isinstance(spec[key], StackedComposite)]
    if isinstance(spec, StackedComposite) or stacked:
        return (f"the envs' specs are heterogeneous (entries of different shapes stacked lazily, e.g. one per agent: "
                f"{stacked or 'at the top'}): the buffers need one shape per entry. Give every agent group its own "
                "key with one shape, or use torchrl.envs.ParallelEnv for these envs.")
    return None


def allocate_buffers(specs: EnvSpecs, num_envs: int, shared: bool) -> TensorDict:
    """Zero-filled buffers of batch ``[num_envs, *specs.batch_shape]`` for every tensor entry (non-tensor entries
    are left out); in shared memory when ``shared``. An :class:`~tdcollect.envs.errors.ArgumentError` when
    :func:`unbufferable`."""
    spec = specs.buffer_spec()
    problem = unbufferable(spec)
    if problem is not None:
        raise ArgumentError(problem)
    shape = (num_envs, *specs.batch_shape)
    buffers = zeros(spec, shape[: len(shape) - len(spec.shape)])
    return in_shared_memory(buffers, "the step buffers") if shared else buffers


def zeros(spec: Composite, leading: tuple[int, ...] = ()):
    """A zero for every tensor leaf of ``spec`` (``NonTensor`` leaves left out), each of shape ``[*leading,
    *leaf.shape]``, nested as ``spec`` is, each TensorDict of ``[*leading, *its Composite's shape]``, or of its
    ``data_cls`` (a tensorclass) where it has one: what ``spec.expand(*leading, *spec.shape).zero()`` gives without
    TorchRL's ``expand`` (which checks every bounded leaf's bounds with ``allclose`` over the expanded copies: 0.2 s
    for two 84x84x3 frame envs) and without its route through ``TensorDict.from_dict``, which imports pandas and
    h5py where they are installed (about 1 s in each fresh worker process)."""
    data = TensorDict({}, batch_size=(*leading, *spec.shape), device=spec.device)
    for key, entry in spec.items():
        if entry is None or isinstance(entry, NonTensor):
            continue
        data.set(key, zeros(entry, leading) if isinstance(entry, Composite) else entry.zero(leading))
    if spec.data_cls is not None:
        return spec.data_cls.from_tensordict(data)
    return data


# ----------------------------------------------------------------- shared memory
def shm_error(needed: int, what: str) -> SharedMemoryError:
    """The error for ``needed`` bytes of shared memory that cannot be had, with what is free and the fixes."""
    free = shm_free_bytes()
    has = "" if free is None else f", {_size(free)} free in {SHM_DIR}"
    return SharedMemoryError(
        f"not enough shared memory for {what}: {_size(needed)} needed{has}. Give the machine or container more "
        f"(docker run --shm-size=2g ..., or a larger tmpfs on {SHM_DIR}), or use fewer envs, shorter batches or "
        "smaller observations."
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def forget_caches(data) -> None:
    """Empty the caches of a TensorDict and of the TensorDicts nested in it. A locked TensorDict (shared memory locks
    it) caches views of its keys, each of which holds the TensorDict: a reference cycle that, once the TensorDict is
    dropped, keeps its leaves (and their shared memory and file descriptors) until the garbage collector runs. Call
    it on buffers about to be dropped."""
    if not isinstance(data, TensorDictBase):
        return
    data._erase_cache()
    parts = getattr(data, "tensordicts", None)  # a lazy stack: its parts (their leaves may not stack)
    for value in data.values() if parts is None else parts:
        forget_caches(value)


def nbytes(data) -> int:
    """The bytes of a tensor's or a TensorDict's leaves (a lazy stack's parts one by one: their leaves may differ in
    shape). (TensorDict's own ``bytes()`` leaves a reference cycle holding every leaf: measured in a process that
    never runs the garbage collector, each call kept its tensors, and so their shared memory, alive.)"""
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    parts = getattr(data, "tensordicts", None)
    if parts is not None:
        return sum(nbytes(part) for part in parts)
    return sum(nbytes(value) for value in data.values() if isinstance(value, (torch.Tensor, TensorDictBase)))


def in_shared_memory(data, what: str):
    """``data`` (a tensor or TensorDict) moved into shared memory, as ``data.share_memory_()`` does, or a
    :class:`SharedMemoryError` naming ``what`` when ``/dev/shm`` cannot hold it (checked before any byte is
    written; torch reserves the pages of each segment, so a full ``/dev/shm`` is an error, never a SIGBUS)."""
    needed = nbytes(data)
    free = shm_free_bytes()
    if free is not None and needed > free:
        raise shm_error(needed, what)
    try:
        return data.share_memory_()
    except RuntimeError as err:
        if "No space left on device" in str(err) or "unable to allocate shared memory" in str(err):
            raise shm_error(needed, what) from None
        if is_out_of_files(err):
            raise open_files_error(f"sharing {what}", open_files_limit()) from err
        raise


class MappedTensors:
    """Uninitialised tensors shaped as ``template``'s leaves (keys, shapes, dtypes, batch size), in one anonymous
    shared memory file (``memfd``) that workers map too: pickled (in a command's arguments), it travels as its file
    descriptor and opens mapped in the receiving process. Its pages are made on first touch, by whoever writes them
    first (no byte is written here: a rollout's storage is faulted in by the workers that fill it, in parallel). Not
    in ``/dev/shm``, so not bounded by its size. ``tensordict()``: the leaves as a TensorDict, over numpy arrays
    (``arrays``, in ``template``'s key order) that to torch are plain CPU tensors, not shared ones."""

    def __init__(self, template: TensorDictBase | None = None, fd: int | None = None, size: int = 0,
                 layout: list | None = None, batch_size=(), nested: list | None = None):
        if template is not None:
            # the nested TensorDicts' batch sizes (e.g. an agent group's ``[*batch, agents]``), parents first
            nested = [(key, sub.batch_size) for key, sub in template.items(True) if isinstance(sub, TensorDictBase)]
            layout = []
            size = 0
            for key, leaf in template.items(True, True):
                layout.append((key, leaf.dtype, tuple(leaf.shape), size))
                size += -(-leaf.numel() * leaf.element_size() // mmap.PAGESIZE) * mmap.PAGESIZE
            fd = os.memfd_create("tdcollect-rollout", os.MFD_CLOEXEC)
            batch_size = template.batch_size
            weakref.finalize(self, os.close, fd)
            os.ftruncate(fd, max(size, 1))
        self.fd = fd
        self.size = size
        self.layout = layout
        self.batch_size = torch.Size(batch_size)
        self.nested = nested
        self._map = mmap.mmap(fd, max(size, 1))
        self.arrays = [np.frombuffer(self._map, numpy_dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
                       for _, dtype, shape, offset in layout]

    def tensordict(self) -> TensorDict:
        """The tensors as a TensorDict on the CPU (where they are: a rollout of a CPU env says so, as TorchRL's)."""
        out = TensorDict(batch_size=self.batch_size, device="cpu")
        for key, batch_size in self.nested:
            out.set(key, TensorDict(batch_size=batch_size, device="cpu"))
        for (key, *_), array in zip(self.layout, self.arrays):
            out.set(key, torch.from_numpy(array))
        return out

    def __reduce__(self):
        return _open_mapped, (multiprocessing.reduction.DupFd(self.fd), self.size, self.layout, self.batch_size,
                              self.nested)


def _open_mapped(dup, size: int, layout: list, batch_size, nested: list) -> MappedTensors:
    fd = dup.detach()
    try:
        mapped = MappedTensors(fd=fd, size=size, layout=layout, batch_size=batch_size, nested=nested)
    finally:
        os.close(fd)  # (the mapping stays)
    mapped.fd = None
    return mapped


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """numpy's dtype for torch's ``dtype``; a TypeError for one numpy lacks (bfloat16)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def semaphore(context):
    """``context.Semaphore(0)``; :class:`SharedMemoryError` when ``/dev/shm`` has no room left for it."""
    try:
        return context.Semaphore(0)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.ENOMEM):
            raise shm_error(32, "the workers' semaphores") from None
        raise


def reap(proc, timeout: float) -> None:
    """Join the worker process ``proc`` (up to ``timeout`` s); if it died other than by a clean exit, unlink the
    ``/dev/shm`` files it left half made. Torch makes each shared segment as a file named ``torch_<pid>_...``,
    reserves its pages, then unlinks it: a worker killed in between (a kill while it shares a tensor) leaves the
    file for good. Only under torch's default ``file_descriptor`` strategy, where no such file is meant to
    outlive its maker's next instruction."""
    proc.join(timeout)
    pid = proc.pid
    if proc.exitcode in (None, 0) or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    for path in leftover_shm_files(pid):
        try:
            os.unlink(path)
        except OSError:
            pass


class BufferViews:
    """Views over a ``[k]`` slice of the buffers, as TensorDicts and as numpy arrays (same memory).
    ``first_index``: the index, in the batched env, of the slice's first row (error messages name envs by it)."""

    def __init__(self, buffers: TensorDictBase, first_index: int = 0):
        self.first_index = first_index
        self.root = buffers.get("root")
        self.next = buffers.get("next")
        self.action = buffers.get("action")
        self.root_np = numpy_tree(self.root)
        self.next_np = numpy_tree(self.next)
        self.action_np = numpy_tree(self.action)


#: A TensorDict's whole state, as ``TensorDict._new_unsafe`` leaves it without device, names or lock
_PLAIN_STATE = {"_device": None, "_tensordict": {}, "_batch_size": torch.Size(), "_td_dim_names": None}


def plain_tensordict(leaves: dict, batch_size: torch.Size, device: torch.device | None = None) -> TensorDict:
    """``TensorDict._new_unsafe(leaves, batch_size=batch_size, device=device)`` (entries already on ``device``, no
    names nor lock) with ``leaves`` as its entries (not copied), in 0.6 µs against 3 µs: its state set at once. A
    tensordict version whose state differs is detected at import and gets ``_new_unsafe``."""
    td = _new_object(TensorDict)
    td.__dict__.update(_device=device, _tensordict=leaves, _batch_size=batch_size, _td_dim_names=None)
    return td


_new_object = object.__new__
if TensorDict._new_unsafe({}, batch_size=torch.Size()).__dict__ != _PLAIN_STATE:  # another tensordict layout
    def plain_tensordict(leaves: dict, batch_size: torch.Size, device: torch.device | None = None) -> TensorDict:  # noqa: F811
        return TensorDict._new_unsafe(leaves, batch_size=batch_size, device=device)


def is_plain(td) -> bool:
    """Whether ``td`` is a plain TensorDict (not a subclass, a lazy stack or a non-tensor entry) without dim names:
    one whose entries can be read and built directly (``_tensordict``, :func:`plain_tensordict`)."""
    return type(td) is TensorDict and td._td_dim_names is None


def key_tuple(key) -> tuple:
    """A TensorDict key as a tuple: ``"obs"`` -> ``("obs",)``; a tuple stays as it is."""
    return key if isinstance(key, tuple) else (key,)


def entries_at(tensordict: TensorDictBase, keys: list) -> list:
    """``[tensordict.get(key, None) for key in keys]``; through plain TensorDicts their entries are read directly
    (measured: 0.3 µs against 3 µs per nested key through ``get``'s key handling), anything else (lazy stacks,
    non-tensor entries) through ``get``."""
    return [_entry_at(tensordict, key) for key in keys]


def _entry_at(tensordict: TensorDictBase, key):
    node = tensordict
    for part in key_tuple(key):
        if type(node) is not TensorDict:
            return tensordict.get(key, None)
        node = node._tensordict.get(part)
        if node is None:
            return None
    return node if type(node) is torch.Tensor else tensordict.get(key, None)


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor; dtypes numpy lacks (bfloat16, ...) are viewed as same-size ints."""
    try:
        return tensor.numpy()
    except TypeError:
        return tensor.view(_SAME_SIZE_INT[tensor.element_size()]).numpy()


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def numpy_tree(td: TensorDictBase) -> dict:
    """A nested dict of numpy arrays that share memory with the TensorDict's CPU leaves."""
    tree = {}
    for key, value in td.items():
        tree[key] = numpy_tree(value) if isinstance(value, TensorDictBase) else numpy_view(value)
    return tree


def allocate_copies(results: TensorDictBase, count: int, what: str) -> TensorDict:
    """``count`` copies of ``results`` (some of the buffers, e.g. big ``"next"`` leaves) in shared memory, batch
    ``[count, num_envs, *B]``, that workers copy their rows of a step's results into: ParallelEnv's output slots
    (see ``recycle.OutputSlots``). ``what`` names them in a :class:`SharedMemoryError`."""
    return in_shared_memory(torch.stack([results] * count).clone(), what)


class SlotCopy:
    """A worker's copy of its rows of the step buffers (``buffers``, its ``[k]`` slice) into the same rows of one
    output slot (``slot``, ``[k]``, see ``allocate_copies``): numpy views made once, one ``copyto`` per leaf."""

    def __init__(self, buffers: TensorDictBase, slot: TensorDictBase):
        self.pairs = [(numpy_view(slot.get(key)), numpy_view(buffers.get(key)))
                      for key in slot.keys(True, True)]

    def copy(self) -> None:
        for dst, src in self.pairs:
            np.copyto(dst, src)


def unfetched_fds() -> set:
    """Keys of the file descriptors this process offers to others (shared-memory tensors sent through a
    pipe) that no process has fetched yet."""
    sharer = getattr(multiprocessing.resource_sharer, "_resource_sharer", None)
    if sharer is None:
        return set()
    with sharer._lock:
        return set(sharer._cache)


def close_unfetched_fds(keys) -> None:
    """Withdraw and close offered file descriptors that a worker died before fetching (they would stay
    open for the life of this process)."""
    sharer = getattr(multiprocessing.resource_sharer, "_resource_sharer", None)
    if sharer is None or not keys:
        return
    with sharer._lock:
        entries = [sharer._cache.pop(key, None) for key in keys]
    for entry in filter(None, entries):
        entry[1]()  # (send, close)
