"""Engine-native versions of the TorchRL transforms that TorchRL's scripts run per env, one op per transform, for a
worker's ``k`` envs (:class:`~.native.NativeTransformedGroup` runs them in the transform's order).

An op reads and writes ``data``, a dict ``{key: tensor [k, ...]}`` of one step's entries: ``step(data)`` on a step's
``"next"`` entries (observations, ``"reward"``, ``"done"`` / ``"terminated"`` / ``"truncated"``), ``reset(data,
mask)`` on the reset entries (observations) with ``mask`` (bool ``[k, 1]``) the rows reset, as TorchRL's
``_step`` / ``_call`` and ``_reset`` see them. An op never changes a tensor it is given (it puts a new one, or one of
its own, under the key), and what it puts there is copied into the shared buffers before its next call. Each op
gives TorchRL's values: the stateless ones call the transform's own ``_apply_transform`` on the ``[k]`` batch (the
per-image code is TorchRL's, without the TensorDict around it); the stateful ones keep their state ``[k, ...]`` and
reset the rows a reset names, as TorchRL's do.

:func:`op_for` builds the op of one transform, or says why it has none (then the worker keeps TorchRL's
``TransformedEnv``):

* ``RenameTransform(in_keys, out_keys, create_copy)``: the entries renamed (kept too with ``create_copy``);
* ``ToTensorImage`` (float32), ``GrayScale``, ``Resize``, ``SignTransform``: their ``_apply_transform`` at each step
  and reset (a uint8 frame's ``ToTensorImage`` is TorchRL's ``permute(...).div(255)`` written into a contiguous
  buffer: the next image op reads it several times faster than TorchRL's channels-last result);
* ``CatFrames(N, dim, padding="same")``: the last ``N`` frames along ``dim``, a reset row filled with its frame;
* ``InitTracker()``, ``StepCounter(max_steps, update_done)``, ``RewardSum()``: ``"is_init"``, ``"step_count"``
  (truncating and ending episodes at ``max_steps``), ``"episode_reward"``;
* ``VecNorm`` (TorchRL's first version) per env: each row its own statistics (see :class:`RunningNorm`);
* ``ObservationNorm``, ``ClipTransform``, ``RewardScaling``, ``RewardClipping``, ``CenterCrop``, and
  ``UnsqueezeTransform`` / ``FlattenObservation`` with dims counted from the back: their ``_apply_transform``;
* ``CatTensors`` (a dim counted from the back), ``ExcludeTransform``: the entries joined, removed;
* ``DoubleToFloat(...)``: nothing here; the copy into the shared buffers (declared with TorchRL's float32) casts as
  TorchRL does (``copy_`` rounds as ``Tensor.to``). Only ops that read no entry it casts may follow it.

* ``RNDTransform``: its own ``_step`` per env row, with the env's own transform (:class:`OwnStep`).

``TensorDictPrimer`` has none, on purpose (:data:`PRIMER_REASON`): an env under it takes TorchRL's step, and a
one-env ``Collector`` steps such an env as it is, as TorchRL's does.

An op's :meth:`Op.signature` (its settings, its transform's buffers included) says when per-env transforms are alike
(``per_env.py`` runs one op over envs whose transforms have equal signatures).
"""
from __future__ import annotations

import copy

import torch
from tensordict import TensorDict
from torchrl.envs import DoubleToFloat, Transform
from torchrl.envs.transforms import (
    CatFrames,
    CatTensors,
    CenterCrop,
    ClipTransform,
    ExcludeTransform,
    FlattenObservation,
    GrayScale,
    InitTracker,
    ObservationNorm,
    RenameTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    RewardSum,
    RNDTransform,
    SignTransform,
    StepCounter,
    TensorDictPrimer,
    ToTensorImage,
    UnsqueezeTransform,
    VecNorm,
)

DONE_KEYS = ("done", "terminated", "truncated")


