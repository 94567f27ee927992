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
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "sota_standins"
#: script -> (folder, file, hydra overrides); every run also logs with TorchRL's CSV logger (see :func:`run`)
SCRIPTS = {
    "sac": ("sac", "sac.py", [
        "env.name=HalfCheetah-v4", "collector.total_frames=3000", "collector.init_random_frames=1000",
        "collector.frames_per_batch=500", "collector.env_per_collector=2", "collector.device=cpu",
        "network.device=cpu", "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000",
        "env.max_episode_steps=100", "logger.eval_iter=1000000"]),
    "impala": ("impala", "impala_single_node.py", [
        "collector.num_workers=2", "collector.frames_per_batch=320", "collector.total_frames=9600", "device=cpu",
        "loss.batch_size=2", "logger.test_interval=1000000000"]),
    "ppo_mujoco": ("ppo", "ppo_mujoco.py", [
        "collector.frames_per_batch=1000", "collector.total_frames=6000", "optim.device=cpu",
        "loss.mini_batch_size=250", "loss.ppo_epochs=2", "logger.test_interval=1000000000"]),
    # the scripts with one env per collector (the one-env Collector road), short configs
    "ddpg": ("ddpg", "ddpg.py", [
        "collector.total_frames=3000", "collector.init_random_frames=1000", "collector.frames_per_batch=500",
        "collector.init_env_steps=100", "collector.device=cpu", "optim.device=cpu", "optim.batch_size=64",
        "optim.utd_ratio=0.1", "replay_buffer.size=10000", "env.max_episode_steps=100", "logger.eval_iter=1000000"]),
    "crossq": ("crossq", "crossq.py", [  # (its config asks for the gym package: gymnasium is what is installed)
        "env.library=gymnasium", "collector.total_frames=3000", "collector.init_random_frames=1000",
        "collector.frames_per_batch=500",
        "collector.init_env_steps=100", "collector.device=cpu", "network.device=cpu", "optim.batch_size=64",
        "optim.utd_ratio=0.1", "replay_buffer.size=10000", "env.max_episode_steps=100", "logger.eval_iter=1000000"]),
    "discrete_sac": ("discrete_sac", "discrete_sac.py", [
        "env.library=gymnasium", "collector.total_frames=3000", "collector.init_random_frames=500",
        "collector.frames_per_batch=500",
        "collector.init_env_steps=100", "collector.device=cpu", "network.device=cpu", "optim.batch_size=64",
        "optim.utd_ratio=0.1", "replay_buffer.size=10000", "logger.eval_iter=1000000"]),
    "cql_online": ("cql", "cql_online.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500", "collector.frames_per_batch=500",
        "optim.device=cpu", "optim.batch_size=64", "optim.optim_steps_per_batch=2", "replay_buffer.size=10000",
        "logger.log_interval=1000000", "env.n_samples_stats=100"]),
    "iql_online": ("iql", "iql_online.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500", "collector.frames_per_batch=500",
        "optim.device=cpu", "optim.batch_size=64", "replay_buffer.size=10000", "logger.eval_iter=1000000",
        "env.n_samples_stats=100"]),
    "rnd_mujoco": ("rnd", "rnd_mujoco.py", [
        "collector.frames_per_batch=1000", "collector.total_frames=6000", "optim.device=cpu",
        "loss.mini_batch_size=250", "loss.ppo_epochs=2", "logger.test_interval=1000000000"]),
    "ppo_atari": ("ppo", "ppo_atari.py", [
        "env.num_envs=2", "collector.frames_per_batch=2048", "collector.total_frames=8192", "optim.device=cpu",
        "loss.mini_batch_size=1024", "loss.ppo_epochs=1", "logger.test_interval=1000000000"]),
}


#: the overrides that set how many envs a script asks for (``--envs-as-shipped`` drops them: the script's own count)
ENV_COUNTS = ("env.num_envs=", "collector.env_per_collector=")
#: the ways a script runs: as shipped, with our classes, with our classes and the Atari transforms in our workers,
#: and the shipped script under ``tdcollect run`` (its default layout, and the layout the script asks for)
IMPLS = ["ours", "torchrl", "ours_workers", "run", "run_asked"]
#: the command line that runs a script file, per way (``python FILE`` unless listed)
LAUNCH = {"run": ["-m", "tdcollect", "run"], "run_asked": ["-m", "tdcollect", "run", "--layout", "asked"]}


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
    folder, _, _ = SCRIPTS[script]
    target = root / f"{script}-{impl}"
    shutil.copytree(rl / "sota-implementations" / folder, target)
    if impl.startswith("ours"):
        for path in target.glob("*.py"):
            source = swap_imports(path.read_text())
            if impl == "ours_workers" and path.name == "utils_atari.py":
                source = move_transforms(source)
            path.write_text(source)
    return target


