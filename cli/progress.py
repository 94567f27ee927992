"""tqdm's ``format_dict["rate"]`` under ``tdcollect run``: never ``None`` once the bar has counted something.

TorchRL's scripts log ``pbar.format_dict["rate"]`` after each batch, and TorchRL's loggers (CSV, TensorBoard) take
it as a float. tqdm records a rate only at an update that comes at least ``mininterval`` (0.1 s) after the bar's
last refresh; before that, ``format_dict["rate"]`` is ``None`` and the logger raises ``TypeError``. As shipped, the
first batch of these scripts comes later than that; under ``tdcollect run`` it can come sooner (the workers may be
up before the script makes its bar), and the run would die at its first log.

So, in the script's process, ``format_dict`` gives for a rate not yet recorded the one tqdm's own bar shows then
(``format_meter``'s: ``(n - initial) / elapsed``), which is also how tqdm computes its first recorded rate (the
first update's count over the time since the bar started). Every other entry, and every rate tqdm recorded,
is tqdm's. A script without tqdm pays nothing: the property is replaced when tqdm is first imported.
"""
from __future__ import annotations

import functools
import importlib.abc
import sys

from .import_hooks import spec_with_wrapped_loader

#: the tqdm module whose class holds ``format_dict``
TQDM_MODULE = "tqdm.std"


def rate_never_none(tqdm_class: type) -> None:
    """Replace ``tqdm_class.format_dict`` (tqdm's ``std.tqdm``) by one whose ``"rate"`` is tqdm's shown rate where
    tqdm has recorded none yet and the bar has counted something (see the module docstring); idempotent."""
    original = tqdm_class.format_dict
    if getattr(original.fget, "tdcollect_rate", False):
        return

    @functools.wraps(original.fget)
    def format_dict(bar) -> dict:
        values = original.fget(bar)
        if values.get("rate") is None:
            counted = (values.get("n") or 0) - (values.get("initial") or 0)
            elapsed = values.get("elapsed") or 0
            if counted and elapsed > 0:
                values["rate"] = counted / elapsed
        return values

    format_dict.tdcollect_rate = True
    tqdm_class.format_dict = property(format_dict, original.fset, original.fdel, original.__doc__)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``tqdm.std`` is about to be imported, it leaves the import to the other finders
    and patches the class once the module has run (a wrapped loader)."""

    def find_spec(self, name, path, target=None):
        if name != TQDM_MODULE:
            return None
        return spec_with_wrapped_loader(self, name, path, target, _PatchingLoader)


class _PatchingLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        rate_never_none(module.tqdm)

    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)


def install() -> None:
    """Patch tqdm's class now if it is imported, else when it is."""
    module = sys.modules.get(TQDM_MODULE)
    if module is not None:
        rate_never_none(module.tqdm)
        return
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
