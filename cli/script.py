"""``tdcollect run SCRIPT [ARGS...]``: the script run as ``python SCRIPT ARGS`` runs it, with tdcollect's batched
envs and collectors in place of TorchRL's (see ``swap.py``), in this process and in every Python process it starts.

As ``python SCRIPT ARGS``: the script runs as ``__main__`` with ``sys.argv == [SCRIPT, *ARGS]`` and its folder first
on ``sys.path`` (so hydra finds its configs, and spawned processes re-import it); the exit status is the script's
(``SystemExit(n)``: ``n``; an exception: its traceback, from the script's frames down, and 1).

When: as soon as one of TorchRL's public modules (``torchrl.envs``, ``torchrl.collectors``, ...) and the TorchRL
modules its import brought in have run their bodies, before the import that asked for them goes on
(:func:`replace_on_import`, a finder first on ``sys.meta_path`` that wraps TorchRL's loaders):
every module that imports them afterwards, however deep in an import (a helper module the script imports first,
``torchrl.trainers.helpers``, hydra's ``_target_``, ``importlib``, ``from torchrl.collectors import *``), gets
tdcollect's; a process that never imports TorchRL pays nothing. Why a hook on TorchRL's modules rather than an
eager import before the script: the same moment in every process (the processes the script starts import TorchRL
only if they need it), and no TorchRL import where a script (or a child, e.g. a compiler worker) has none. At the
script's end, any module outside TorchRL that still holds one of TorchRL's replaced classes is named on stderr,
with why (it imported it from TorchRL's private modules).
The processes the script starts: forked ones inherit the replaced classes; spawned and forkserver ones (and any
Python process the script starts) run ``child_startup/sitecustomize.py``, which ``TDCOLLECT_RUN`` (the layout) and
``PYTHONPATH`` carry to them, and which does the same there.
"""
from __future__ import annotations

import importlib
import importlib.abc
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path

from . import progress, swap
from .import_hooks import spec_with_wrapped_loader

#: the variable that tells a process started under ``tdcollect run`` to replace TorchRL's classes (its value: the
#: layout)
ENV_VAR = "TDCOLLECT_RUN"
#: the folder (holding only ``sitecustomize.py``) put first on ``PYTHONPATH`` for the processes the script starts
STARTUP_DIR = Path(__file__).resolve().parent / "child_startup"


def run_script(path: str, args: list[str], layout: str = "machine") -> int:
    """Run the script at ``path`` with ``args`` as ``python path args`` would, TorchRL's classes replaced; returns
    its exit status (2 when there is no such file)."""
    script = Path(path)
    if not script.is_file():
        print(f"tdcollect run: no such script: {path} (give the path of a Python file, as to python)",
              file=sys.stderr)
        return 2
    os.environ[ENV_VAR] = layout
    os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    replace_on_import(layout, report=True)
    progress.install()  # (tqdm's rate before its first refresh: see progress.py)
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.resolve().parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit:
        return _exit_status(exit)
    except KeyboardInterrupt as err:
        _print_from_script(err, script)
        return 130
    except BaseException as err:  # noqa: BLE001 - reported as python reports it
        _print_from_script(err, script)
        return 1
    finally:
        for line in swap.kept_places():
            swap.say(line)
    return 0


def _exit_status(exit: SystemExit) -> int:
    """What ``python`` exits with for this ``SystemExit``: its code, 0 for None, 1 (after printing it) otherwise."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def _print_from_script(err: BaseException, script: Path) -> None:
    """The traceback ``python SCRIPT`` would print: from the script's first frame down (this runner's left out)."""
    tb = err.__traceback__
    target = os.path.realpath(script)
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb or err.__traceback__)


#: the packages whose module bodies the finder counts: TorchRL's, and tdcollect's own (a script that imports
#: tdcollect first imports TorchRL inside it: the names are replaced once tdcollect's outermost body has run)
WATCHED = ("torchrl", "tdcollect")


def _watched(name: str) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in WATCHED)


class _SwapOnImport(importlib.abc.MetaPathFinder):
    """A finder first on ``sys.meta_path`` for TorchRL's modules (and tdcollect's, :data:`WATCHED`): it finds each as
    the other finders do and wraps its loader (:class:`_CountingLoader`), so that when the outermost such module
    being imported has run its body (all of TorchRL that this import brought in is initialized) and before the
    import that asked for it goes on, the names :func:`swap.install` can replace are replaced."""

    def __init__(self, layout: str, report: bool):
        self.layout = layout
        self.report = report
        self.ran: set[str] = set()  # the watched modules whose bodies have run (still initializing, maybe)
        self.lock = threading.RLock()  # one replacing at a time
        self.installing = False  # a replacing is running (in the thread holding the lock)
        self.depth = threading.local()  # .n: the watched modules this thread is running the bodies of

    def find_spec(self, name, path, target=None):
        if not _watched(name):
            return None
        return spec_with_wrapped_loader(self, name, path, target,
                                        lambda loader: _CountingLoader(loader, self, name))

    def run_body(self, loader, module, name: str) -> None:
        """Run ``module``'s body with its ``loader``; once the outermost watched body of this thread has run,
        replace what can be replaced."""
        depth = getattr(self.depth, "n", 0)
        self.depth.n = depth + 1
        try:
            loader.exec_module(module)
        finally:
            self.depth.n = depth
        self.ran.add(name)
        if depth == 0:
            self.replace_ready()

    def replace_ready(self) -> None:
        """Replace what can be replaced now. An import inside that replacing (tdcollect's modules import TorchRL's)
        only notes what ran: the replacing goes on with it (its loop runs until nothing more is replaced)."""
        with self.lock:
            if self.installing:
                return
            self.installing = True
            try:
                while replaced := swap.install(self.layout, ran=frozenset(self.ran)):
                    if self.report:
                        swap.say(swap.describe(replaced))
            finally:
                self.installing = False
            if not swap.pending() and self in sys.meta_path:
                sys.meta_path.remove(self)


class _CountingLoader:
    """A watched module's own loader, whose ``exec_module`` runs through the finder (:meth:`_SwapOnImport.run_body`);
    everything else is the loader's (``get_source``, ``is_package``, resources, ...)."""

    def __init__(self, loader, finder: _SwapOnImport, name: str):
        self._loader = loader
        self._finder = finder
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._finder.run_body(self._loader, module, self._name)

    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)


def replace_on_import(layout: str, report: bool = False) -> None:
    """Replace TorchRL's classes (``swap.install``) in each of TorchRL's public modules right after its body has run
    (:class:`_SwapOnImport`), so every module that imports them afterwards, however deep in an import, gets
    tdcollect's; what this process imported already is replaced now, and any module outside TorchRL that bound
    TorchRL's class before is given ours (``swap.sweep``). ``report``: say on stderr what was replaced (the script's
    process; the processes it starts stay quiet)."""
    finder = _SwapOnImport(layout, report)
    finder.ran.update(name for name in swap.PUBLIC_MODULES if swap._ready(name))
    sys.meta_path.insert(0, finder)
    finder.replace_ready()


def run_hidden_sitecustomize(folder: str) -> None:
    """From a ``sitecustomize`` module in ``folder``: run the ``sitecustomize`` it hides (the next one on
    ``sys.path``) as Python would have run it; where there is none, the calling one stays the process'."""
    path = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != folder]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if mine is not None:
            sys.modules["sitecustomize"] = mine
    finally:
        sys.path[:] = path
