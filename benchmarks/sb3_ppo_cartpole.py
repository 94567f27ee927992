"""Time-to-solve of Stable-Baselines3 PPO on CartPole-v1 (end-to-end anchor).

Hyper-parameters follow the RL-Zoo CartPole-v1 PPO entry: 8 envs,
``n_steps=32``, ``batch_size=256``, ``gae_lambda=0.8``, ``gamma=0.98``,
``n_epochs=20``, ``ent_coef=0.0``, learning rate linear from 1e-3 to 0 and
clip range 0.2, default ``MlpPolicy`` on CPU.  The learning rate decays
over the whole frame cap (:data:`MAX_FRAMES`), whereas RL-Zoo decays it
over its 1e5-frame budget.

"Solved" means the mean return of the last 20 finished episodes (read
from the ``Monitor`` wrapper's ``info["episode"]``) reached 450.  The clock
starts before the vec-env is built, so process start-up counts.

Usage::

    python -m benchmarks.sb3_ppo_cartpole [--seeds 0 1] [--vec-envs DummyVecEnv]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import numpy as np

MAX_FRAMES = 200_000
SOLVE_RETURN = 450.0
SOLVE_WINDOW = 20
N_ENVS = 8
VEC_ENV_CLASSES = ("DummyVecEnv", "SubprocVecEnv")


def _solve_callback_cls():
    from stable_baselines3.common.callbacks import BaseCallback

    class SolveCallback(BaseCallback):
        """Stops training once the recent mean episode return is high enough."""

        def __init__(self, threshold: float, window: int):
            super().__init__()
            self.threshold = threshold
            self.returns = deque(maxlen=window)
            self.solved_at: int | None = None
            self.episodes = 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                episode = info.get("episode")
                if episode is not None:
                    self.returns.append(float(episode["r"]))
                    self.episodes += 1
            full = len(self.returns) == self.returns.maxlen
            if full and np.mean(self.returns) >= self.threshold:
                self.solved_at = self.num_timesteps
                return False
            return True

    return SolveCallback


def solve_time_sb3(vec_env_cls_name: str, seed: int,
                   torch_threads: int | None = None) -> dict:
    """Train PPO until solved (or :data:`MAX_FRAMES`); time it end to end.

    Args:
        vec_env_cls_name: ``"DummyVecEnv"`` or ``"SubprocVecEnv"`` (fork).
        seed: seed for the envs and the PPO model.
        torch_threads: if given, ``torch.set_num_threads`` for the run (the
            previous value is restored afterwards).  On a 2-core machine
            with other busy processes, torch's default 2 threads can make
            the small PPO updates several times slower than 1 thread.

    Returns:
        ``{"seconds", "frames", "solved", "vec_env", "seed", "episodes"}``
        (``episodes``: finished episodes seen);
        ``frames`` is the env-step count at solve (or at the cap).
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.utils import LinearSchedule
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    classes = {"DummyVecEnv": DummyVecEnv, "SubprocVecEnv": SubprocVecEnv}
    if vec_env_cls_name not in classes:
        raise ValueError(f"vec_env_cls_name must be one of {VEC_ENV_CLASSES}")
    vec_kwargs = ({"start_method": "fork"}
                  if vec_env_cls_name == "SubprocVecEnv" else None)
    callback = _solve_callback_cls()(SOLVE_RETURN, SOLVE_WINDOW)

    import torch

    previous_threads = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=seed,
                       vec_env_cls=classes[vec_env_cls_name],
                       vec_env_kwargs=vec_kwargs)
    try:
        model = PPO(
            "MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8,
            gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=LinearSchedule(1e-3, 0.0, 1.0), clip_range=0.2,
            device="cpu", seed=seed, verbose=0,
        )
        model.learn(total_timesteps=MAX_FRAMES, callback=callback)
        seconds = time.perf_counter() - start
        frames = callback.solved_at or model.num_timesteps
    finally:
        env.close()
        torch.set_num_threads(previous_threads)
    return {"vec_env": vec_env_cls_name, "seed": seed, "seconds": seconds,
            "torch_threads": torch_threads or previous_threads,
            "frames": int(frames), "solved": callback.solved_at is not None,
            "episodes": callback.episodes}


def write_json(path: str | None, results: list[dict]) -> None:
    """Write ``results`` to ``path`` (nothing when ``path`` is None): the ``--json`` option of the PPO CLIs."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def main(argv=None) -> int:
    """CLI: run every (vec-env class, seed) pair and print the results."""
    p = argparse.ArgumentParser(description="SB3 PPO CartPole time to solve")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--vec-envs", nargs="+", choices=VEC_ENV_CLASSES,
                   default=list(VEC_ENV_CLASSES))
    p.add_argument("--torch-threads", type=int,
                   help="torch intra-op threads (default: torch's default)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    results = []
    for name in args.vec_envs:
        for seed in args.seeds:
            r = solve_time_sb3(name, seed, args.torch_threads)
            results.append(r)
            print(f"{name:14s} seed={seed} threads={r['torch_threads']} "
                  f"solved={r['solved']!s:5s} "
                  f"{r['seconds']:6.2f} s  {r['frames']:7d} frames", flush=True)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
