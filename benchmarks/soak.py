"""A soak: a training-shaped loop on pixel envs for minutes or hours, with this process tree's resources sampled once a
second, to show that nothing grows.

    python -m benchmarks.soak --minutes 60                        # the hour, plot and CSV in benchmarks/results/
    python -m benchmarks.soak --minutes 2 --check                 # CI: exits 1 unless every line is flat

The loop: a ``MultiSyncCollector`` over 84x84x3 frame envs (2 workers x 2 envs) with a small convolutional policy
and ``max_restarts``, its policy's weights updated after every batch; a worker SIGKILLed now and then
(``--kill-every`` seconds); between batches, now and then (``--eval-every`` seconds), an evaluation env built,
rolled out and closed (a ``ParallelEnv``, then a ``SerialEnv``, then a gymnasium ``ParallelVectorEnv``, in turn).

Sampled each second into a CSV (``--csv``) and a PNG (``--png``): the main process's resident memory (RSS) and the
sum of its workers', its open files, the shared memory it maps (memfd files and ``/dev/shm`` segments), the system's
``Shmem`` (``/proc/meminfo``; other programs move it too), its child processes, and the batches, kills and restarts.

**Flat** (``--check``): each kind of eval env is used once before sampling starts; after the first quarter of the
samples (warm-up: the first kill and restart, first pages of memory, the allocator's pools), the
main process's RSS stays within 5 % of its warm-up level, and open files, mapped shared memory and child processes
end no higher than their highest level during the warm-up (plus 2 files); the run must have made batches, kills
and restarts.
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import torch
from gymnasium import spaces
from tensordict.nn import TensorDictModule
from torch import nn

from tests.cycles import open_files, shared_bytes

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ["t_s", "rss_mb", "workers_rss_mb", "open_files", "shared_mb", "system_shmem_mb", "children", "batches",
           "kills", "restarts", "evals"]
FRAME = (84, 84, 3)


class Frames(gym.Env):
    """An 84x84x3 uint8 frame env that counts: each frame is filled with ``(step * 10 + action) % 256``; episodes
    last 50 steps."""

    observation_space = spaces.Box(0, 255, FRAME, np.uint8)
    action_space = spaces.Discrete(4)

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(FRAME, np.uint8), {}

    def step(self, action):
        self.t += 1
        frame = np.full(FRAME, (self.t * 10 + int(action)) % 256, np.uint8)
        return frame, 1.0, self.t >= 50, False, {}


def two_frame_envs():
    """One collector worker's envs: a SerialEnv of two :class:`Frames`."""
    from tdcollect.envs import SerialEnv

    return SerialEnv(2, Frames)