PROBE = Path(__file__).resolve().parent / "sota_probe"


def run(target: Path, script: str, impl: str, round_: int, envs_as_shipped: bool = False) -> dict:
    """One run of ``script`` the ``impl`` way: ``{"seconds": wall time, "collect_s": time in the collector's
    next(), "frames": frames it gave, "scalars": {logged name: [values]}}`` (the CSV logger's)."""
    _, file, overrides = SCRIPTS[script]
    if envs_as_shipped:
        overrides = [item for item in overrides if not item.startswith(ENV_COUNTS)]
    outputs = target / f"outputs-{round_}"
    probe = target / f"probe-{round_}"
    env = dict(os.environ, WANDB_MODE="disabled", HYDRA_FULL_ERROR="1", SOTA_PROBE=str(probe))
    paths = [str(PROBE)]
    if importlib.util.find_spec("torchvision") is None:
        paths.append(str(STANDINS))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, *LAUNCH.get(impl, []), file, *overrides, "logger.backend=csv",
                                f"hydra.run.dir={outputs}"], cwd=target, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    _, stderr = process.communicate(timeout=1200)
    seconds = time.perf_counter() - start
    if process.returncode:
        raise RuntimeError(f"{target.name} failed (exit {process.returncode}):\n{stderr[-3000:]}")
    collected = json.loads(Path(f"{probe}.{process.pid}.json").read_text())  # the probe's file (sota_probe/)
    scalars = {}
    for csv in sorted(outputs.rglob("*.csv")):  # the CSV logger's scalars/<group>/<name>.csv
        lines = [line for line in csv.read_text().splitlines() if line.strip()]
        scalars[f"{csv.parent.name}/{csv.stem}"] = [float(line.split(",")[-1]) for line in lines]
    return {"seconds": seconds, "collect_s": collected["seconds"], "frames": collected["frames"],
            "scalars": scalars}


def sane(scalars: dict) -> str:
    """How many loss values were logged and whether all are finite, and the training return's first and last
    logged values."""
    losses = [value for name, values in scalars.items() if "loss" in name for value in values]
    finite = "all finite" if all(math.isfinite(value) for value in losses) else "NOT ALL FINITE"
    rewards = scalars.get("train/reward", [])
    moved = f"{rewards[0]:.1f} -> {rewards[-1]:.1f}" if rewards else "no episode ended"
    return f"{len(losses)} losses, {finite}; return {moved}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=sorted(SCRIPTS))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["ours", "torchrl"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rl", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "torchrl-tests")
    parser.add_argument("--json", type=Path, default=None, help="write every run's numbers there")
    parser.add_argument("--envs-as-shipped", action="store_true",
                        help="the scripts' own env counts (8 for SAC and PPO-Atari), not the short config's 2")
    args = parser.parse_args(argv)
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = {(s, i): prepare(args.rl, s, i, Path(tmp)) for s in args.scripts for i in args.impls}
        for r in range(args.rounds):
            for script in args.scripts:
                for impl in args.impls if r % 2 == 0 else args.impls[::-1]:
                    one = run(targets[script, impl], script, impl, r, args.envs_as_shipped)
                    results.setdefault((script, impl), []).append(one)
                    print(f"round {r + 1} {script:10s} {impl:12s} {one['seconds']:7.1f} s, collection "
                          f"{one['frames'] / one['collect_s']:8,.0f} frames/s; {sane(one['scalars'])}", flush=True)
    print("\n| script | " + " | ".join(f"{impl}: wall s / collection frames/s" for impl in args.impls)
          + " |\n|---|" + "---|" * len(args.impls))
    for script in args.scripts:
        cells = []
        for impl in args.impls:
            runs = results.get((script, impl), [])
            if not runs:
                cells.append("-")
                continue
            wall = statistics.median(one["seconds"] for one in runs)
            rate = statistics.median(one["frames"] / one["collect_s"] for one in runs)
            cells.append(f"{wall:.1f} / {rate:,.0f}")
        print(f"| {script} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({f"{s}/{i}": runs for (s, i), runs in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
