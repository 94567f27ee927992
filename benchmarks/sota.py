"""TorchRL's own training scripts with only their imports changed: frames/s with tdcollect's collectors and
ParallelEnv against TorchRL's classes, interleaved rounds in one run.

    python benchmarks/sota.py [--scripts sac impala ppo_atari] [--rounds 2] [--rl ../shared/torchrl-tests]
    python -m benchmarks.sota --impls torchrl run --envs-as-shipped --table table.md   # the docs' table

``--impls`` picks the ways each script runs (``torchrl``: as shipped; ``run``: under ``tdcollect run``; ``ours``:
its imports edited, see below). ``--table`` writes the Markdown table: per script, the exit status each way, the
medians of wall time and collection frames/s, their ratios, whether every logged loss is finite and the layout
``tdcollect run`` chose (its stderr lines); a script that fails is run once and listed with the line that says why
(a run whose job failed and that then waits at exit for its collector workers is killed after 20 s).

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
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "sota_standins"
#: the short run of every trainer script (3,000 frames in batches of 500, a few optimization steps per batch, a
#: log line per batch)
TRAINER_SHORT = ["collector.total_frames=3000", "collector.frames_per_batch=500", "trainer.total_frames=3000",
                 "trainer.optim_steps_per_batch=5", "trainer.progress_bar=false", "trainer.log_interval=500"]
#: why a script's short config changes more than its length (shown under the table)
CONFIG_NOTES = {
    "crossq": "its config asks for the gym package; env.library=gymnasium (installed) for both runs",
    "discrete_sac": "its config asks for the gym package; env.library=gymnasium (installed) for both runs",
    "ppo_trainer": "as shipped its config fails (Key 'offline' not in 'CSVLoggerConfig': the CSV logger given "
                   "wandb's keys); logger=wandb, disabled, for both runs",
    "redq": "as shipped its prioritized buffer needs TorchRL's C++ segment trees, which its CPU wheel lacks here "
            "(SumSegmentTreeFp32 is not available); buffer.prb=0 for both runs",
    "td3_trainer": "as shipped its networks ask for the mps device (Apple's); networks on the CPU for both runs",
}
#: the scripts whose logger is configured in the config file (the trainers): no ``logger.backend=csv`` override
OWN_LOGGER = "_trainer"
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
        "optim.device=cpu", "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000",
        "logger.log_interval=1000000", "env.n_samples_stats=100"]),
    "iql_online": ("iql", "iql_online.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500", "collector.frames_per_batch=500",
        "optim.device=cpu", "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000",
        "logger.eval_iter=1000000", "env.n_samples_stats=100"]),
    "discrete_cql_online": ("cql", "discrete_cql_online.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500", "collector.frames_per_batch=500",
        "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000", "logger.eval_iter=1000000",
        "env.n_samples_stats=100"]),
    "discrete_iql": ("iql", "discrete_iql.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500", "collector.frames_per_batch=500",
        "optim.batch_size=64", "optim.utd_ratio=0.1", "replay_buffer.size=10000", "logger.eval_iter=1000000"]),
    "rnd_mujoco": ("rnd", "rnd_mujoco.py", [
        "collector.frames_per_batch=1000", "collector.total_frames=6000", "optim.device=cpu",
        "loss.mini_batch_size=250", "loss.ppo_epochs=2", "logger.test_interval=1000000000"]),
    "redq": ("redq", "redq.py", [
        "collector.total_frames=3000", "collector.init_random_frames=500",
        "collector.frames_per_batch=500", "optim.init_random_frames=500", "optim.steps_per_batch=5",
        "env.init_env_steps=100", "buffer.size=10000", "buffer.batch_size=64", "buffer.prb=0",
        "logger.record_interval=1000000"]),
    # TorchRL's hydra-configured trainers (their collectors and envs come from ``_target_`` configs)
    **{f"{name}_trainer": (f"{name}_trainer", "train.py", [*TRAINER_SHORT, *extra])
       for name, extra in {
           "a2c": [], "ppo": ["logger=wandb"], "reinforce": [],
           "sac": ["collector.init_random_frames=500"],
           "cql": ["collector.init_random_frames=500"], "ddpg": ["collector.init_random_frames=500"],
           "dqn": ["collector.init_random_frames=500"], "iql": ["collector.init_random_frames=500"],
           "td3": ["collector.init_random_frames=500", "networks.policy_network.device=cpu",
                   "networks.qvalue_network.device=cpu"],
       }.items()},
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


#: what hydra prints when the script's main raised (a script whose collector workers are still alive may then
#: wait for them at exit for ever: TorchRL's process collectors do, when a script stops before shutting them down)
HYDRA_FAILED = "Error executing job"


def _wait(process: subprocess.Popen, timeout: float, grace: float = 20.0) -> tuple[str, str]:
    """``(stderr, why it was killed or "")``: waits for ``process``; one still alive ``grace`` seconds after hydra
    said its job failed, or after ``timeout`` seconds, is killed with its process group (its children)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    start = time.perf_counter()
    failed_at = None
    while process.poll() is None:
        if failed_at is None and any(line.startswith(HYDRA_FAILED) for line in list(lines)):
            failed_at = time.perf_counter()
        now = time.perf_counter()
        too_long = now - start > timeout
        if too_long or (failed_at is not None and now - failed_at > grace):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            reader.join(5)
            why = (f"still running after {timeout:.0f} s: killed" if too_long
                   else f"its job failed and the process had not exited {grace:.0f} s later: killed")
            return "".join(lines), why
        time.sleep(0.2)
    reader.join(30)
    return "".join(lines), ""


