"""The import graph of the package's own modules (``envs/``, ``collectors/``), read with ``ast``: no circle, counting
every import (those inside functions too: a lazy import is still a dependency), and no chain longer than
:data:`MAX_CHAIN` modules among the imports made when a module is loaded (its top-level ones: the floors a module
stands on; a function-level import of an optional family or face, e.g. ``ray``, loads only when used). Package
``__init__`` files are the faces and are left out; a module imports the module it needs, never a package
``__init__`` (that would pull in every face)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "collectors")
MAX_CHAIN = 8


def modules() -> dict[str, Path]:
    """``{"envs.pool": path, ...}``, package ``__init__`` files under their package's name."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: dict, lazy: bool) -> set[str]:
    """The package's modules (and packages) that module ``name`` imports at its top level (``lazy``: anywhere in
    its source, inside functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("tdcollect."):
                target = node.module.removeprefix("tdcollect.")
            else:
                continue
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known.keys()
            out |= submodules or ({target} & known.keys())
        elif isinstance(node, ast.Import):
            out |= {alias.name.removeprefix("tdcollect.") for alias in node.names} & known.keys()
    return out - {name}


def graph(lazy: bool = True) -> dict[str, set[str]]:
    """``{module: the modules it imports}``, package ``__init__`` files left out (``lazy``: see :func:`imported`)."""
    known = modules()
    faces = {name for name, path in known.items() if path.name == "__init__.py"}
    return {name: imported(name, path, known, lazy) - faces for name, path in known.items() if name not in faces}


def longest_chains(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per module, its longest chain of imports (itself first); raises ``AssertionError`` naming a circle."""

    done: dict[str, tuple] = {}

    def chain(name: str, stack: tuple) -> tuple:
        assert name not in stack, f"import circle: {' -> '.join((*stack[stack.index(name):], name))}"
        if name not in done:
            below = [chain(other, (*stack, name)) for other in sorted(edges[name])]
            done[name] = (name, *max(below, key=len, default=()))
        return done[name]

    return {name: list(chain(name, ())) for name in edges}


def test_no_module_imports_a_package_face():
    known = modules()
    packages = {name for name, path in known.items() if path.name == "__init__.py"}
    imports = {name: imported(name, path, known, lazy=True) for name, path in known.items() if name not in packages}
    offenders = {name: sorted(targets & packages) for name, targets in imports.items() if targets & packages}
    assert not offenders, f"modules importing a package __init__ (import the module instead): {offenders}"


def test_no_import_circle():
    longest_chains(graph(lazy=True))


def test_short_chains():
    longest = max(longest_chains(graph(lazy=False)).values(), key=len)
    assert len(longest) <= MAX_CHAIN, f"{len(longest)} modules in a chain: {' -> '.join(longest)}"


def test_the_checks_see_a_circle_and_a_chain():
    """The checks above can fail: a circle and a long chain are found in a made-up graph."""
    try:
        longest_chains({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    except AssertionError as err:
        assert "a -> b -> c -> a" in str(err)
    else:
        raise AssertionError("the circle was not found")
    chains = longest_chains({"a": {"b", "d"}, "b": {"c"}, "c": set(), "d": set()})
    assert chains["a"] == ["a", "b", "c"]
    assert graph()["envs.pool"], "the real graph has edges (the parser reads the package's imports)"
