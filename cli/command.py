"""The ``tdcollect`` command (also ``python -m tdcollect``)::

    tdcollect run SCRIPT [ARGS...]        your TorchRL script with tdcollect's envs and collectors (see script.py)
    tdcollect demo [--workers W ...]      the CartPole demo (python -m tdcollect.envs.demo)
    tdcollect autotune ENV_ID --num-envs N   the fastest split of N gymnasium envs over workers here
    tdcollect install-meltingpot          dm-meltingpot without its asset download
                                          (python -m tdcollect.envs.meltingpot_install)
"""
from __future__ import annotations

import argparse
import sys

from .swap import LAYOUTS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tdcollect", description="tdcollect: parallel RL env stepping for PyTorch.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a TorchRL script with tdcollect's batched envs and collectors in place of TorchRL's",
        description="Run SCRIPT as `python SCRIPT ARGS` would, with tdcollect's ParallelEnv, SerialEnv and "
                    "collectors under TorchRL's names (torchrl.envs, torchrl.envs.batched_envs, torchrl.collectors), "
                    "in this process and every process it starts. One line on stderr says what was replaced.")
    run.add_argument("--layout", choices=LAYOUTS, default="machine",
                     help="machine (default): a ParallelEnv asked for more workers than this machine has cores runs "
                          "as fewer workers of several envs each, same batch and data; asked: as the script says")
    run.add_argument("script", help="the Python file to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (hydra overrides too)")
    commands.add_parser("demo", add_help=False,
                        help="the CartPole demo: a ParallelEnv against a serial loop (its options: demo --help)")
    tune = commands.add_parser("autotune", help="time splits of N gymnasium envs over worker processes here")
    tune.add_argument("env_id", help="a gymnasium env id (gymnasium.make's first argument)")
    tune.add_argument("--num-envs", type=int, required=True, help="how many envs in all")
    tune.add_argument("--budget-s", type=float, default=30.0, help="seconds to spend (default 30)")
    commands.add_parser("install-meltingpot", add_help=False,
                        help="install dm-meltingpot 2.4.1 (its setup.py downloads assets from an unreachable host; "
                             "substrates never read them)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit status."""
    parser = _parser()
    args, passed_on = parser.parse_known_args(argv)  # demo's and install-meltingpot's own options are theirs
    if passed_on and args.command not in ("demo", "install-meltingpot"):
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    if args.command == "run":
        from .script import run_script

        return run_script(args.script, args.args, layout=args.layout)
    if args.command == "demo":
        from tdcollect.envs.demo import main as demo

        demo(passed_on)
        return 0
    if args.command == "autotune":
        return _autotune(args.env_id, args.num_envs, args.budget_s)
    if args.command == "install-meltingpot":
        from tdcollect.envs.meltingpot_install import main as install

        return install(passed_on)
    parser.print_help()
    return 2


def _autotune(env_id: str, num_envs: int, budget_s: float) -> int:
    import functools

    import gymnasium as gym

    from tdcollect.envs.tuning import autotune

    tuning = autotune(functools.partial(gym.make, env_id), num_envs, budget_s=budget_s)
    print(f"best: ParallelEnv(create_env_fn=make_env, **{tuning.kwargs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
