"""The pinned scripts that seed their collector after building it (``collector.set_seed(cfg.env.seed)`` in their
``utils.py``), with that one line removed (their env is seeded before, ``parallel_env.set_seed(cfg.env.seed)``), run
once as shipped and once under ``tdcollect run``: whether the two runs log the same numbers (every scalar but the
timings, see ``sota.compared``). What it shows: the only cause of other numbers in these scripts is TorchRL's first
observation after ``collector.set_seed`` (see the docs' "The same numbers, only sooner").

    python -m benchmarks.sota_seeded_env [--scripts ddpg discrete_sac iql_online discrete_iql] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from . import sota

#: the line removed from each script's utils.py
COLLECTOR_SEED = "collector.set_seed(cfg.env.seed)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", nargs="+", default=["ddpg", "discrete_sac", "iql_online", "discrete_iql"],
                        choices=[name for name in sota.SCRIPTS if name in sota.SEEDS_ITS_COLLECTOR])
    parser.add_argument("--rl", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "torchrl-tests")
    parser.add_argument("--json", type=Path, default=None, help="write each script's verdict there")
    args = parser.parse_args(argv)
    verdicts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for script in args.scripts:
            runs = {}
            for impl in ("torchrl", "run"):
                target = Path(tmp) / f"{script}-{impl}"
                shutil.copytree(args.rl / "sota-implementations" / sota.SCRIPTS[script][0], target)
                utils = target / "utils.py"
                source = utils.read_text()
                if COLLECTOR_SEED not in source:
                    raise SystemExit(f"{script}: {utils.name} has no {COLLECTOR_SEED!r}")
                utils.write_text(source.replace(COLLECTOR_SEED, "pass  # (seeded env, unseeded collector)"))
                runs[impl] = sota.run(target, script, impl, 0, envs_as_shipped=True, timeout=400)
            failed = [impl for impl, one in runs.items() if one["exit"]]
            if failed:
                verdicts[script] = f"exit {runs[failed[0]]['exit']} ({failed[0]})"
            else:
                where = sota.first_difference(runs["torchrl"]["scalars"], runs["run"]["scalars"])
                count = sum(len(values) for values in sota.compared(runs["torchrl"]["scalars"]).values())
                verdicts[script] = f"same numbers ({count} values)" if where is None else f"differ at {where}"
            print(f"{script:14s} {verdicts[script]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(verdicts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
