"""``tdcollect run SCRIPT [ARGS...]``: the script run as ``python SCRIPT ARGS`` runs it, with tdcollect's batched
envs and collectors in place of TorchRL's (see ``swap.py``), in this process and in every Python process it starts.

As ``python SCRIPT ARGS``: the script runs as ``__main__`` with ``sys.argv == [SCRIPT, *ARGS]`` and its folder first
on ``sys.path`` (so hydra finds its configs, and spawned processes re-import it); the exit status is the script's
(``SystemExit(n)``: ``n``; an exception: its traceback, from the script's frames down, and 1).

When: TorchRL's classes are replaced at the end of the import statement (or ``importlib.import_module`` call)
after which their module is imported (:func:`replace_once_imported`): before the script's ``from torchrl.envs
import ParallelEnv`` binds the name, and never in a process that does not import TorchRL (which pays nothing).
The processes the script starts: forked ones inherit the replaced classes; spawned and forkserver ones (and any
Python process the script starts) run ``child_startup/sitecustomize.py``, which ``TDCOLLECT_RUN`` (the layout) and
``PYTHONPATH`` carry to them, and which does the same there.
"""
from __future__ import annotations

import builtins
import importlib
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path

from . import swap

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
    replace_once_imported(layout, report=True)
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


def replace_once_imported(layout: str, report: bool = False) -> None:
    """Replace TorchRL's classes (``swap.install``) at the end of the first import statement or
    ``importlib.import_module`` call after which their module is imported; each outermost import checks a few
    ``sys.modules`` entries until every module is done. ``report``: say on stderr what was replaced (the script's
    process; the processes it starts stay quiet)."""
    original_import = builtins.__import__
    original_import_module = importlib.import_module
    state = threading.local()

    def replacing_after(load):
        def imported(*args, **kwargs):
            depth = getattr(state, "depth", 0)
            state.depth = depth + 1
            try:
                module = load(*args, **kwargs)
            finally:
                state.depth = depth
            if depth == 0 and not getattr(state, "replacing", False):
                _replace_imported()
            return module

        return imported

    def _replace_imported() -> None:
        state.replacing = True
        try:
            replaced = swap.install(layout, only_imported=True)
        finally:
            state.replacing = False
        if replaced and report:
            swap.say(swap.describe(replaced))
        if not swap.pending():
            if builtins.__import__ is hooked_import:
                builtins.__import__ = original_import
            if importlib.import_module is hooked_import_module:
                importlib.import_module = original_import_module

    hooked_import = replacing_after(original_import)
    hooked_import_module = replacing_after(original_import_module)
    builtins.__import__ = hooked_import
    importlib.import_module = hooked_import_module
    _replace_imported()  # what this process imported already


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
