"""TorchRL's SAC-MuJoCo env pipeline (``sota-implementations/sac/utils.py: make_environment``: a ``ParallelEnv`` of
``EnvCreator(env_maker)`` over ``GymEnv("HalfCheetah-v4")``, then ``InitTracker``, ``StepCounter``,
``DoubleToFloat``, ``RewardSum`` on the batched env), env steps/s of a ``step_and_maybe_reset`` loop with random
actions (as a collector steps), interleaved rounds in one run:

    python -m benchmarks.sac_pipeline [--rounds 3] [--steps 300] [--systems ...] [--rl ../shared/torchrl-tests]

Systems (8 envs each, ``env_per_collector``'s default):

* ``torchrl`` - ``make_environment`` as TorchRL ships it (TorchRL's ``ParallelEnv``, 8 workers);
* ``ours_8x1`` - the same function with our ``ParallelEnv`` imported in its place (only the import changed);
* ``ours_2x4`` - the same with 2 workers of 4 envs (our layout for 2 cores);
* ``ours_2x4_workers`` - the same, the transforms moved into the workers (``move_transforms_to_workers``);
* ``ours_gym_make_2x4`` - no transforms, ``gym.make`` constructors (the engine's own road, for scale).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

from benchmarks.pipeline_timing import interleaved, medians, steps_per_second

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = "HalfCheetah-v4"
NUM_ENVS = 8
SYSTEMS = ["torchrl", "ours_8x1", "ours_2x4", "ours_2x4_workers", "ours_gym_make_2x4"]


def load_utils(rl: Path):
    """TorchRL's ``sac/utils.py``, as shipped."""
    path = rl / "sota-implementations" / "sac" / "utils.py"
    spec = importlib.util.spec_from_file_location("sac_utils", path)
    module = importlib.util.module_from_spec(spec)  # (not in sys.modules: its functions travel to workers by value)
    spec.loader.exec_module(module)
    return module


def config() -> SimpleNamespace:
    """The fields of ``sac/config.yaml`` that ``make_environment`` reads (its defaults)."""
    return SimpleNamespace(env=SimpleNamespace(name=ENV_NAME, task="", library="gymnasium", max_episode_steps=1000,
                                               seed=42),
                           collector=SimpleNamespace(env_per_collector=NUM_ENVS),
                           logger=SimpleNamespace(video=False))


def gym_make():
    import gymnasium

    return gymnasium.make(ENV_NAME)


def build(system: str, utils):
    """The train env of ``system`` (its eval env is closed at once)."""
    if system == "ours_gym_make_2x4":
        from tdcollect.envs import ParallelEnv

        return ParallelEnv(2, gym_make, envs_per_worker=NUM_ENVS // 2)
    if system == "torchrl":
        train, evaluation = utils.make_environment(config())
    else:
        from tdcollect.envs import ParallelEnv

        workers = 8 if system == "ours_8x1" else 2
        torchrl_parallel = utils.ParallelEnv
        utils.ParallelEnv = lambda num_envs, *args, **kwargs: ParallelEnv(workers, *args,
                                                                           envs_per_worker=num_envs // workers,
                                                                           **kwargs)
        try:
            train, evaluation = utils.make_environment(config())
        finally:
            utils.ParallelEnv = torchrl_parallel
    evaluation.close(raise_if_closed=False)  # (TorchRL's starts lazily: never started, it is closed already)
    if system.endswith("_workers"):
        from tdcollect.envs import move_transforms_to_workers

        return move_transforms_to_workers(train)
    return train


def timed(system: str, utils, steps: int, warmup: int) -> float:
    """Env steps per second of ``system``'s step loop after ``warmup`` steps, random actions."""
    env = build(system, utils)
    try:
        return steps_per_second(env, NUM_ENVS, steps, warmup, mode="steps")
    finally:
        env.close()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--rl", type=Path, default=ROOT.parent / "shared" / "torchrl-tests")
    parser.add_argument("--json", type=Path, default=None, help="write the rates here")
    args = parser.parse_args(argv)
    utils = load_utils(args.rl)
    rates = interleaved(args.systems, args.rounds, lambda system: timed(system, utils, args.steps, args.warmup))
    medians_ = medians(rates)
    print("\nmedian env steps/s" + (" (x TorchRL's pipeline)" if "torchrl" in medians_ else ""))
    for system, rate in medians_.items():
        ratio = f"  {rate / medians_['torchrl']:.2f}x" if "torchrl" in medians_ else ""
        print(f"  {system:18s} {rate:8.0f}{ratio}")
    out = {"rates": rates, "median": medians_, "steps": args.steps, "num_envs": NUM_ENVS, "env": ENV_NAME}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