def _plain_attributes(transform: Transform) -> tuple:
    """A transform's settings: its attributes that are plain values (numbers, strings, keys, ...) and its buffers'
    values (``ObservationNorm``'s ``loc`` and ``scale``, ``ClipTransform``'s bounds, ...), sorted by name."""
    plain = (bool, int, float, str, tuple, list, type(None), torch.dtype)
    settings = [(name, repr(value)) for name, value in vars(transform).items()
                if isinstance(value, plain) and not name.startswith("_parent")]
    settings += [(name, (tuple(value.shape), str(value.dtype), value.detach().cpu().numpy().tobytes()))
                 for name, value in transform.state_dict().items()
                 if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.parameter.UninitializedBuffer)]
    return tuple(sorted(settings, key=lambda item: item[0]))


class Op:
    """One transform's native version (see the module docstring)."""

    #: it casts what it reads to float32 itself, so it may follow ``DoubleToFloat`` (see ``native._reads_a_cast_entry``)
    reads_as_float32 = False

    def dry(self) -> Op:
        """The op a dry run (``native._dry_run``) runs: itself, or a copy for an op whose state is an env's own."""
        return self

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        """One step's entries; ``rows`` (bool ``[k, 1]``): only those rows stepped (a partial step; the others'
        state is left as it is), None: all of them."""
        raise NotImplementedError

    def reads(self) -> set:
        """The keys this op reads (its ``pairs``' inputs, its ``in_keys``)."""
        return {in_key for in_key, _ in getattr(self, "pairs", [])} | set(getattr(self, "in_keys", []))

    def made_from(self) -> list[tuple]:
        """``(in_key, out_key)``: each entry it writes from another."""
        pairs = list(getattr(self, "pairs", []))
        out_key = getattr(self, "out_key", None)
        return pairs + [(in_key, out_key) for in_key in getattr(self, "in_keys", [])] if out_key else pairs

    def signature(self) -> tuple:
        """What this op does, as values: two ops of equal signatures give the same outputs from the same entries
        and state (how per-env transforms are found alike, to run as one op over their envs' rows)."""
        public = {name: value for name, value in vars(self).items() if not name.startswith("_")}
        transform = public.pop("transform", None)
        if transform is not None:
            public["transform"] = (type(transform).__name__, _plain_attributes(transform))
        return type(self).__name__, tuple(sorted((name, repr(value)) for name, value in public.items()))

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        raise NotImplementedError


class Rename(Op):
    def __init__(self, transform: RenameTransform):
        self.pairs = list(zip(transform.in_keys, transform.out_keys))
        self.keep = transform.create_copy  # the entries stay under their old keys too

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        for in_key, out_key in self.pairs:
            value = data[in_key] if self.keep else data.pop(in_key)
            data[out_key] = value

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        for in_key, out_key in self.pairs:
            if in_key in data:
                data[out_key] = data[in_key] if self.keep else data.pop(in_key)


class Apply(Op):
    """A stateless transform whose ``_call`` writes ``_apply_transform(data[in_key])`` under each ``out_key``, at
    each step, and at each reset for the keys the reset entries hold (TorchRL's reset is missing-tolerant)."""

    def __init__(self, transform: Transform):
        self.transform = transform
        self.pairs = list(zip(transform.in_keys, transform.out_keys))

    def _apply(self, value: torch.Tensor) -> torch.Tensor:
        return self.transform._apply_transform(value)

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        for in_key, out_key in self.pairs:
            data[out_key] = self._apply(data[in_key])

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        for in_key, out_key in self.pairs:
            if in_key in data:
                data[out_key] = self._apply(data[in_key])


class ToImage(Apply):
    """``ToTensorImage`` of a uint8 ``[..., H, W, C]`` frame into float32 ``[..., C, H, W]``: TorchRL's
    ``permute(...).div(255)``, written into a contiguous buffer of this op (TorchRL's result keeps the frame's
    channels-last memory, which the next image op reads several times slower). Other inputs: TorchRL's
    ``_apply_transform``, made contiguous."""

    def __init__(self, transform: ToTensorImage):
        super().__init__(transform)
        self._buffers: dict = {}

    def _apply(self, value: torch.Tensor) -> torch.Tensor:
        if value.dtype != torch.uint8 or self.transform.from_int is False or value.dim() < 3:
            return super()._apply(value).contiguous()
        image = value.permute(*range(value.dim() - 3), -1, -3, -2)
        out = self._buffers.get(image.shape)
        if out is None:
            out = self._buffers[image.shape] = torch.empty(image.shape, dtype=torch.float32)
        return torch.div(image, 255, out=out)


