"""TorchRL's PPO-Atari env pipeline (``sota-implementations/ppo/utils_atari.py: make_parallel_env``), env steps/s
with random actions, interleaved rounds in one run:

    python -m benchmarks.atari_pipeline [--rounds 3] [--steps 200] [--systems ...] [--rl ../shared/torchrl-tests]

Systems (8 envs each):

* ``torchrl`` - ``make_parallel_env`` as TorchRL ships it: TorchRL's ``ParallelEnv`` (8 workers), its transforms
  (``ToTensorImage``, ``GrayScale``, ``Resize(84, 84)``, ``CatFrames(4)``, ``RewardSum``, ``StepCounter``,
  ``SignTransform``, ``DoubleToFloat``, ``VecNorm``) in this process;
* ``ours_main_8x1`` / ``ours_workers_8x1`` - the same function with our ``ParallelEnv`` imported in its place,
  transforms in this process / moved into the workers (``move_transforms_to_workers``: ``VecNorm`` stays here);
* ``ours_main_2x4`` / ``ours_workers_2x4`` - the same with 2 workers of 4 envs;
* ``ours_workers_2x4_no_tail`` - ``ours_workers_2x4`` without what stays in this process (TorchRL's
  ``TransformedEnv`` and ``VecNorm``): the moved ``ParallelEnv`` alone;
* ``ours_per_env_2x4`` - the transforms inside the maker, per env (TorchRL's way to write ``make_env``; ``VecNorm``
  left out), 2 workers of 4: to set beside ``ours_workers_2x4_no_tail``, the same transforms on the batch, moved;
* ``ours_env_2x4`` - the envs alone (``make_base_env`` in 2 workers of 4, no pipeline transforms): with the row above,
  where a step's time goes (the envs, the transforms in the workers, this process's ``TransformedEnv`` and
  ``VecNorm``);
* ``envpool`` - EnvPool's ``Pong-v5`` (84x84x4, its own C++ preprocessing), 2 threads;
* ``serial`` - gymnasium's ``SyncVectorEnv`` of ``AtariPreprocessing`` + frame stack, one process.

The last two do other work per step (their frames are preprocessed in C++ or by gymnasium, at 4 emulator frames
per step where TorchRL's pipeline steps 4 of ``Pong-v5``'s own 4-frame steps): they are there for scale. Each
system is built, reset and warmed up (``--warmup`` steps), then ``rollout(--steps)`` is timed, then it is closed.
Where torchvision is not installed, ``Resize`` runs on ``benchmarks/sota_standins`` (for every system alike).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.pipeline_timing import interleaved, medians, steps_per_second

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "benchmarks" / "sota_standins"
ENV_NAME = "ALE/Pong-v5"
NUM_ENVS = 8
SYSTEMS = ["torchrl", "ours_main_8x1", "ours_workers_8x1", "ours_main_2x4", "ours_workers_2x4",
           "ours_workers_2x4_no_tail", "ours_per_env_2x4", "ours_env_2x4", "envpool", "serial"]


def per_env_maker(utils):
    """TorchRL's PPO-Atari env with its pixel transforms inside the maker (``make_parallel_env``'s list on each
    env, ``VecNorm`` left out: per env it would keep per-env statistics, other data than the batch's)."""
    from torchrl.envs import (
        CatFrames,
        DoubleToFloat,
        GrayScale,
        RenameTransform,
        Resize,
        RewardSum,
        SignTransform,
        StepCounter,
        ToTensorImage,
    )

    def make_env():
        env = utils.make_base_env(ENV_NAME, gym_backend="gymnasium")
        for transform in (RenameTransform(in_keys=["pixels"], out_keys=["pixels_int"]),
                          ToTensorImage(in_keys=["pixels_int"], out_keys=["pixels"]), GrayScale(), Resize(84, 84),
                          CatFrames(N=4, dim=-3), RewardSum(), StepCounter(max_steps=4500),
                          SignTransform(in_keys=["reward"]), DoubleToFloat()):
            env.append_transform(transform)
        return env

    return make_env


