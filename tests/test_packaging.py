"""What a non-editable install ships: every subpackage of the tree is listed in ``pyproject.toml`` and the built wheel
imports every module of the package (the editable install the tests use would find a module a wheel leaves out)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"tdcollect": "cli", "tdcollect.envs": "envs", "tdcollect.collectors": "collectors"}
#: ``tdcollect`` itself (the command, in cli/) has no ``__init__.py``: the three folders make one package
NAMESPACE = "tdcollect"
#: modules that run when imported (the command's ``python -m`` entry)
RUN_WHEN_IMPORTED = {"tdcollect.__main__"}


def tree_packages() -> set[str]:
    """Every package of the tree (a folder with an ``__init__.py``; every folder of the namespace's), by its
    installed name."""
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        if name == NAMESPACE:
            found |= {".".join((name, *sub.relative_to(ROOT / folder).parts))
                      for sub in [ROOT / folder, *(ROOT / folder).rglob("*")]
                      if sub.is_dir() and sub.name != "__pycache__"}
            continue
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    return found


def tree_modules() -> set[str]:
    """Every module of the tree, by its installed name (packages by their own name)."""
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found.add(".".join((name, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return found


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == tree_packages(), "pyproject.toml's [tool.setuptools] packages and the tree differ"
    assert config["package-dir"] == PACKAGE_DIRS


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_imports_every_module(tmp_path):
    """Build the wheel as ``pip install .`` would, then import each of its modules from it alone."""
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tdcollect-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    shipped = {name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for name in names if name.endswith(".py")}
    assert shipped == tree_modules(), f"missing from the wheel: {sorted(tree_modules() - shipped)}"
    assert any(name.endswith("py.typed") for name in names), "the wheel ships no py.typed"
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as archive:
        assert "License-Expression: MIT" in archive.read(metadata).decode(), "the wheel's metadata has no license"
    code = ("import importlib, sys\n"
            f"site = {str(tmp_path / 'site')!r}\n"
            f"for name in sorted({sorted(tree_modules() - RUN_WHEN_IMPORTED)!r}):\n"
            "    module = importlib.import_module(name)\n"
            "    assert module.__file__.startswith(site), (name, module.__file__)\n"
            "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
