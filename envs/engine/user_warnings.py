"""Warnings that point at the user's code: :func:`warn_caller`, for every warning this package issues (actions
outside their spec, restarted workers, deprecated arguments, ...)."""
from __future__ import annotations

import sys
import warnings

#: top-level packages a call passes through on its way from the user's code to ours (a TorchRL ``Collector`` or
#: ``TransformedEnv``, gymnasium's or SB3's vector-env base classes, torch's decorators); this package's own name
PASSED_THROUGH = frozenset({__name__.split(".")[0], "torchrl", "tensordict", "gymnasium", "stable_baselines3", "torch"})


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` pointing at the line that led here: the first frame up the stack outside
    this package and the libraries of :data:`PASSED_THROUGH` (the user's ``env.step(td)``, ``for batch in
    collector``, ...), whichever path of ours or theirs it took; the caller's frame when every frame is one of
    theirs (e.g. in a worker process)."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in PASSED_THROUGH:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
