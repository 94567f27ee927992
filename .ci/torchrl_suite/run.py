"""Run TorchRL's own tests against tdcollect's classes and compare with the expected failures.

    python .ci/torchrl_suite/run.py --rl /path/to/pytorch/rl [--suite envs|collectors] [--reference]

``--rl``: a checkout of github.com/pytorch/rl, or the pinned copy in ``../shared/torchrl-tests`` (its ``test/``
folder is used; torchrl itself is the installed one).

- ``envs`` (default): the ParallelEnv tests of ``test/envs/test_parallel.py``, ``test_auto_reset.py``,
  ``test_nested.py``, ``test_special.py`` and ``test_env_base.py``, with our ``ParallelEnv`` swapped in;
  expected failures in ``envs_expected_failures.txt``.
- ``collectors``: the tests of ``test/test_collectors.py``, ``test/collectors/test_evaluator.py`` and
  ``test/compile/test_compile_collectors.py`` that construct a ``Collector``, ``MultiSyncCollector`` or
  ``MultiAsyncCollector`` in TorchRL's own run on this machine (``collectors_selected.txt``, each node id with
  the classes it builds and TorchRL's outcome), with our collectors under TorchRL's names; expected failures
  in ``collectors_expected_failures.txt``.

Swapping is done by ``swap_plugin.py``. Exit status 0 when every failure is listed as expected (each with its
reason); listed tests that now pass are reported, to be removed from the list. The listed expected failures of the
collectors suite are not run (``--all`` runs them too: some wait for a timeout), so that it fits in CI.
``--reference`` runs TorchRL's own classes instead.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from gate_lists import listed, report, verdict  # noqa: E402 - .ci/gate_lists.py, beside this folder

SUITES = {
    "envs": ["envs/test_parallel.py", "envs/test_auto_reset.py", "envs/test_nested.py", "envs/test_special.py",
             "envs/test_env_base.py"],
    "collectors": ["test_collectors.py", "collectors/test_evaluator.py", "compile/test_compile_collectors.py"],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rl", required=True, help="a checkout of github.com/pytorch/rl")
    parser.add_argument("--suite", choices=sorted(SUITES), default="envs")
    parser.add_argument("--reference", action="store_true", help="run TorchRL's own classes instead")
    parser.add_argument("--all", action="store_true", help="collectors: run the listed expected failures too")
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               TDSWAP="torchrl" if args.reference else "ours", TDSWAP_SUITE=args.suite,
               # some tests start `python` themselves: this one
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if args.suite == "envs":
        env["TDSWAP_ONLY_PARALLEL"] = "1"
    else:
        env["TDSWAP_SELECT"] = str(HERE / "collectors_selected.txt")
        if not (args.all or args.reference):
            env["TDSWAP_SKIP"] = str(HERE / "collectors_expected_failures.txt")
    # two pytest workers (the collectors suite: ~390 tests, most waiting on process start-ups), to fit CI
    workers = ["-n", "2"]
    command = [sys.executable, "-m", "pytest", "-p", "swap_plugin", "-p", "no:cacheprovider", "-q", "-rfE",
               "--timeout", "120", "--tb=no", "--durations=10", "-W", "ignore::DeprecationWarning", *workers,
               *SUITES[args.suite]]
    run = subprocess.run(command, cwd=Path(args.rl) / "test", env=env, capture_output=True, text=True)
    print(run.stdout[-3000:])
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", run.stdout, re.MULTILINE)))
    if args.reference:
        return run.returncode
    expected = listed(HERE / f"{args.suite}_expected_failures.txt")
    ran_expected = args.suite == "envs" or args.all
    passed = re.search(r"(\d+) passed", run.stdout)
    unexpected, fixed = verdict(failed, expected, ran_expected)
    print(f"TorchRL {args.suite} suite gate: {passed.group(1) if passed else 0} passed, {len(unexpected)} unexpected "
          f"failures ({len(failed)} failed in all; {len(expected)} listed expected failures"
          f"{f', {len(fixed)} of them now pass' if ran_expected else ', not run'})")
    report(unexpected, fixed)
    return 1 if unexpected or not passed else 0  # no test run at all (a missing checkout) fails the gate too


if __name__ == "__main__":
    sys.exit(main())
