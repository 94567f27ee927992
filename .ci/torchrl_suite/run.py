"""Run TorchRL's ParallelEnv tests against tdcollect's ParallelEnv and compare with the expected failures.

    python .ci/torchrl_suite/run.py --rl /path/to/a/checkout/of/pytorch/rl [--reference]

``--rl``: a checkout of github.com/pytorch/rl (its ``test/`` folder is used; torchrl itself is the installed one).
The ParallelEnv tests of ``test/envs/test_parallel.py``, ``test_auto_reset.py``, ``test_nested.py``,
``test_special.py`` and ``test_env_base.py`` run with our class swapped in (``swap_plugin.py``). Exit status 0
when every failure is listed in ``expected_failures.txt`` (each with its reason); listed tests that now pass are
reported, to be removed from the list. ``--reference`` runs TorchRL's own class instead.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ["envs/test_parallel.py", "envs/test_auto_reset.py", "envs/test_nested.py", "envs/test_special.py",
         "envs/test_env_base.py"]


def expected_failures() -> dict[str, str]:
    """``{test id prefix: reason}`` from expected_failures.txt (``<prefix>  # <reason>`` per line)."""
    out = {}
    for line in (HERE / "expected_failures.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            prefix, _, reason = line.partition("#")
            out[prefix.strip()] = reason.strip()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rl", required=True, help="a checkout of github.com/pytorch/rl")
    parser.add_argument("--reference", action="store_true", help="run TorchRL's own ParallelEnv instead")
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               TDSWAP="torchrl" if args.reference else "ours", TDSWAP_ONLY_PARALLEL="1")
    command = [sys.executable, "-m", "pytest", "-p", "swap_plugin", "-p", "no:cacheprovider", "-q", "-rfE",
               "--timeout", "120", "--tb=no", *FILES]
    run = subprocess.run(command, cwd=Path(args.rl) / "test", env=env, capture_output=True, text=True)
    print(run.stdout[-3000:])
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", run.stdout, re.MULTILINE)))
    if args.reference:
        return run.returncode
    expected = expected_failures()
    unexpected = [test for test in failed if not any(test.startswith(prefix) for prefix in expected)]
    fixed = [prefix for prefix in expected if not any(test.startswith(prefix) for test in failed)]
    passed = re.search(r"(\d+) passed", run.stdout)
    print(f"TorchRL env suite gate: {passed.group(1) if passed else 0} passed, {len(unexpected)} unexpected failures "
          f"({len(failed)} failed in all; {len(fixed)} listed expected failures now pass)")
    for test in unexpected:
        print("UNEXPECTED", test)
    for prefix in fixed:
        print("NOW PASSES", prefix)
    return 1 if unexpected or not passed else 0  # no test run at all (a missing checkout) fails the gate too


if __name__ == "__main__":
    sys.exit(main())