class Gray(Apply):
    """``GrayScale`` of float32 ``[..., 3, H, W]`` images: TorchRL's ``0.2989 * r + 0.587 * g + 0.114 * b``, the same
    float32 operations in the same order, written into buffers of this op (TorchRL's allocates five ``[..., H, W]``
    tensors a call, which between env steps cost more than the arithmetic). Other inputs: TorchRL's
    ``_apply_transform``."""

    def __init__(self, transform: GrayScale):
        super().__init__(transform)
        self._buffers: dict = {}

    def _apply(self, value: torch.Tensor) -> torch.Tensor:
        if value.dtype != torch.float32 or value.dim() < 3 or value.shape[-3] != 3:
            return super()._apply(value)
        buffers = self._buffers.get(value.shape)
        if buffers is None:
            plane = (*value.shape[:-3], *value.shape[-2:])
            buffers = self._buffers[value.shape] = (torch.empty(plane), torch.empty(plane),
                                                    torch.empty((*value.shape[:-3], 1, *value.shape[-2:])))
        total, term, out = buffers
        red, green, blue = value.unbind(-3)
        torch.mul(red, 0.2989, out=total)
        torch.mul(green, 0.587, out=term)
        total.add_(term)
        torch.mul(blue, 0.114, out=term)
        torch.add(total, term, out=out.squeeze(-3))
        return out


class StackFrames(Op):
    """``CatFrames(N, dim, padding="same")``: per key, a buffer of the last ``N`` frames along ``dim`` (``N`` times
    the frame's size there); a step shifts it by one frame and puts the new one last, a reset fills its rows with
    ``N`` copies of the reset frame. The buffer is the output (copied out before the next call)."""

    def __init__(self, transform: CatFrames):
        self.pairs = list(zip(transform.in_keys, transform.out_keys))
        self.n = transform.N
        self.dim = transform.dim
        self._buffers: dict = {}  # in_key -> [current, spare]: the spare takes the next step's frames

    def _buffer(self, key, frame: torch.Tensor) -> list:
        buffers = self._buffers.get(key)
        if buffers is None:
            shape = list(frame.shape)
            shape[self.dim] *= self.n
            buffers = self._buffers[key] = [frame.new_zeros(shape), frame.new_zeros(shape)]
        return buffers

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        for in_key, out_key in self.pairs:
            frame = data[in_key]
            buffers = self._buffer(in_key, frame)
            current, spare = buffers
            size = frame.shape[self.dim]
            kept = current.narrow(self.dim, size, current.shape[self.dim] - size)
            torch.cat([kept, frame], dim=self.dim, out=spare)
            if rows is not None:  # the rows not stepped keep their frames
                still = ~rows.reshape(-1)
                spare[still] = current[still]
            buffers.reverse()
            data[out_key] = spare

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        for in_key, out_key in self.pairs:
            if in_key not in data:
                continue
            frame = data[in_key]
            buffers = self._buffer(in_key, frame)
            current = buffers[0]
            repeats = [1] * frame.dim()
            repeats[self.dim] = self.n
            if mask.all():
                current.copy_(frame.repeat(repeats))
            else:
                rows = mask.reshape(-1)
                current[rows] = frame[rows].repeat(repeats)
            data[out_key] = current


class InitFlag(Op):
    """``InitTracker()``: ``"is_init"`` True in a reset's rows, False elsewhere and at every step."""

    def __init__(self, k: int):
        self._false = torch.zeros(k, 1, dtype=torch.bool)

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        data["is_init"] = self._false

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        data["is_init"] = mask


class CountSteps(Op):
    """``StepCounter(max_steps, update_done)``: ``"step_count"`` (int64 ``[k, 1]``), 0 after a reset, one more at
    each step; with ``max_steps``, a count that reaches it sets ``"truncated"`` (and ``"done"`` with
    ``update_done``), as TorchRL's ``_step`` does."""

    def __init__(self, transform: StepCounter, k: int):
        self.max_steps = transform.max_steps
        self.update_done = transform.update_done
        self._count = torch.zeros(k, 1, dtype=torch.int64)

    def reads(self) -> set:
        return {"truncated", "done"} if self.max_steps is not None else set()

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        self._count.add_(1 if rows is None else rows)
        data["step_count"] = self._count
        if self.max_steps is None:
            return
        truncated = (self._count >= self.max_steps) | data["truncated"]
        data["truncated"] = truncated
        if self.update_done:
            data["done"] = truncated | data["done"]

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        self._count.masked_fill_(mask, 0)
        data["step_count"] = self._count