def run(target: Path, script: str, impl: str, round_: int, envs_as_shipped: bool = False,
        timeout: float = 900.0) -> dict:
    """One run of ``script`` the ``impl`` way: ``{"exit": status, "seconds": wall time, "collect_s": time in the
    collector's next(), "frames": frames it gave, "scalars": {logged name: [values]}, "said": the runner's stderr
    lines}`` (a failed run: ``{"exit", "seconds", "why"}``, the last lines of its stderr)."""
    _, file, overrides = SCRIPTS[script]
    if envs_as_shipped:
        overrides = [item for item in overrides if not item.startswith(ENV_COUNTS)]
    if not script.endswith(OWN_LOGGER):
        overrides = [*overrides, "logger.backend=csv"]
    outputs = target / f"outputs-{round_}"
    probe = target / f"probe-{round_}"
    env = dict(os.environ, WANDB_MODE="disabled", HYDRA_FULL_ERROR="1", SOTA_PROBE=str(probe))
    paths = [str(PROBE)]
    if importlib.util.find_spec("torchvision") is None:
        paths.append(str(STANDINS))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, *LAUNCH.get(impl, []), file, *overrides,
                                f"hydra.run.dir={outputs}"], cwd=target, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr, hung = _wait(process, timeout)
    seconds = time.perf_counter() - start
    said = [line for line in stderr.splitlines() if line.startswith("tdcollect run:")]
    if process.returncode or hung:
        lines = [line for line in stderr.splitlines() if line.strip()] + [hung] * bool(hung)
        return {"exit": process.returncode or "hung", "seconds": seconds, "why": lines[-12:], "said": said}
    collected = json.loads(Path(f"{probe}.{process.pid}.json").read_text())  # the probe's file (sota_probe/)
    scalars = dict(collected.get("scalars", {}))
    for csv in sorted(outputs.rglob("*.csv")):  # the CSV logger's scalars/<group>/<name>.csv
        lines = [line for line in csv.read_text().splitlines() if line.strip()]
        scalars[f"{csv.parent.name}/{csv.stem}"] = [float(line.split(",")[-1]) for line in lines]
    return {"exit": 0, "seconds": seconds, "collect_s": collected["seconds"], "frames": collected["frames"],
            "scalars": scalars, "said": said, "cpu": collected.get("cpu"), "first_s": collected.get("first_s")}


def sane(scalars: dict) -> str:
    """How many loss values were logged and whether all are finite, and the training return's first and last
    logged values."""
    losses = [value for name, values in scalars.items() if "loss" in name for value in values]
    finite = "all finite" if all(math.isfinite(value) for value in losses) else "NOT ALL FINITE"
    rewards = scalars.get("train/reward", [])
    moved = f"{rewards[0]:.1f} -> {rewards[-1]:.1f}" if rewards else "no episode ended"
    return f"{len(losses)} losses, {finite}; return {moved}"


