"""What may be stored in a buffer: the checks every writer of an env's values makes, and the opt-in check of
finite values.

Always on (in every stepper, on every step, see the families in ``tdcollect.envs.libs``): a value is stored only if
it keeps its value in the buffer's dtype. ``None`` is refused where a number is expected (numpy would store NaN
in a float buffer and False in a bool one); a cast that can change a value (int64 -> uint8, float -> int,
int -> bool, ...) is allowed only when every value fits: 300 never becomes 44 in a ``uint8`` buffer. Casts
that keep every value (same dtype, int -> wider int, int -> float, float64 -> float32) cost one lookup of the
value's dtype.

Opt-in (``check_values=True`` on the envs and collectors): :func:`check_finite` refuses NaN and infinite
observations and rewards, naming the env (the row) and the key.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase

_ALL_DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                     np.uint32, np.uint64, np.float16, np.float32, np.float64)]


class BadValue(ValueError):
    """Raised by a check: ``what`` says why the value cannot be stored, ``key`` whose value it is (a writer turns
    it into the ``ValueError`` that names the env, the call and the key)."""

    def __init__(self, what: str, key=None):
        super().__init__(what)
        self.what = what
        self.key = key


def keeps_values(src: np.dtype, dst: np.dtype) -> bool:
    """True when every value of ``src`` is stored in ``dst`` as the same number, up to a float's precision
    (float64 -> float32 and int64 -> float32 round, as every env library does; nothing wraps around)."""
    return np.can_cast(src, dst, "safe") or (src.kind in "biuf" and dst.kind == "f")


class Guard:
    """``guard(value)`` raises :class:`BadValue` when ``value`` (numpy array or scalar, Python number, list,
    tensor) cannot be stored in a buffer of ``dtype`` without changing a value; ``dtype`` a numpy or torch
    dtype (torch dtypes numpy lacks, bfloat16, are floats)."""

    __slots__ = ("dtype", "safe")

    def __init__(self, dtype):
        if isinstance(dtype, torch.dtype):
            dtype = np.float32 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype
        self.dtype = np.dtype(dtype)
        self.safe = frozenset(d for d in _ALL_DTYPES if keeps_values(d, self.dtype))

    def __call__(self, value, key=None) -> None:
        if getattr(value, "dtype", None) not in self.safe:  # numpy values of a dtype that always fits skip this
            self.check(value, key)

    def check(self, value, key=None) -> None:
        """The full check (the call above skips it for values of a dtype that always fits); the
        :class:`BadValue` carries ``key``."""
        try:
            self._check(value)
        except BadValue as bad:
            bad.key = key
            raise

    def _check(self, value) -> None:
        if value is None:
            raise BadValue("None, where a number is expected")
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as err:
            raise BadValue(f"{_show(value)}, which is not an array of numbers ({err})") from None
        src = array.dtype
        dst = self.dtype
        if src.kind not in "biuf":
            raise BadValue(f"{_show(value)} of dtype {src}, where numbers of dtype {dst} are expected")
        if keeps_values(src, dst) or array.size == 0:
            return
        if src.kind == "f" and dst.kind in "biu":
            whole = np.isfinite(array) & (array == np.trunc(array))
            if not whole.all():
                raise BadValue(_not_fitting(array[~whole].flat[0], src, dst, "is not a whole number"))
        if dst.kind == "b":
            outside = (array != 0) & (array != 1)
            limits = "0 or 1"
        else:
            info = np.iinfo(dst)
            outside = (array < info.min) | (array > info.max)
            limits = f"{info.min}..{info.max}"
        if outside.any():
            raise BadValue(_not_fitting(array[outside].flat[0], src, dst, f"is outside {limits}"))


def _not_fitting(value, src: np.dtype, dst: np.dtype, why: str) -> str:
    return (f"value {value.item()!r} ({src}), which {why} and does not fit the buffer's dtype {dst}: it would be "
            "stored as another value")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def value_error(env: int | str, call: str, key, bad: BadValue, hint: str) -> ValueError:
    """The ``ValueError`` for a value :class:`Guard` refused: the env, the call, the key, what was wrong, the fix."""
    name = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    return ValueError(f"env {env}: {call} returned {name!r} = {bad.what}. Values are never changed on their way into "
                      f"the batched env's buffers: {hint}.")


def broadcast_error(env: int | str, call: str, what: str, received, declared: str, hint: str) -> ValueError:
    """The ``ValueError`` for a value of the wrong shape: ``env`` (its index), ``call`` (``"step()"``), ``what``
    (the value, e.g. ``"observation 'pixels'"``), ``received`` (its shape, or None for a value with no single shape,
    a ragged list), ``declared`` (what the env's space or spec declares) and ``hint`` (the fix). Values are never
    broadcast into the buffers: numpy would turn a ``(1,)`` observation into ``[v, v, v, v]``."""
    got = "a value with no single shape" if received is None else f"shape {tuple(received)}"
    return ValueError(f"env {env}: {call} returned {what} with {got}, but {declared}. Values are never broadcast into "
                      f"the batched env's buffers: {hint}.")


# ----------------------------------------------------------------- opt-in: finite values
def check_finite(td: TensorDictBase, owner: str, what: str, env_ids: list | None = None) -> None:
    """Raise a ``ValueError`` naming the first env (row of ``td``'s first batch dim, or ``env_ids[row]``) and
    key whose float entry holds NaN or an infinity. ``what``: the call that returned the values (``"step()"``)."""
    for key, leaf in td.items(True, True):
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
            continue
        finite = torch.isfinite(leaf)
        if bool(finite.all()):
            continue
        row = int(torch.nonzero(~finite.reshape(finite.shape[0], -1).all(-1))[0, 0])
        bad = leaf[row][~finite[row]].flatten()[0].item()
        name = key if isinstance(key, str) else tuple(key)
        env = row if env_ids is None else env_ids[row]
        raise ValueError(
            f"{owner}: env {env}: {what} returned {name!r} holding {bad} (check_values=True refuses "
            "NaN and infinite values). Find where the env produces it (e.g. a division by zero, a diverging "
            "simulation), or pass check_values=False to let such values through."
        )
