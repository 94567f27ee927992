"""The package's layers, read from its import graph with ``ast`` (``envs/``, ``collectors/``, ``cli/``):

- ``envs/engine/`` imports nothing from ``envs/libs/``, ``envs/vector/`` or the TorchRL face (``envs/*.py``);
- a family module of ``envs/libs/`` imports no other family module (but those it builds on, :data:`BUILT_ON`: a
  wrapper family translating onto another family's road) and no face; ``envs/vector/`` does not import
  ``collectors``; ``envs`` never imports ``collectors``; nothing imports the command (``cli/``);
- an env family's name appears (in any case) only in its own module of ``envs/libs/``, the public ``__init__`` and
  the installer's aliases (``python -m``, the command's; see :data:`FAMILY_NAMES`);
- no circle, counting every import (those inside functions too: a lazy import is still a dependency);
- no chain longer than :data:`MAX_CHAIN` modules among the imports made when a module is loaded (its top-level ones:
  the floors a module stands on; a function-level import of an optional family or face, e.g. ``ray``, loads only
  when used), and none longer than :data:`MAX_CHAIN_INSIDE` inside one subpackage of ``envs``.

Package ``__init__`` files are the faces and are left out; a module imports the module it needs, never a package
``__init__`` (that would pull in every face), except ``envs.libs``'s: the list of families."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "collectors", "cli")
#: the folder installed as the ``tdcollect`` package itself (the command): its modules are named without it
MAX_CHAIN = 9
MAX_CHAIN_INSIDE = 5
#: the one package ``__init__`` that modules import: the registry of env families
REGISTRY = "envs.libs"
#: family module -> the family modules it builds on: DMLab2D on the dm_env family's conversions and stepper;
#: TorchRL's GymEnv road on the gymnasium family's checks and block stepper, the TorchRL family's specs and the Atari
#: road (a GymWrapper around gymnasium's Atari preprocessing); the Atari road on the gymnasium family's stepper;
#: TorchRL's MeltingpotEnv road on the dm_env family's layout and stepper and the TorchRL family's specs
BUILT_ON = {"envs.libs.dmlab2d": {"envs.libs.dm_env"},
            "envs.libs.gymenv": {"envs.libs.gym", "envs.libs.envbase", "envs.libs.atari"},
            "envs.libs.gymenv_transforms": {"envs.libs.gymenv", "envs.libs.envbase"},
            "envs.libs.atari": {"envs.libs.gym"},
            "envs.libs.meltingpot": {"envs.libs.dm_env", "envs.libs.envbase"}}
#: a family's names (lower case) -> the modules allowed to say them besides tests, docs and tutorials
FAMILY_NAMES = {
    ("meltingpot",): {"envs.libs.meltingpot", "envs.meltingpot_install", "command"},
    ("dm_env",): {"envs.libs.dm_env", "envs.libs.dmlab2d", "envs.libs.meltingpot"},
    ("dmlab2d",): {"envs.libs.dmlab2d"},
    ("pettingzoo",): {"envs.libs.pettingzoo"},
}


def modules() -> dict[str, Path]:
    """``{"envs.pool": path, ...}``, package ``__init__`` files under their package's name."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if package == "cli":
                parts = parts[1:]
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


def layer(name: str) -> str:
    """``"engine"``, ``"libs"``, ``"transforms"`` (the native transforms, on the families), ``"vector"``, ``"face"``
    (``envs/*.py``), ``"collectors"`` or ``"command"`` (``cli/``: ``tdcollect run`` and the other commands, above
    every face)."""
    parts = name.split(".")
    if parts[0] == "collectors":
        return "collectors"
    if parts[0] != "envs":
        return "command"
    return parts[1] if len(parts) > 2 and parts[1] in ("engine", "libs", "transforms", "vector") else "face"


def test_no_module_imports_a_package_face():
    known = modules()
    packages = {name for name, path in known.items() if path.name == "__init__.py"} - {REGISTRY}
    imports = {name: imported(name, path, known, lazy=True) for name, path in known.items() if name not in packages}
    offenders = {name: sorted(targets & packages) for name, targets in imports.items() if targets & packages}
    assert not offenders, f"modules importing a package __init__ (import the module instead): {offenders}"


def test_no_import_circle():
    longest_chains(graph(lazy=True))


def test_short_chains():
    longest = max(longest_chains(graph(lazy=False)).values(), key=len)
    assert len(longest) <= MAX_CHAIN, f"{len(longest)} modules in a chain: {' -> '.join(longest)}"


def test_layers():
    """Each module imports only the layers below it (module docstring); the registry counts as ``libs``."""
    edges = graph(lazy=True)
    edges = {name: targets | ({REGISTRY} if REGISTRY in imported(name, modules()[name], modules(), True) else set())
             for name, targets in edges.items()}
    allowed = {
        "engine": {"engine"},
        "libs": {"engine"},
        "transforms": {"engine", "libs", "transforms"},
        "vector": {"engine", "libs", "transforms", "face", "vector"},
        "face": {"engine", "libs", "transforms", "face", "vector"},
        "collectors": {"engine", "libs", "transforms", "face", "vector", "collectors"},
        "command": {"engine", "libs", "transforms", "face", "vector", "collectors", "command"},
    }
    wrong = []
    for name, targets in edges.items():
        for target in targets:
            if target == REGISTRY and layer(name) != "libs":
                continue
            if layer(name) == "libs" and layer(target) == "libs":
                if target not in BUILT_ON.get(name, ()):
                    wrong.append(f"{name} -> {target} (a family imports another family)")
                continue
            if layer(target) not in allowed[layer(name)]:
                wrong.append(f"{name} -> {target} ({layer(name)} must not import {layer(target)})")
    assert not wrong, "imports across the layers: " + "; ".join(sorted(wrong))


def test_short_chains_inside_each_subpackage():
    edges = graph(lazy=False)
    for package in ("envs.engine", "envs.libs", "envs.vector"):
        inside = {name: {t for t in targets if t.startswith(package + ".")}
                  for name, targets in edges.items() if name.startswith(package + ".")}
        longest = max(longest_chains(inside).values(), key=len)
        assert len(longest) <= MAX_CHAIN_INSIDE, f"{package}: {len(longest)} modules in a chain: {' -> '.join(longest)}"


def test_family_names_stay_in_their_modules():
    """grep, in the package's own code: a family's name is said only in its module (and the public faces)."""
    known = modules()
    faces = {"envs", "envs.libs"}
    wrong = []
    for names, allowed in FAMILY_NAMES.items():
        for module, path in known.items():
            if module in allowed or module in faces:
                continue
            text = path.read_text().lower()
            wrong += [f"{module} says {word!r}" for word in names if word in text]
    assert not wrong, "; ".join(sorted(wrong))


def test_libs_is_one_module_per_family():
    """Every module of ``envs/libs/`` defines a ``FAMILY`` and is found by the registry."""
    import importlib

    from tdcollect.envs.libs import registered

    names = {family.name for family in registered()}
    for path in sorted((ROOT / "envs" / "libs").glob("[!_]*.py")):
        module = importlib.import_module(f"tdcollect.envs.libs.{path.stem}")
        assert module.FAMILY.name in names, f"libs/{path.name}'s family is not registered"


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
    assert graph()["envs.engine.pool"], "the real graph has edges (the parser reads the package's imports)"
