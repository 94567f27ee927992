"""Every ```python block of the README runs as written: each one as a script of its own, in a fresh interpreter, in
an empty folder (as a new user pastes it into a file and runs it)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[int, str]]:
    """``(line of the opening fence, source)`` for every python block of the README."""
    text = README.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in BLOCK.finditer(text)]


BLOCKS = python_blocks()


def test_the_readme_has_its_examples():
    assert len(BLOCKS) >= 8, [line for line, _ in BLOCKS]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, source, tmp_path, no_leaks):
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(source)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, f"README block at line {line} failed:\n{run.stderr[-4000:]}"
