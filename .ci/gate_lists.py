"""What the CI gates that run other projects' test suites against ours share (``torchrl_suite/run.py``,
``gymnasium_suite/run.py``): their expected-failure lists and the verdict on a run."""
from __future__ import annotations

from pathlib import Path


def listed(path: Path) -> dict[str, str]:
    """``{node id or prefix: reason}`` from a list of ``<id>  # <reason>`` lines (``#`` lines are comments)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            prefix, _, reason = line.partition("#")
            out[prefix.strip()] = reason.strip()
    return out


def verdict(failed: list[str], expected: dict, ran_expected: bool = True) -> tuple[list[str], list[str]]:
    """``(unexpected failures, listed prefixes that now pass)``: a failure is expected when it starts with a listed
    prefix; a listed prefix "now passes" when no failure starts with it (only known when the listed tests ran)."""
    unexpected = [test for test in failed if not any(test.startswith(prefix) for prefix in expected)]
    fixed = [prefix for prefix in expected if ran_expected and not any(test.startswith(prefix) for test in failed)]
    return unexpected, fixed


def report(unexpected: list[str], fixed: list[str]) -> None:
    """One line per unexpected failure, and per listed prefix that now passes (to be taken off the list)."""
    for test in unexpected:
        print("UNEXPECTED", test)
    for prefix in fixed:
        print("NOW PASSES", prefix)