def why_of(failed: dict) -> str:
    """The line of a failed run's stderr that says why: the last one naming an error, else its last line."""
    named = [line for line in failed["why"] if "Error" in line or "killed" in line]
    return (named or failed["why"] or ["(no output)"])[-1].strip()


#: how the runner's lines that list the names it replaced begin (one per import that replaced some)
REPLACED_LINE = "tdcollect's classes in place of"


def layout_of(runs: list[dict]) -> str:
    """What the runner said it chose in ``runs`` (each run's stderr lines but those listing the names replaced),
    in a few words: the layout of each ParallelEnv, the calls it kept TorchRL's class for, the places
    that kept TorchRL's class."""
    lines = [line.removeprefix("tdcollect run: ") for one in runs for line in one.get("said", [])]
    chosen = [line for line in lines if not line.startswith(REPLACED_LINE)]
    return "; ".join(dict.fromkeys(chosen)) or "as the script builds them"


#: the scalars that measure time (frames/s, seconds): they differ run to run, and are not compared
TIMING_WORDS = ("time", "speed", "fps", "rate", "duration", "elapsed")
#: why a script's numbers under ``tdcollect run`` differ from its shipped ones, where they do (shown in the table)
SAME_NUMBERS_WHY = {
    "collector_set_seed": ("no †", "† `collector.set_seed()` after the Collector is built: TorchRL's first step of "
                                   "each env keeps the observation from before the seed (a step that never "
                                   "happened); under `tdcollect run` it is the seeded episode's own first "
                                   "observation. Every other value of the batches is TorchRL's"),
}
#: the scripts that seed their collector after building it (``collector.set_seed``, see SAME_NUMBERS_WHY); the
#: trainers do too (TorchRL's ``Trainer(seed=...)`` calls it; their configs set ``seed: 42``)
SEEDS_ITS_COLLECTOR = ("sac", "ddpg", "crossq", "discrete_sac", "cql_online", "iql_online", "discrete_cql_online",
                       "discrete_iql", "redq", *(name for name in SCRIPTS if name.endswith(OWN_LOGGER)))


def compared(scalars: dict) -> dict:
    """The logged scalars that do not measure time (see :data:`TIMING_WORDS`)."""
    return {name: values for name, values in scalars.items()
            if not any(word in part for part in name.lower().split("/") for word in TIMING_WORDS)}


def first_difference(one: dict, other: dict) -> str | None:
    """Where two runs' compared scalars first differ (``name[index]``), None when they are the same."""
    a, b = compared(one), compared(other)
    for name in sorted(set(a) | set(b)):
        values, others = a.get(name), b.get(name)
        if values is None or others is None:
            return f"{name} (logged by one run only)"
        if values != others:
            at = next((i for i, (x, y) in enumerate(zip(values, others)) if x != y), min(len(values), len(others)))
            return f"{name}[{at}]"
    return None


def same_numbers(script: str, results: dict) -> str:
    """The "same numbers as shipped" cell: whether every run under ``tdcollect run`` logged the numbers of the
    shipped runs, when the shipped runs agree with each other (deterministic); else why not."""
    shipped = [one for one in results.get((script, "torchrl"), []) if not one["exit"]]
    ours = [one for one in results.get((script, "run"), []) if not one["exit"]]
    if not shipped or not ours:
        return "-"
    if not compared(shipped[0]["scalars"]):
        return "nothing logged but timings"
    if len(shipped) > 1 and (where := first_difference(shipped[0]["scalars"], shipped[1]["scalars"])):
        return f"shipped runs differ from each other ({where}): not deterministic"
    differences = [where for one in ours if (where := first_difference(shipped[0]["scalars"], one["scalars"]))]
    if not differences:
        return f"yes ({sum(len(v) for v in compared(shipped[0]['scalars']).values())} values)"
    why = SAME_NUMBERS_WHY["collector_set_seed"][0] if script in SEEDS_ITS_COLLECTOR else "no"
    return f"{why} (first at {differences[0]})"


