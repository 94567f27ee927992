"""Run gymnasium's own vector tests with tdcollect's ``ParallelVectorEnv`` in place of ``AsyncVectorEnv``.

    python .ci/gymnasium_suite/run.py --tests ../shared/gymnasium-tests [--reference]

``--tests``: a folder holding gymnasium's ``tests/`` (``tests/vector`` and the helpers it imports), e.g. the pinned
copy in ``../shared/gymnasium-tests``; gymnasium itself is the installed one. Every test of ``tests/vector`` runs
(``swap_plugin.py`` swaps the class); the gate counts the tests that construct an ``AsyncVectorEnv`` (ours, under
that name) and fails on any failure, in those or the others, not listed in ``expected_failures.txt`` (``<node id
prefix>  # reason`` per line). Listed tests that now pass are reported, to be removed from the list.
``--reference`` runs gymnasium's own class instead (the same count, for comparison).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from gate_lists import listed, report, verdict  # noqa: E402 - .ci/gate_lists.py, beside this folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", required=True, help="a folder holding gymnasium's tests/ folder")
    parser.add_argument("--reference", action="store_true", help="run gymnasium's own AsyncVectorEnv instead")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "outcomes"
        tests = Path(args.tests).resolve()
        # run from the temporary folder, writing nothing into the tests' folder (read-only in CI): no bytecode, no
        # cache, and the files the envs write into the working directory (MuJoCo's log) land here
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(tests), os.environ.get("PYTHONPATH", "")]),
                   GYMSWAP="gymnasium" if args.reference else "ours", GYMSWAP_RECORD=str(record),
                   PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-p", "swap_plugin", "-p", "no:cacheprovider", "-p", "no:warnings",
                   "-q", "-rfE", "--timeout", "120", "--tb=line", "-n", "2", "--rootdir", str(tests),
                   str(tests / "tests" / "vector")]
        run = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        recorded: dict[str, list] = {}
        for part in Path(tmp).glob("outcomes.*"):
            recorded.update(json.loads(part.read_text()))
    print(run.stdout[-3000:], run.stderr[-2000:])
    outcomes = {test: outcome for test, (outcome, built) in recorded.items() if built}
    failed = sorted(test for test, (outcome, _) in recorded.items() if outcome == "failed")
    expected = listed(HERE / "expected_failures.txt")
    counts = Counter(outcomes.values())
    unexpected, fixed = verdict(failed, expected)
    print(f"gymnasium vector suite gate ({'gymnasium' if args.reference else 'ours'}): {len(outcomes)} tests construct "
          f"an AsyncVectorEnv: {counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed; "
          f"{len(unexpected)} unexpected failures ({len(failed)} failed in all, {len(expected)} listed expected)")
    report(unexpected, fixed)
    return 1 if unexpected or not counts["passed"] else 0  # nothing run (a missing folder) fails the gate too


if __name__ == "__main__":
    sys.exit(main())
