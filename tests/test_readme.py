"""Every ```python block of the README and of the docs (``docs/**/*.md``) runs as written: each one as a script of its
own, in a fresh interpreter, in an empty folder (as a new user pastes it into a file and runs it), with the
repository on ``PYTHONPATH`` (the docs' families page imports the family written for the tests)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
#: pages whose blocks run in the long tier (``-m long``, run by CI): the API pages' examples (each shows one class
#: that the README and the guides also run), the Ray guide (a cluster start) and the "your script" page (a script
#: on TorchRL's own classes, four spawned processes; the default run runs it under ``tdcollect run``, in
#: ``test_run_command.py``); the README's, the getting-started page's and the other guides' blocks run by default
LONG_TIER = ("docs/api/", "docs/guide/ray.md", "docs/guide/your_script.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[tuple[str, str]]:
    """``(page:line of the opening fence, source)`` for every python block of ``page``."""
    text = page.read_text()
    name = page.relative_to(ROOT).as_posix()
    return [(f"{name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)) for m in BLOCK.finditer(text)]


BLOCKS = [block for page in PAGES if "_build" not in page.parts and "_generated" not in page.parts
          for block in python_blocks(page)]


def test_the_readme_and_the_docs_have_their_examples():
    readme = [where for where, _ in BLOCKS if where.startswith("README.md")]
    assert len(readme) >= 3, readme
    assert len(BLOCKS) - len(readme) >= 8, [where for where, _ in BLOCKS]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("where, source", [pytest.param(where, source, marks=pytest.mark.long)
                                           if where.startswith(LONG_TIER) else (where, source)
                                           for where, source in BLOCKS], ids=[where for where, _ in BLOCKS])
def test_example_block_runs(where, source, tmp_path, no_leaks):
    script = tmp_path / "example.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=540,
                         env=env)
    assert run.returncode == 0, f"the block at {where} failed:\n{run.stderr[-4000:]}"
