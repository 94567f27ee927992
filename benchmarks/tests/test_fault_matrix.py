"""benchmarks/fault_matrix.py: it counts only its own process tree's shared-memory entries, and its command line
lists and picks faults."""
import gc
import multiprocessing
import os
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fault_matrix_counts_only_the_shm_entries_of_its_process_tree(no_leaks, unrelated_shm):
    from benchmarks import fault_matrix

    kept = []

    def cell():
        unrelated_shm()  # other programs' entries appear while the cell runs
        kept.append(multiprocessing.get_context("spawn").Semaphore())  # ours, and not released
        raise ValueError("the fault")

    try:
        result = fault_matrix.measure(cell)
    finally:
        kept.clear()
        gc.collect()
    assert result["error"] == "ValueError: the fault"
    assert result["segments"] == 1


def _fault_matrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.fault_matrix", *args], cwd=_REPO, text=True,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def test_fault_matrix_help_prints_usage_and_runs_nothing():
    start = time.monotonic()
    proc = _fault_matrix("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks.fault_matrix") and "--only" in proc.stdout
    assert "| fault |" not in proc.stdout
    assert time.monotonic() - start < 30


def test_fault_matrix_only_picks_a_subset():
    proc = _fault_matrix("--list", "--only", "SEGFAULT", "--only", "num_workers")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ParallelEnv: segfault in step", "bad input: num_workers < 1"]
    proc = _fault_matrix("--only", "no such fault")
    assert proc.returncode == 2 and "no fault's name contains" in proc.stderr