def table(results: dict, scripts: list[str], impls: list[str]) -> list[str]:
    """The Markdown table of ``results`` (``{(script, impl): [runs]}``): per script, exit statuses, median wall
    time and collection frames/s per way, the ratios of ``run`` to ``torchrl`` (as shipped), the layout
    ``tdcollect run`` chose, and whether every logged loss is finite."""
    head = ["script"] + [f"{impl}: exit, wall s, frames/s" for impl in impls]
    if {"torchrl", "run"} <= set(impls):
        head += ["wall as shipped / under run", "collection run / as shipped"]
    head += ["losses", "layout under run"]
    if {"torchrl", "run"} <= set(impls):
        head += ["same numbers as shipped"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for script in scripts:
        cells, medians, losses = [script], {}, []
        for impl in impls:
            runs = results.get((script, impl), [])
            failed = [one for one in runs if one["exit"]]
            if not runs:
                cells.append("-")
                continue
            if failed:
                cells.append(f"exit {failed[0]['exit']}")
                continue
            wall = statistics.median(one["seconds"] for one in runs)
            rate = statistics.median(one["frames"] / one["collect_s"] for one in runs)
            medians[impl] = (wall, rate)
            losses += [value for one in runs for name, values in one["scalars"].items() if "loss" in name
                       for value in values]
            cells.append(f"0, {wall:.1f}, {rate:,.0f}")
        if {"torchrl", "run"} <= set(impls):
            if {"torchrl", "run"} <= set(medians):
                cells += [f"{medians['torchrl'][0] / medians['run'][0]:.2f}",
                          f"{medians['run'][1] / medians['torchrl'][1]:.2f}"]
            else:
                cells += ["-", "-"]
        finite = ("none logged" if not losses else
                  f"{len(losses)}, all finite" if all(math.isfinite(v) for v in losses) else "NOT ALL FINITE")
        runs = results.get((script, "run"), [])
        cells += [finite, layout_of(runs) if runs else "-"]
        if {"torchrl", "run"} <= set(impls):
            cells.append(same_numbers(script, results))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- `{script}`: {CONFIG_NOTES[script]}" for script in scripts if script in CONFIG_NOTES]
    if any("†" in line for line in lines):
        notes.append(f"- {SAME_NUMBERS_WHY['collector_set_seed'][1]}")
    fails = [f"- `{script}` {impl}: exit {one['exit']}: `{why_of(one)[:240]}`"
             for (script, impl), runs in results.items() for one in runs[:1] if one["exit"]]
    return lines + ([""] + notes if notes else []) + ([""] + fails if fails else [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=sorted(SCRIPTS))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["ours", "torchrl"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rl", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "torchrl-tests")
    parser.add_argument("--json", type=Path, default=None, help="write every run's numbers there")
    parser.add_argument("--table", type=Path, default=None, help="write the Markdown table there")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take before it is killed")
    parser.add_argument("--envs-as-shipped", action="store_true",
                        help="the scripts' own env counts (8 for SAC and PPO-Atari), not the short config's 2")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="no runs: the table of the runs a --json file holds (its scripts and ways)")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        results = {tuple(key.split("/")): runs for key, runs in saved.items()}
        scripts = list(dict.fromkeys(script for script, _ in results))
        impls = list(dict.fromkeys(impl for _, impl in results))
        lines = table(results, scripts, impls)
        print("\n".join(lines))
        if args.table:
            args.table.write_text("\n".join(lines) + "\n")
        return 0
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = {(s, i): prepare(args.rl, s, i, Path(tmp)) for s in args.scripts for i in args.impls}
        for r in range(args.rounds):
            for script in args.scripts:
                for impl in args.impls if r % 2 == 0 else args.impls[::-1]:
                    if any(one["exit"] for one in results.get((script, impl), [])):
                        continue  # (it failed once: not run again)
                    one = run(targets[script, impl], script, impl, r, args.envs_as_shipped, args.timeout)
                    results.setdefault((script, impl), []).append(one)
                    if one["exit"]:
                        print(f"round {r + 1} {script:18s} {impl:12s} exit {one['exit']}: {why_of(one)[:200]}",
                              flush=True)
                        continue
                    print(f"round {r + 1} {script:18s} {impl:12s} {one['seconds']:7.1f} s, collection "
                          f"{one['frames'] / one['collect_s']:8,.0f} frames/s; {sane(one['scalars'])}", flush=True)
                if args.json:  # (after each script: a long run that stops keeps what it measured)
                    args.json.write_text(json.dumps({f"{s}/{i}": runs for (s, i), runs in results.items()},
                                                    indent=1))
    lines = table(results, args.scripts, args.impls)
    print("\n" + "\n".join(lines))
    if args.table:
        args.table.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