class ConvPolicy(nn.Module):
    """frames ``[..., 84, 84, 3]`` uint8 -> logits over 4 actions: two strided convolutions and a linear layer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 8, stride=4), nn.ReLU(), nn.Conv2d(8, 16, 4, stride=2), nn.ReLU())
        self.head = nn.Linear(16 * 9 * 9, 4)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[:-3]
        x = frames.reshape(-1, *FRAME).permute(0, 3, 1, 2).float() / 255
        logits = self.head(self.conv(x).flatten(1))
        return logits.argmax(-1).reshape(lead)


def system_shmem_mb() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Sampler(threading.Thread):
    """Samples the process tree once a second into ``rows`` (see :data:`COLUMNS`)."""

    def __init__(self, counters: dict):
        super().__init__(daemon=True)
        self.counters = counters
        self.rows: list[dict] = []
        self.stopped = threading.Event()
        self.began = time.perf_counter()
        self.me = psutil.Process()

    def sample(self) -> dict:
        kids = []
        workers_rss = 0.0
        for child in self.me.children(recursive=True):
            try:
                if "resource_tracker" in " ".join(child.cmdline()):
                    continue
                workers_rss += child.memory_info().rss / 2**20
                kids.append(child)
            except psutil.Error:
                continue
        return {"t_s": round(time.perf_counter() - self.began, 2), "rss_mb": self.me.memory_info().rss / 2**20,
                "workers_rss_mb": workers_rss, "open_files": open_files(),
                "shared_mb": shared_bytes() / 2**20, "system_shmem_mb": system_shmem_mb(), "children": len(kids),
                **self.counters}

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            self.rows.append(self.sample())


def evaluation_env(turn: int) -> None:
    """Build, use and close one evaluation env (three kinds in turn)."""
    from tdcollect.envs import ParallelEnv, SerialEnv
    from tdcollect.envs.vector import ParallelVectorEnv

    if turn % 3 == 0:
        with ParallelEnv(2, Frames, envs_per_worker=2) as env:
            env.rollout(60, break_when_any_done=False)
    elif turn % 3 == 1:
        with SerialEnv(2, Frames) as env:
            env.rollout(30, break_when_any_done=False)
    else:
        env = ParallelVectorEnv([Frames] * 4, envs_per_worker=2)
        env.reset(seed=turn)
        for _ in range(30):
            env.step(env.action_space.sample())
        env.close()


def soak(minutes: float, kill_every: float, eval_every: float) -> list[dict]:
    from tdcollect.collectors import MultiSyncCollector

    counters = {"batches": 0, "kills": 0, "restarts": 0, "evals": 0}
    for kind in range(3):  # each kind of eval env once before sampling: what they import stays loaded
        evaluation_env(kind)
    policy = TensorDictModule(ConvPolicy(), in_keys=["observation"], out_keys=["action"])
    collector = MultiSyncCollector([two_frame_envs] * 2, policy, frames_per_batch=64, total_frames=-1,
                                   max_restarts=10**6)
    sampler = Sampler(counters)
    sampler.start()
    deadline = time.perf_counter() + minutes * 60
    next_kill = time.perf_counter() + kill_every
    next_eval = time.perf_counter() + eval_every
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-4)
    try:
        for batch in collector:
            counters["batches"] += 1
            loss = policy.module.head.weight.square().mean() + batch["next", "reward"].float().mean() * 0
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            collector.update_policy_weights_()
            now = time.perf_counter()
            if now >= next_kill:
                pids = collector.worker_pids
                if pids:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    counters["kills"] += 1
                next_kill = now + kill_every
            if now >= next_eval:
                evaluation_env(counters["evals"])
                counters["evals"] += 1
                next_eval = time.perf_counter() + eval_every
            counters["restarts"] = sum(collector.restarts)
            if time.perf_counter() >= deadline:
                break
    finally:
        collector.shutdown()
        time.sleep(1.5)  # a last sample or two after the shutdown
        sampler.stopped.set()
        sampler.join()
    return sampler.rows


def flat(rows: list[dict]) -> list[str]:
    """What is not flat (module docstring); empty when everything is."""
    quarter = max(1, len(rows) // 4)
    warm, rest = rows[:quarter], rows[quarter:]
    if not rest:
        return ["too short a run to judge"]
    problems = []
    level = float(np.median([r["rss_mb"] for r in warm[len(warm) // 2:]]))
    top = max(r["rss_mb"] for r in rest)
    if top > level * 1.05:
        problems.append(f"main RSS grew past 5 %: {level:.0f} MB after warm-up, {top:.0f} MB later")
    end = rest[-min(5, len(rest)):]
    for key, slack in (("open_files", 2), ("shared_mb", 1.0), ("children", 0)):
        ceiling = max(r[key] for r in warm) + slack
        last = min(r[key] for r in end)
        if last > ceiling:
            problems.append(f"{key} grew: at most {ceiling} during warm-up, {last} at the end")
    final = rows[-1]
    for key in ("batches", "kills", "restarts"):
        if not final[key]:
            problems.append(f"no {key}: the loop did not do what a soak must")
    return problems


def write(rows: list[dict], csv_path: Path, png_path: Path | None) -> None:
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    if png_path is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    panels = [("memory (MB)", [("rss_mb", "main RSS"), ("workers_rss_mb", "workers' RSS")]),
              ("shared memory (MB)", [("shared_mb", "mapped by main"), ("system_shmem_mb", "system Shmem")]),
              ("count", [("open_files", "open files"), ("children", "child processes")]),
              ("batches", [("batches", "batches")]),
              ("events", [("kills", "workers killed"), ("restarts", "workers restarted"),
                          ("evals", "eval envs built and closed")])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 12), sharex=True)
    for ax, (title, series) in zip(axes, panels):
        for key, label in series:
            ax.plot(t, [r[key] for r in rows], label=label)
        ax.set_ylabel(title)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes")
    fig.suptitle(f"tdcollect soak: MultiSyncCollector 2x2 on 84x84x3 frames, {t[-1]:.0f} min")
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between worker kills")
    parser.add_argument("--eval-every", type=float, default=10.0, help="seconds between evaluation envs")
    parser.add_argument("--csv", type=Path, default=None, help="default: benchmarks/results/soak_<minutes>min.csv")
    parser.add_argument("--png", type=Path, default=None, help="default: beside the CSV; 'none' for no plot")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every line is flat")
    args = parser.parse_args(argv)
    csv_path = args.csv or RESULTS / f"soak_{args.minutes:g}min.csv"
    png_path = None if str(args.png) == "none" else (args.png or csv_path.with_suffix(".png"))
    rows = soak(args.minutes, args.kill_every, args.eval_every)
    write(rows, csv_path, png_path)
    problems = flat(rows)
    final = rows[-1] if rows else {}
    print(f"{len(rows)} samples, {final.get('batches', 0)} batches, {final.get('kills', 0)} kills, "
          f"{final.get('restarts', 0)} restarts, {final.get('evals', 0)} eval envs; CSV {csv_path}"
          + (f", plot {png_path}" if png_path else ""))
    for problem in problems:
        print("NOT FLAT:", problem)
    if not problems:
        print("flat: RSS within 5 %, no growth in files, shared memory or processes")
    return 1 if (problems and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
