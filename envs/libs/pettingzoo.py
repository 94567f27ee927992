"""The PettingZoo family: parallel and AEC envs, stepped as TorchRL's ``PettingZooWrapper`` steps them.

A PettingZoo env is translated into ``PettingZooWrapper(env)`` (TorchRL's agent groups, keys and defaults), which
then steps as any TorchRL env; an AEC env takes turns, which TorchRL's wrapper only steps with its agent masks
(``use_mask=True``). An env object handed where a constructor belongs is refused with the call that builds it
(``pistonball_v6.parallel_env(...)``).
"""
from __future__ import annotations

import sys

from ..engine.stepper import Family, of_package


def _module():
    return sys.modules.get("pettingzoo")  # an env of this family means the module is already imported


def _is_env(obj) -> bool:
    pettingzoo = _module()
    return pettingzoo is not None and isinstance(obj, (pettingzoo.ParallelEnv, pettingzoo.AECEnv))


def _wrapped(env):
    """``PettingZooWrapper(env)`` for a PettingZoo env; None for any other object."""
    if not _is_env(env):
        return None
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    return PettingZooWrapper(env, use_mask=not isinstance(env, _module().ParallelEnv))


def _remake(env) -> str | None:
    """``<name>.parallel_env(...)`` / ``<name>.env(...)`` from the env's metadata name."""
    if not of_package(env, "pettingzoo"):
        return None
    name = (getattr(env, "metadata", None) or {}).get("name")
    if not (isinstance(name, str) and name.isidentifier()):
        return None
    aec = _module() is not None and isinstance(env, _module().AECEnv)
    return f"{name}.{'env' if aec else 'parallel_env'}(...)"


def _is_instance(obj) -> bool:
    return _is_env(obj) or of_package(obj, "pettingzoo")


FAMILY = Family(name="PettingZoo", priority=40, translate=_wrapped, is_instance=_is_instance, remake=_remake)
