"""TorchRL's own training scripts with only their imports changed: frames/s with tdcollect's collectors and
ParallelEnv against TorchRL's classes, interleaved rounds in one run.

    python benchmarks/sota.py [--scripts sac impala ppo_atari] [--rounds 2] [--rl ../shared/torchrl-tests]

Each script folder of ``<rl>/sota-implementations`` is copied to a temporary folder; for "ours" every
``from torchrl.collectors import ...`` becomes ``from tdcollect.collectors import ...`` and, where a module imports
TorchRL's ``ParallelEnv``, ``from tdcollect.envs import ParallelEnv`` follows that import (nothing else
changes). The script then runs with hydra overrides that make it short (a few thousand frames, no logger, CPU)
and its wall time, start-up included, is measured. Needs ``pip install hydra-core "gymnasium[mujoco]" ale-py``.
Where torchvision is not installed (this project's machines have no CPU build of it), the Atari scripts' ``Resize``
runs on ``benchmarks/sota_standins/torchvision`` (bilinear resize through ``torch.nn.functional.interpolate``),
for ours and TorchRL's alike.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "sota_standins"
#: script -> (folder, file, frames it collects with the overrides, hydra overrides)
SCRIPTS = {
    "sac": ("sac", "sac.py", 3000, [
        "env.name=HalfCheetah-v4", "collector.total_frames=3000", "collector.init_random_frames=1000",
        "collector.frames_per_batch=500", "collector.env_per_collector=2", "collector.device=cpu",
        "network.device=cpu", "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000",
        "logger.backend=", "logger.eval_iter=1000000"]),
    "impala": ("impala", "impala_single_node.py", 2400, [
        "collector.num_workers=2", "collector.frames_per_batch=320", "collector.total_frames=9600", "device=cpu",
        "loss.batch_size=2", "logger.backend=", "logger.test_interval=1000000000"]),
    "ppo_atari": ("ppo", "ppo_atari.py", 2048, [
        "env.num_envs=2", "collector.frames_per_batch=2048", "collector.total_frames=8192", "optim.device=cpu",
        "loss.mini_batch_size=1024", "loss.ppo_epochs=1", "logger.backend=", "logger.test_interval=1000000000"]),
}


#: the ways a script runs: as shipped, with our classes, with our classes and the Atari transforms in our workers
IMPLS = ["ours", "torchrl", "ours_workers"]


def swap_imports(source: str) -> str:
    """The module's source with tdcollect's collectors and ParallelEnv in place of TorchRL's (imports only)."""
    source = source.replace("from torchrl.collectors import", "from tdcollect.collectors import")
    lines = source.splitlines(keepends=True)
    for node in sorted(ast.walk(ast.parse(source)), key=lambda n: -getattr(n, "end_lineno", 0)):
        if (isinstance(node, ast.ImportFrom) and node.module == "torchrl.envs"
                and any(alias.name == "ParallelEnv" for alias in node.names)):
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            lines.insert(node.end_lineno, f"{indent}from tdcollect.envs import ParallelEnv\n")
    return "".join(lines)


def move_transforms(source: str) -> str:
    """``utils_atari.make_parallel_env``'s source with the line a user adds to run its transforms in our workers
    (``env = move_transforms_to_workers(env)`` before it returns)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    function = next((node for node in ast.walk(tree)
                     if isinstance(node, ast.FunctionDef) and node.name == "make_parallel_env"), None)
    if function is None:
        return source
    returned = function.body[-1]
    indent = re.match(r"\s*", lines[returned.lineno - 1]).group(0)
    lines.insert(returned.lineno - 1, f"{indent}from tdcollect.envs import move_transforms_to_workers\n\n"
                                      f"{indent}env = move_transforms_to_workers(env)\n")
    return "".join(lines)


def prepare(rl: Path, script: str, impl: str, root: Path) -> Path:
    """A copy of the script's folder for ``impl``: ``torchrl`` (as shipped), ``ours`` (imports swapped) or
    ``ours_workers`` (imports swapped and the Atari transforms moved into the workers, see
    :func:`move_transforms`)."""
    folder, _, _, _ = SCRIPTS[script]
    target = root / f"{script}-{impl}"
    shutil.copytree(rl / "sota-implementations" / folder, target)
    if impl.startswith("ours"):
        for path in target.glob("*.py"):
            source = swap_imports(path.read_text())
            if impl == "ours_workers" and path.name == "utils_atari.py":
                source = move_transforms(source)
            path.write_text(source)
    return target


def run(target: Path, script: str) -> tuple[float, str]:
    _, file, _, overrides = SCRIPTS[script]
    env = dict(os.environ, WANDB_MODE="disabled", HYDRA_FULL_ERROR="1")
    if importlib.util.find_spec("torchvision") is None:
        env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, file, *overrides, f"hydra.run.dir={target / 'outputs'}"], cwd=target,
                          env=env, capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{target.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stderr[-500:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=sorted(SCRIPTS))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["ours", "torchrl"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rl", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "torchrl-tests")
    args = parser.parse_args(argv)
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = {(s, i): prepare(args.rl, s, i, Path(tmp)) for s in args.scripts for i in args.impls}
        for r in range(args.rounds):
            for script in args.scripts:
                for impl in args.impls if r % 2 == 0 else args.impls[::-1]:
                    seconds, _ = run(targets[script, impl], script)
                    results.setdefault((script, impl), []).append(seconds)
                    print(f"round {r + 1} {script:10s} {impl:8s} {seconds:7.1f} s", flush=True)
    print("\n| script | frames | " + " | ".join(f"{impl}: s (frames/s)" for impl in args.impls) + " |\n|---|---|"
          + "---|" * len(args.impls))
    for script in args.scripts:
        frames = SCRIPTS[script][2]
        cells = []
        for impl in args.impls:
            runs = results.get((script, impl))
            best = min(runs) if runs else None
            cells.append(f"{best:.1f} ({frames / best:,.0f})" if best else "-")
        print(f"| {script} | {frames} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
