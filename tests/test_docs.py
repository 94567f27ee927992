"""The documentation's promises: an API page, and a docstring, for every public name; a README that fits on a few
screens with no dated paragraph; the license, the changelog and the type marker shipped. (The pages' code blocks run
in ``tests/test_readme.py``; the site is built with ``-W`` by ``.ci/run``.)"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
PUBLIC = ["tdcollect.envs", "tdcollect.collectors", "tdcollect.envs.vector"]


def public_names() -> list[tuple[str, str]]:
    return [(module, name) for module in PUBLIC for name in importlib.import_module(module).__all__]


@pytest.mark.parametrize("module, name", public_names())
def test_every_public_name_has_an_api_page_and_a_docstring(module, name):
    page = API / f"{module.removeprefix('tdcollect.')}.{name}.md"
    assert page.exists(), f"{module}.{name} has no API page ({page.relative_to(ROOT)})"
    assert re.search(rf"\.\. auto(class|function):: {re.escape(module)}\.{name}\b", page.read_text()), \
        f"{page.relative_to(ROOT)} does not document {module}.{name}"
    assert page.stem in (API / "index.md").read_text(), f"{page.stem} is not in the API index"
    obj = getattr(importlib.import_module(module), name)
    own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    assert own and own.strip(), f"{module}.{name} has no docstring of its own"


def test_every_api_page_documents_a_public_name():
    names = {f"{module.removeprefix('tdcollect.')}.{name}" for module, name in public_names()}
    pages = {page.stem for page in API.glob("*.md")} - {"index", "families"}
    assert pages <= names, f"pages of no public name: {sorted(pages - names)}"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    dated = re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dated, "a dated paragraph in the README (history goes to CHANGELOG.md)"


def test_license_changelog_and_type_marker():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert (ROOT / "envs" / "py.typed").exists() and (ROOT / "collectors" / "py.typed").exists()
    assert re.search(r'^license = "MIT"$', (ROOT / "pyproject.toml").read_text(), re.M)