def _use_standins() -> None:
    """``torchvision`` from the stand-ins where it is not installed, here and in every worker (spawned or forked)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    sys.path.insert(0, str(STANDINS))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(STANDINS), str(ROOT), os.environ.get("PYTHONPATH", "")])


def load_utils(rl: Path):
    """TorchRL's ``utils_atari`` module, as shipped."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    path = rl / "sota-implementations" / "ppo" / "utils_atari.py"
    spec = importlib.util.spec_from_file_location("utils_atari", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(system: str, utils):
    """The env of ``system`` (a TorchRL env, except ``envpool`` / ``serial``: gymnasium vector envs)."""
    if system == "torchrl":
        return utils.make_parallel_env(ENV_NAME, NUM_ENVS, "cpu", "gymnasium")
    if system == "ours_per_env_2x4":
        from tdcollect.envs import ParallelEnv

        return ParallelEnv(2, per_env_maker(utils), envs_per_worker=NUM_ENVS // 2)
    if system == "ours_env_2x4":
        from tdcollect.envs import ParallelEnv

        return ParallelEnv(2, lambda: utils.make_base_env(ENV_NAME, gym_backend="gymnasium"),
                           envs_per_worker=NUM_ENVS // 2)
    if system.startswith("ours_"):
        from tdcollect.envs import ParallelEnv, move_transforms_to_workers

        workers = 8 if "8x1" in system else 2
        torchrl_parallel = utils.ParallelEnv
        utils.ParallelEnv = lambda num_envs, *args, **kwargs: ParallelEnv(workers, *args,
                                                                           envs_per_worker=num_envs // workers,
                                                                           **kwargs)
        try:
            env = utils.make_parallel_env(ENV_NAME, NUM_ENVS, "cpu", "gymnasium")
        finally:
            utils.ParallelEnv = torchrl_parallel
        if "_workers_" not in system:
            return env
        moved = move_transforms_to_workers(env)
        return moved.base_env if system.endswith("_no_tail") else moved
    from benchmarks import anchors

    if system == "envpool":
        import envpool

        task, options = anchors.ENVPOOL_TASKS["atari84"]
        return envpool.make(task, env_type="gymnasium", num_envs=NUM_ENVS, batch_size=NUM_ENVS, num_threads=2,
                            seed=0, **options)
    if system == "serial":
        return anchors.build_serial("atari84", NUM_ENVS)
    raise ValueError(f"unknown system {system!r}; one of {SYSTEMS}")


def timed(system: str, utils, steps: int, warmup: int, mode: str = "rollout") -> float:
    """Env steps per second of ``system`` after ``warmup`` steps, random actions: ``mode="rollout"``, a timed
    ``rollout(steps)`` (TorchRL's, which stacks its steps at the end); ``"steps"``, a loop of ``steps``
    ``step_and_maybe_reset`` calls, as a collector steps (into storage of its own)."""
    import numpy as np

    env = build(system, utils)
    try:
        if system in ("envpool", "serial"):
            env.reset(seed=0)
            rng = np.random.default_rng(0)
            n = env.action_space.shape[0] if env.action_space.shape else NUM_ENVS
            actions = [rng.integers(0, 6, size=n) for _ in range(warmup + steps)]
            for a in actions[:warmup]:
                env.step(a)
            start = time.perf_counter()
            for a in actions[warmup:]:
                env.step(a)
            return steps * NUM_ENVS / (time.perf_counter() - start)
        return steps_per_second(env, NUM_ENVS, steps, warmup, mode)
    finally:
        env.close()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--mode", choices=["rollout", "steps"], default="rollout",
                        help="rollout(steps), or a step_and_maybe_reset loop as a collector steps")
    parser.add_argument("--rl", type=Path, default=ROOT.parent / "shared" / "torchrl-tests")
    parser.add_argument("--json", type=Path, default=None, help="write the rates here")
    args = parser.parse_args(argv)
    _use_standins()
    utils = load_utils(args.rl)
    rates = interleaved(args.systems, args.rounds, lambda system: timed(system, utils, args.steps, args.warmup,
                                                                          args.mode))
    summary = medians(rates)
    print("\nmedian env steps/s" + ("" if "torchrl" not in summary else " (x TorchRL's pipeline)"))
    for system, rate in summary.items():
        ratio = f"  {rate / summary['torchrl']:.2f}x" if "torchrl" in summary else ""
        print(f"  {system:18s} {rate:8.0f}{ratio}")
    if "torchrl" in rates:
        for system, values in rates.items():
            if system != "torchrl":
                per_round = [v / t for v, t in zip(values, rates["torchrl"])]
                print(f"  {system:18s} per round x TorchRL: {', '.join(f'{r:.2f}' for r in per_round)}")
    out = {"rates": rates, "median": summary, "steps": args.steps, "mode": args.mode, "num_envs": NUM_ENVS,
           "env": ENV_NAME}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
