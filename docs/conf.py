"""Sphinx configuration of tdcollect's documentation:
``python -m sphinx -W --keep-going -b html docs docs/_build/html``.

No network at build time: no intersphinx. The tutorials (``tutorials/*.ipynb``, with their stored outputs) are copied
into ``docs/_generated/tutorials`` and shown by myst-nb without being run (the test suite runs them).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

project = "tdcollect"
author = "The tdcollect developers"
copyright = "2026, The tdcollect developers"  # noqa: A001 - Sphinx's name

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the notebooks are shown with the outputs they hold; tests/test_tutorials.py runs them
suppress_warnings = ["myst.xref_missing", "mystnb.unknown_mime_type"]

autodoc_default_options = {"members": True, "show-inheritance": False, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # EnvBase's and gymnasium's own docstrings are theirs, not ours
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "tdcollect"
html_static_path = ["_static"]


def _copy_tutorials() -> None:
    target = DOCS / "_generated" / "tutorials"
    target.mkdir(parents=True, exist_ok=True)
    for notebook in sorted((ROOT / "tutorials").glob("*.ipynb")):
        shutil.copyfile(notebook, target / notebook.name)


def _copy_figures() -> None:
    """The benchmark and soak figures, from benchmarks/results (where the tools write them)."""
    target = DOCS / "_generated" / "figures"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("throughput.png", "real_workloads.png", "soak_60min.png", "pipeline_atari.png"):
        source = ROOT / "benchmarks" / "results" / name
        if source.exists():
            shutil.copyfile(source, target / name)


_copy_tutorials()
_copy_figures()
