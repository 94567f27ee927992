"""A finder's way to watch an import without finding anything itself: the spec the other finders on
``sys.meta_path`` find, its loader wrapped (``tdcollect run``'s swap of TorchRL's classes, ``script.py``, and its
patch of tqdm, ``progress.py``)."""
from __future__ import annotations

import sys
from collections.abc import Callable


def spec_with_wrapped_loader(finder, name: str, path, target, wrap: Callable):
    """The spec of module ``name`` as the finders on ``sys.meta_path`` other than ``finder`` find it, its loader
    replaced by ``wrap(loader)`` when it runs module bodies (``exec_module``); None when none finds it."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(name, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = wrap(spec.loader)
            return spec
    return None
