"""TorchRL's ``GymEnv`` on our ``ParallelEnv``: env steps/s of ``lambda: GymEnv(name)`` (the native road) against
``lambda: gym.make(name)`` on the same engine, TorchRL's own road on ours (a ``GymEnv`` subclass, which keeps
TorchRL's ``step``: the numbers before the native road), and TorchRL's ``ParallelEnv`` of ``GymEnv``; random
actions, interleaved rounds in one run:

    python -m benchmarks.gymenv_road [--rounds 3] [--steps 200] [--mode rollout|steps] [--workloads ...]
                                     [--systems ...]

Workloads (workers x envs per worker): ``cartpole`` 2 x 16, ``pendulum`` 2 x 16, ``halfcheetah`` 2 x 8, ``pong``
2 x 4 (``GymEnv("ALE/Pong-v5", from_pixels=True, frame_skip=4)``: ALE takes the frame skip itself, so the
``gym.make`` row is ``gym.make("ALE/Pong-v5", frameskip=4)``, whose observation is the same frame). TorchRL's
``ParallelEnv`` runs one process per env (its layout: ``ParallelEnv(num_envs, make)``). Each system is built,
seeded, warmed up (``--warmup`` steps), then timed (``rollout(--steps)``, or a ``step_and_maybe_reset`` loop as
a collector steps), then closed; rounds are interleaved workload by workload (``pipeline_timing.interleaved``).
"""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from torchrl.envs import GymEnv

from benchmarks.pipeline_timing import interleaved, medians, steps_per_second

#: name -> (gymnasium id, GymEnv / gym.make options, workers, envs per worker)
WORKLOADS = {
    "cartpole": ("CartPole-v1", {}, {}, 2, 16),
    "pendulum": ("Pendulum-v1", {}, {}, 2, 16),
    "halfcheetah": ("HalfCheetah-v5", {}, {}, 2, 8),
    "pong": ("ALE/Pong-v5", {"from_pixels": True, "frame_skip": 4}, {"frameskip": 4}, 2, 4),
}
SYSTEMS = ["ours_gym_make", "ours_gymenv", "ours_torchrl_road", "torchrl_parallel"]


def _register(env_id: str) -> None:
    if env_id.startswith("ALE/"):
        import ale_py
        import gymnasium

        gymnasium.register_envs(ale_py)


def make_gym(env_id: str, options: dict):
    import gymnasium

    _register(env_id)
    return gymnasium.make(env_id, **options)


def make_gymenv(env_id: str, options: dict):
    _register(env_id)
    return GymEnv(env_id, **options)


def make_torchrl_road(env_id: str, options: dict):
    """A ``GymEnv`` that keeps TorchRL's ``step`` on our engine (a subclass: the native road leaves it alone)."""
    _register(env_id)
    return TorchRLRoadGymEnv(env_id, **options)


class TorchRLRoadGymEnv(GymEnv):
    """TorchRL's ``GymEnv``, stepped through TorchRL's own ``step`` on our engine."""


def build(system: str, workload: str):
    env_id, gymenv_options, gym_options, workers, per_worker = WORKLOADS[workload]
    if system == "torchrl_parallel":
        from torchrl.envs import ParallelEnv as TorchRLParallelEnv

        return TorchRLParallelEnv(workers * per_worker, functools.partial(make_gymenv, env_id, gymenv_options))
    from tdcollect.envs import ParallelEnv

    make = {"ours_gym_make": functools.partial(make_gym, env_id, gym_options),
            "ours_gymenv": functools.partial(make_gymenv, env_id, gymenv_options),
            "ours_torchrl_road": functools.partial(make_torchrl_road, env_id, gymenv_options)}[system]
    env = ParallelEnv(workers, make, envs_per_worker=per_worker)
    expected = {"ours_gym_make": "its family", "ours_gymenv": "native", "ours_torchrl_road": "TorchRL's step"}[system]
    roads = env.roads()
    if not all(road.startswith(expected) for road in roads):
        env.close()
        raise RuntimeError(f"{system} on {workload} took the roads {roads}, not {expected!r}")
    return env


def timed(system: str, workload: str, steps: int, warmup: int, mode: str) -> float:
    """Env steps per second (``num_envs * steps / seconds``) of ``system`` on ``workload``."""
    env = build(system, workload)
    try:
        return steps_per_second(env, env.batch_size.numel(), steps, warmup, mode)
    finally:
        env.close()


def _timed_on(workload: str, steps: int, warmup: int, mode: str, system: str) -> float:
    return timed(system, workload, steps, warmup, mode)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--mode", choices=["rollout", "steps"], default="rollout")
    parser.add_argument("--json", type=Path, default=None, help="write the rates here")
    args = parser.parse_args(argv)
    rates = {workload: interleaved(args.systems, args.rounds,
                                   functools.partial(_timed_on, workload, args.steps, args.warmup, args.mode),
                                   label=f"{workload:12s} ")
             for workload in args.workloads}
    medians_ = {workload: medians(by_system) for workload, by_system in rates.items()}
    print(f"\nmedian env steps/s ({args.mode}, {args.rounds} rounds)")
    print(f"{'workload':12s} " + " ".join(f"{system:>18s}" for system in args.systems) + "  gymenv/gym.make")
    for workload, by_system in medians_.items():
        ratio = ""
        if "ours_gymenv" in by_system and "ours_gym_make" in by_system:
            ratio = f"  {by_system['ours_gym_make'] / by_system['ours_gymenv']:.2f}x slower"
        print(f"{workload:12s} " + " ".join(f"{by_system[s]:18.0f}" for s in args.systems) + ratio)
    out = {"rates": rates, "median": medians_, "steps": args.steps, "mode": args.mode, "rounds": args.rounds,
           "workloads": {name: WORKLOADS[name] for name in args.workloads}}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
