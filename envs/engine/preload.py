"""Costly imports paid once: env families whose import takes seconds, imported before workers start.

An env family may declare such imports (``Family.costly_imports``: ``{module prefix a constructor may refer to:
module worth importing once}``): one import that takes 5 s of one core, made by 4 forked workers at once on 2 cores,
takes them 17 s to their first batch where a main process that imported it first takes 11 s (measured on a
multi-player substrate in the benchmarks). So when an env constructor refers to such a module, the
owner imports it before starting its workers: with ``fork`` the workers inherit it; with ``forkserver`` the server
preloads it once; with ``spawn`` nothing can be shared and nothing is done.

Every pool also preloads what tensordict imports on its first conversion of a dict (``TensorDict.from_dict``, which
every TorchRL spec's ``zero()`` and so every TorchRL env's first reset or rollout reaches): pandas and h5py, where
installed, about 1.3 s of one core in each fresh process. The main process imports them at its first rollout
anyway; imported before the fork, they cost a forked worker nothing (a create / use / close cycle of a
two-worker collector: 0.58 s before, see the changelog for after).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable

_MAX_OBJECTS = 200  # how many objects one constructor's references are followed through


#: modules tensordict imports, where installed, the first time it converts a dict (see the module docstring)
TENSORDICT_FIRST_USE = ("pandas", "h5py")


def tensordict_first_use() -> list[str]:
    """The modules of :data:`TENSORDICT_FIRST_USE` that are installed and not imported yet."""
    return [module for module in TENSORDICT_FIRST_USE
            if module not in sys.modules and importlib.util.find_spec(module) is not None]


def costly_imports(fn: Callable, costly: dict[str, str]) -> set[str]:
    """The modules of ``costly`` (``{module prefix: module to import}``) that ``fn`` refers to or imports: through
    ``functools.partial`` arguments, closures, default arguments, and the names its code (nested lambdas included)
    reads or imports, following the functions it finds the same way."""
    found = set()
    seen = set()
    todo = [fn]
    while todo and len(seen) < _MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        names = {name if isinstance(name, str) else type(obj).__module__}
        if isinstance(obj, types.FunctionType):
            names |= _global_names(obj.__code__)  # modules it imports itself: "from <module> import ..."
        found |= {module for prefix, module in costly.items()
                  for n in names if n == prefix or n.startswith(prefix + ".")}
        todo.extend(_references(obj))
    return found


def _references(obj) -> list:
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if not isinstance(obj, types.FunctionType):
        return []
    refs = [cell.cell_contents for cell in obj.__closure__ or () if _filled(cell)]
    refs += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
    refs += [obj.__globals__[n] for n in _global_names(obj.__code__) if n in obj.__globals__]
    return refs


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def import_now(modules: Iterable[str]) -> None:
    """Import ``modules`` in this process. A module that fails to import is left to the workers, which report the
    error as theirs."""
    for module in sorted(set(modules)):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the worker's own import raises it with its context
            pass
