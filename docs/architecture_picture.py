"""Draws ``docs/_static/architecture.png``: the layers of ``tdcollect.envs`` and one step's route through them.

    python docs/architecture_picture.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "_static" / "architecture.png"

LAYERS = [  # (y, label, modules, colour)
    (6.4, "faces", "collectors/ (Collector, MultiSyncCollector, ...)   envs/vector/ (gymnasium, SB3)", "#dbe9f6"),
    (4.8, "TorchRL face: envs/", "BatchedEnv  SerialEnv  ParallelEnv  AsyncParallelEnv  inputs  rollout  view",
     "#d9f2e3"),
    (3.2, "engine: envs/engine/", "pool  protocol  worker  group  shared  recycle  stepper (Stepper, Family)",
     "#fde9d4"),
    (1.6, "families: envs/libs/", "gym   envbase   dm_env   dmlab2d   meltingpot   pettingzoo", "#efe1f5"),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 6.4))
    ax.set_xlim(0, 11)
    ax.set_ylim(1.0, 7.0)
    ax.axis("off")
    for y, label, modules, colour in LAYERS:
        ax.add_patch(FancyBboxPatch((0.2, y - 0.4), 9.6, 0.8, boxstyle="round,pad=0.02", fc=colour, ec="#555"))
        ax.text(0.4, y + 0.18, label, fontsize=11, weight="bold", va="center")
        ax.text(0.4, y - 0.2, modules, fontsize=9, va="center", family="monospace")
    route = [
        (6.4, 4.8, "step_and_maybe_reset(td): actions checked,\ncopied into the shared action buffer"),
        (4.8, 3.2, "WorkerPool.run: wake each worker,\nwait for each (semaphores, bounded polling)"),
        (3.2, 1.6, "in each worker: EnvGroup.step -> each env's\nstepper writes its rows of the shared buffers"),
    ]
    for top, bottom, text in route:
        ax.add_patch(FancyArrowPatch((8.7, top - 0.4), (8.7, bottom + 0.4), arrowstyle="-|>", mutation_scale=14,
                                     color="#c0392b", lw=1.6))
        ax.text(8.55, (top + bottom) / 2, text, fontsize=8, ha="right", va="center", color="#c0392b")
    ax.add_patch(FancyArrowPatch((10.1, 1.6), (10.1, 6.4), arrowstyle="-|>", mutation_scale=14, color="#2471a3",
                                 lw=1.6))
    ax.text(10.25, 4.0, "outputs built from the shared\nbuffers: no pickling per step", fontsize=8, rotation=90,
            va="center", color="#2471a3")
    ax.set_title("tdcollect: the layers, and one step's route", fontsize=12)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