class SumRewards(Op):
    """``RewardSum()``: ``"episode_reward"``, 0 after a reset, plus the step's ``"reward"`` (as it is at this op's
    place in the transform) at each step."""

    def __init__(self, k: int, dtype: torch.dtype):
        self._sum = torch.zeros(k, 1, dtype=dtype)

    def reads(self) -> set:
        return {"reward"}

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        if rows is None:
            self._sum.add_(data["reward"])
        else:
            self._sum.copy_(torch.where(rows, self._sum + data["reward"], self._sum))
        data["episode_reward"] = self._sum

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        self._sum.masked_fill_(mask, 0)
        data["episode_reward"] = self._sum


class RunningNorm(Op):
    """``VecNorm`` (TorchRL's first version, ``new_api=False``) per env: each row keeps its own statistics, as each
    env's own ``VecNorm`` does (in that ``VecNorm``, once adopted: see :meth:`adopt`; from the statistics it holds
    already, if any) (``"sum"`` and ``"ssq"`` of the entry's shape and dtype, a float32 ``"count"``), updated
    at each step and at each reset of its env with TorchRL's operations in TorchRL's order (``sum * decay + value``,
    ``ssq * decay + value ** 2``, ``count * decay + 1``), and the entry standardized with them
    (``(value - mean) / std.clamp_min(eps)``). Elementwise, so ``k`` rows at once give each env's own values."""

    def __init__(self, transform: VecNorm, k: int):
        self.pairs = list(zip(transform.in_keys, transform.out_keys))
        self.decay = transform.decay
        self.eps = transform.eps
        self._k = k
        self._stats: dict = {}  # in_key -> [sum, ssq, count]
        self._owners: list[VecNorm] = []  # the envs' own VecNorm transforms, one per row (see adopt)

    def adopt(self, transforms: list[VecNorm]) -> None:
        """Keep the statistics in the envs' own ``VecNorm`` transforms (``transforms[i]`` for row ``i``): their
        ``loc`` / ``scale`` / state dict read what this op computes (a script saves them, an eval env copies them),
        and a ``freeze()`` of one stops its row's updates."""
        self._owners = list(transforms)

    def _allocate(self, key, value: torch.Tensor) -> list:
        count = torch.zeros((self._k, *([1] * (value.dim() - 1))), dtype=torch.float)
        stats = self._stats[key] = [torch.zeros_like(value), torch.zeros_like(value), count]
        for i, owner in enumerate(self._owners):  # TorchRL's layout: "<key>_sum", "<key>_ssq", "<key>_count" [1]
            entries = {f"{key}_sum": stats[0][i], f"{key}_ssq": stats[1][i], f"{key}_count": count[i].view(1)}
            for name, row in entries.items():  # statistics the env's VecNorm holds already go on from there
                held = owner._td.get(name, None) if owner._td is not None else None
                if held is not None:
                    if held.shape != row.shape or held.dtype != row.dtype:
                        raise ValueError(f"VecNorm of env {i}: its statistics {name!r} are {tuple(held.shape)} "
                                         f"{held.dtype}, where its entry gives {tuple(row.shape)} {row.dtype}.")
                    row.copy_(held)
            if owner._td is None:
                owner._td = TensorDict(entries, batch_size=[])
            else:
                owner._td.update(entries)
        return stats

    def _update(self, key, value: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        stats = self._stats.get(key) or self._allocate(key, value)
        total, squares, count = stats
        if self._owners and any(owner.frozen for owner in self._owners):  # (frozen rows take no update)
            thawed = torch.tensor([[not owner.frozen] for owner in self._owners])
            rows = thawed if rows is None else rows & thawed
        if rows is None:
            total.mul_(self.decay).add_(value)
            squares.mul_(self.decay).add_(value.pow(2))
            count.mul_(self.decay).add_(1)
        else:  # only these rows' envs took the value
            shaped = rows.reshape(self._k, *([1] * (value.dim() - 1)))
            total.copy_(torch.where(shaped, total * self.decay + value, total))
            squares.copy_(torch.where(shaped, squares * self.decay + value.pow(2), squares))
            count.copy_(torch.where(shaped, count * self.decay + 1, count))
        mean = total / count
        std = (squares / count - mean.pow(2)).clamp_min(self.eps).sqrt()
        return (value - mean) / std.clamp_min(self.eps)

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        for in_key, out_key in self.pairs:
            data[out_key] = self._update(in_key, data[in_key], rows)

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        for in_key, out_key in self.pairs:
            if in_key in data:
                data[out_key] = self._update(in_key, data[in_key], None if mask.all() else mask)


class Concatenate(Op):
    """``CatTensors(in_keys, out_key, dim < 0)``: the entries concatenated along ``dim``, and (``del_keys``) the
    entries it names removed."""

    def __init__(self, transform: CatTensors):
        self.in_keys = list(transform.in_keys)
        self.out_key = transform.out_keys[0]
        self.dim = transform.dim
        self.removed = list(transform.keys_to_exclude) if transform._del_keys else []

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        data[self.out_key] = torch.cat([data[key] for key in self.in_keys], dim=self.dim)
        for key in self.removed:
            data.pop(key, None)

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        if all(key in data for key in self.in_keys):
            self.step(data)


class Exclude(Op):
    """``ExcludeTransform(*keys)``: the entries removed."""

    def __init__(self, transform: ExcludeTransform):
        self.keys = list(transform.excluded_keys)

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        for key in self.keys:
            data.pop(key, None)

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        self.step(data)


class OwnStep(Op):
    """A transform whose only per-step work is its own ``_step`` on the step's output (TorchRL's ``RNDTransform``:
    a network's intrinsic reward under ``out_keys[0]``, from ``in_keys[0]``; its reset does nothing), run on
    TorchRL's own code: per env on that env's row with the env's own transform (:meth:`adopt`: its networks, its
    running statistics), or, for a transform on the batch, once on the ``[k]`` rows. It reads its input as float32
    itself (``.float()``), so it may follow ``DoubleToFloat``: what it reads is the value the cast gives."""

    reads_as_float32 = True

    def __init__(self, transform: Transform, k: int):
        self.transform = transform
        self._k = k
        self.in_key = transform.in_keys[0]
        self.out_key = transform.out_keys[0]
        self._owners: list[Transform] = []  # one per row once adopted (per-env transforms)

    def adopt(self, transforms: list[Transform]) -> None:
        """Run each env's own transform on its row (``transforms[i]`` for row ``i``)."""
        self._owners = list(transforms)

    def dry(self) -> OwnStep:
        """A copy for a dry run (``native._dry_run``): a deep copy of the transform (its networks and statistics, not
        the env it sits in), so the env's own keeps its state (TorchRL's ``clone`` is shallow: its modules' table is
        the original's)."""
        memo = {id(value): None for name in ("_container", "_parent")
                if (value := self.transform.__dict__.get(name)) is not None}
        return OwnStep(copy.deepcopy(self.transform, memo), 1)

    def reads(self) -> set:
        return {self.in_key}

    def made_from(self) -> list[tuple]:
        return []  # (a float32 entry of its own, whatever it read)

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        if not self._owners:  # a transform on the batch: once, on the k rows
            data[self.out_key] = self._run(self.transform, data, None, [self._k])
            return
        outputs = []
        for i, owner in enumerate(self._owners):
            if rows is not None and not bool(rows[i]):  # (not stepped: its row is not written)
                outputs.append(None)
                continue
            outputs.append(self._run(owner, data, i, []))
        stepped = next(out for out in outputs if out is not None)  # (a partial step steps one row at least)
        data[self.out_key] = torch.stack([torch.zeros_like(stepped) if out is None else out for out in outputs])

    def _run(self, transform: Transform, data: dict, row: int | None, batch: list) -> torch.Tensor:
        leaves = {key: value if row is None else value[row] for key, value in data.items()}
        step = TensorDict(leaves, batch_size=batch)
        return transform._step(TensorDict({}, batch_size=batch), step).get(self.out_key)

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        return None


class CastOnCopy(Op):
    """``DoubleToFloat``: the copy into the shared buffers casts (see the module docstring)."""

    def step(self, data: dict, rows: torch.Tensor | None = None) -> None:
        return None

    def reset(self, data: dict, mask: torch.Tensor) -> None:
        return None




#: why ``TensorDictPrimer`` keeps TorchRL's step: its ``_step`` carries entries of the step's *input* forward (the
#: recurrent state a policy wrote at the root) into ``"next"``; the engine sends the envs the actions only
PRIMER_REASON = ("TensorDictPrimer carries the input's entries (a policy's recurrent state) into the step's output, "
                 "and only the actions reach the envs on the native road")


def op_for(transform: Transform, k: int, reward_dtype: torch.dtype) -> Op | str:
    """The native op of ``transform`` for ``k`` envs, or why it has none (a few words)."""
    kind = type(transform)
    if kind is InitTracker:
        return InitFlag(k) if transform.init_key == "is_init" else "InitTracker with another init_key"
    if kind is StepCounter:
        if transform.step_count_key != "step_count" or transform.truncated_key != "truncated":
            return "StepCounter with another step_count_key or truncated_key"
        return CountSteps(transform, k)
    if kind is RewardSum:
        if [*transform.in_keys] != ["reward"] or [*transform.out_keys] != ["episode_reward"]:
            return "RewardSum with other keys"
        return SumRewards(k, reward_dtype)
    if kind is DoubleToFloat:
        return CastOnCopy()
    if kind is VecNorm:
        shared = transform._td is not None and (transform._td.is_shared() or transform._td.is_memmap())
        if shared or transform.shapes is not None:
            return "VecNorm with shared statistics (shared_td) or shapes"
        if not all(isinstance(key, str) for key in [*transform.in_keys, *transform.out_keys]):
            return "VecNorm with nested keys"
        return RunningNorm(transform, k)
    if kind is ExcludeTransform:
        if transform.inverse or set(transform.excluded_keys) & {"reward", *DONE_KEYS}:
            return "ExcludeTransform of the reward or done flags, or on the inverse"
        return Exclude(transform)
    keys = [*transform.in_keys, *transform.out_keys]
    if not all(isinstance(key, str) for key in keys):
        return f"{kind.__name__} with nested keys"
    if [*transform.in_keys_inv] or [*transform.out_keys_inv]:
        return f"{kind.__name__} with inverse keys (it changes the actions)"
    if kind is RenameTransform:
        return Rename(transform)
    if kind is ToTensorImage:
        if transform.unsqueeze or transform.shape_tolerant or transform.dtype != torch.float32:
            return "ToTensorImage with unsqueeze, shape_tolerant or a dtype other than float32"
        return ToImage(transform)
    if kind is GrayScale:
        return Gray(transform)
    if kind in (Resize, SignTransform, ClipTransform, RewardScaling, RewardClipping, CenterCrop):
        return Apply(transform)
    if kind is ObservationNorm:
        return Apply(transform) if transform.initialized else "ObservationNorm without loc and scale (init_stats)"
    if kind is UnsqueezeTransform:
        return Apply(transform) if transform._dim < 0 else "UnsqueezeTransform with a dim counted from the front"
    if kind is FlattenObservation:
        if transform.first_dim >= 0 or transform.last_dim >= 0:
            return "FlattenObservation with dims counted from the front"
        return Apply(transform)
    if kind is CatTensors:
        if transform.dim >= 0 or transform.unsqueeze_if_oor:
            return "CatTensors along a dim counted from the front, or unsqueeze_if_oor"
        return Concatenate(transform)
    if kind is CatFrames:
        if transform.padding != "same" or transform.as_inverse or transform.future or transform.mask_key is not None:
            return "CatFrames other than padding='same' on the env's steps"
        return StackFrames(transform)
    if kind is TensorDictPrimer:
        return PRIMER_REASON
    if kind is RNDTransform:
        return OwnStep(transform, k)
    return f"{kind.__name__} has no native version"
