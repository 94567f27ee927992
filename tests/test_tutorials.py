"""Every notebook under tutorials/, executed top to bottom in a fresh kernel, as CI does.

Each notebook runs as a copy held in memory (the .ipynb files are never written), with tutorials/ as the
working directory, in a kernel of this very interpreter with the repository on its PYTHONPATH, so it runs the
same whether the package is pip-installed or not. A failing cell fails the test with that cell's source and
traceback. ``TUTORIAL_QUICK=1`` is set: the notebooks that only time things or train for show (04, 05, 06; their
first cell says what changes) run shorter; 03 and 07 train to their targets as they are. After the last cell the
kernel must have no child process left (multiprocessing's forkserver and
resource tracker aside); then the kernel is shut down and ``no_leaks`` checks this process.

Slow (a few minutes in all on 2 cores): skip them locally with ``-m "not slow"``; 01, 04, 05 and 06 are in the
long tier (``-m long``), which CI runs too.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.conftest import live_children

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
CELL_TIMEOUT_S = 600
PPO_NOTEBOOK = "03_ppo_multisync.ipynb"
REPLAY_NOTEBOOK = "07_offpolicy_replay_buffer.ipynb"
REPLAY_TARGET_RETURN = 60  # the greedy DQN policy after 16k frames; a random one averages about 22
PPO_TARGET_RETURN = 450.0
#: in the long tier (``-m long``, run by CI): the notebooks that time things or run a substrate for show, and the
#: quick start (its start-method tour starts spawn and forkserver workers: a minute; the README's blocks and
#: tests/test_start_methods.py run the same roads by default); the native engines and the two that train to a
#: target run by default
LONG_TIER = ("01_quick_start.ipynb", "04_tuning_throughput.ipynb", "05_gymnasium_and_sb3.ipynb", "06_meltingpot.ipynb")


@pytest.fixture
def python3_kernel(tmp_path, monkeypatch):
    """Make the kernel named "python3" this interpreter (a user-level kernelspec may point elsewhere), with
    the repository importable."""
    from ipykernel.kernelspec import write_kernel_spec

    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched before the user's own kernels
    path = [str(TUTORIALS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("TUTORIAL_QUICK", "1")  # the notebooks that time things or train for show run shorter


def run_notebook(nb: nbformat.NotebookNode, cwd: Path) -> list[str]:
    """Execute ``nb`` (in place, in memory) in a fresh kernel started in ``cwd``; raises CellExecutionError
    at the first failing cell. Returns the kernel's child processes still alive after the last cell.
    The kernel is shut down, and waited for, before this returns."""
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    with client.setup_kernel():  # starts the kernel; on exit shuts it down and waits until it is gone
        kernel = psutil.Process(client.km.provisioner.pid)
        try:
            client.execute(cleanup_kc=False)
        except CellExecutionError as err:  # the same error, without the terminal colours of the traceback
            raise CellExecutionError(re.sub(r"\x1b\[[0-9;]*m", "", str(err)), err.ename, err.evalue) from None
        return _children(kernel)


def _children(process: psutil.Process) -> list[str]:
    psutil.wait_procs(live_children(process), timeout=3)
    return [f"{p.pid} {p.name()}" for p in live_children(process)]


def stdout_lines(nb: nbformat.NotebookNode) -> list[str]:
    return [line for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
            if out.output_type == "stream" and out.name == "stdout" for line in out.text.splitlines()]


def last_result(nb: nbformat.NotebookNode) -> dict:
    """The JSON of the last ``RESULT {...}`` line the notebook printed."""
    results = [line[len("RESULT "):] for line in stdout_lines(nb) if line.startswith("RESULT ")]
    assert results, "the notebook printed no 'RESULT {json}' line"
    return json.loads(results[-1])


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.long) if p.name in LONG_TIER else p
                                  for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS])
def test_tutorial_runs(path: Path, python3_kernel, no_leaks, record_property):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "Expected run time" in first.source, (
        f"{path.name}: the first cell must state the expected run time")
    start = time.perf_counter()
    leftover = run_notebook(nb, path.parent)
    seconds = time.perf_counter() - start
    record_property("seconds", round(seconds, 1))
    print(f"{path.name}: {seconds:.1f} s")
    assert not leftover, f"{path.name} left processes running in its kernel: {leftover}"
    if path.name == PPO_NOTEBOOK:
        result = last_result(nb)
        assert result["final_mean_return"] >= PPO_TARGET_RETURN, result
        assert {"frames", "wall_time_s", "fps"} <= result.keys(), result
    if path.name == REPLAY_NOTEBOOK:
        result = last_result(nb)
        assert result["buffer"] == result["frames"] == 16_000, "every collected frame went into the replay buffer"
        assert result["greedy_mean_return"] >= REPLAY_TARGET_RETURN, result


def test_tutorials_exist():
    names = [p.name for p in NOTEBOOKS]
    assert len(names) >= 4 and PPO_NOTEBOOK in names, names


def test_a_failing_cell_fails_the_run(python3_kernel, tmp_path, no_leaks):
    """The runner is not a rubber stamp: a broken cell raises, naming the cell's error."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# broken\n\nExpected run time: 1 s."),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("raise ValueError('this tutorial cell is broken')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ])
    with pytest.raises(CellExecutionError, match="this tutorial cell is broken"):
        run_notebook(nb, tmp_path)
    assert "never reached" not in stdout_lines(nb)
