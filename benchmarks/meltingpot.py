"""MeltingPot: frames/s and time to first batch, ours (native factory and TorchRL's wrapper) against a serial loop
and TorchRL's ParallelEnv, on one substrate (default ``commons_harvest__open``, 7 players).

Frames/s: random actions, ``--steps`` steps of every env after a warm-up, the rows interleaved within each of
``--rounds`` rounds (one process); batched envs run the public loop ``step_and_maybe_reset(rand_action(td))``, and
every row goes on from where its last round stopped (resets only when an episode ends). Rows:

- ``serial loop``: ``--workers`` raw substrates stepped one after the other in a Python loop (numpy actions, no
  tensors: the floor of any env API's cost);
- ``TorchRL SerialEnv + MeltingpotEnv``: the same envs as tensordicts, in this process;
- ``TorchRL ParallelEnv + MeltingpotEnv``: ``torchrl.envs.ParallelEnv(n, lambda: MeltingpotEnv(name))``;
- ``ours, native factory``: ``ParallelEnv(n, lambda: substrate.build(name, roles=...))``;
- ``ours, TorchRL's MeltingpotEnv``: ``ParallelEnv(n, lambda: MeltingpotEnv(name))``.

A frame is one env step (all players). Time to first batch: a fresh Python process per row, from the process's
creation (imports included) to its first step returned (reset included), for the same rows and for ours under each
start method with 2 and 4 workers, with the main process importing MeltingPot first (``from meltingpot import
substrate`` at the top, as a user's script does) or leaving it to the constructor.

    python -m benchmarks.meltingpot [--substrate commons_harvest__open] [--workers 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np


def native_factory(name: str):
    def make():
        from meltingpot import substrate

        return substrate.build(name, roles=substrate.get_config(name).default_player_roles)

    return make


def wrapper_factory(name: str):
    def make():
        from torchrl.envs.libs.meltingpot import MeltingpotEnv

        return MeltingpotEnv(name)

    return make


def build(row: str, name: str, workers: int, method: str | None = None):
    """The env of one row (a list of raw substrates for the serial loop)."""
    if row == "serial":
        return [native_factory(name)() for _ in range(workers)]
    if row == "torchrl":
        from torchrl.envs import ParallelEnv as TorchRLParallelEnv

        return TorchRLParallelEnv(workers, wrapper_factory(name))
    if row == "torchrl_serial":
        from torchrl.envs import SerialEnv as TorchRLSerialEnv

        return TorchRLSerialEnv(workers, wrapper_factory(name))
    from tdcollect.envs import ParallelEnv

    factory = native_factory(name) if row == "native" else wrapper_factory(name)
    return ParallelEnv(workers, factory, mp_start_method=method)


def run_steps(row: str, env, steps: int, state: dict) -> int:
    """Step ``env`` ``steps`` times with random actions, going on from where the last call stopped (``state``:
    this row's carry-over; a reset costs about 0.3 s per substrate, once at the first call and then only when an
    episode ends); the frames stepped."""
    if row == "serial":
        rng = np.random.default_rng(len(state))
        if not state:
            for substrate in env:
                substrate.reset()
            state["started"] = True
        n_actions, players = env[0].action_spec()[0].num_values, len(env[0].action_spec())
        for _ in range(steps):
            for substrate in env:
                if substrate.step(list(rng.integers(0, n_actions, players))).last():
                    substrate.reset()
        return steps * len(env)
    td = state["td"] if "td" in state else env.reset()
    for _ in range(steps):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    state["td"] = td
    return steps * env.batch_size.numel()


def close(row: str, env) -> None:
    for e in env if row == "serial" else [env]:
        e.close()


ROWS = {"serial": "serial loop", "torchrl_serial": "TorchRL SerialEnv + MeltingpotEnv",
        "torchrl": "TorchRL ParallelEnv + MeltingpotEnv",
        "native": "ours, native factory", "wrapper": "ours, TorchRL's MeltingpotEnv"}


def throughput(name: str, workers: int, steps: int, rounds: int) -> dict[str, list[float]]:
    envs = {row: build(row, name, workers) for row in ROWS}
    states: dict[str, dict] = {row: {} for row in ROWS}
    results: dict[str, list[float]] = {row: [] for row in ROWS}
    try:
        for row, env in envs.items():  # warm-up: first resets, first page faults
            run_steps(row, env, 20, states[row])
        for r in range(rounds):
            order = list(ROWS) if r % 2 == 0 else list(reversed(ROWS))
            for row in order:
                start = time.perf_counter()
                frames = run_steps(row, envs[row], steps, states[row])
                results[row].append(frames / (time.perf_counter() - start))
            print(f"round {r + 1}: " + " | ".join(f"{ROWS[row]} {results[row][-1]:,.0f}" for row in ROWS),
                  flush=True)
    finally:
        for row, env in envs.items():
            close(row, env)
    return results


def first_batch_child(row: str, name: str, workers: int, method: str | None, preimport: bool) -> None:
    """Run in a fresh process: print the seconds from this process's creation to its first batch."""
    import psutil

    if preimport:
        import meltingpot.substrate  # noqa: F401
    env = build(row, name, workers, method)
    run_steps(row, env, 1, {})
    seconds = time.time() - psutil.Process().create_time()
    close(row, env)
    print(json.dumps({"seconds": seconds}))


def first_batch(row: str, name: str, workers: int, method: str | None, preimport: bool) -> float:
    args = [sys.executable, "-m", "benchmarks.meltingpot", "--child", row, "--substrate", name,
            "--workers", str(workers), "--method", method or "default", *(["--preimport"] if preimport else [])]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{row} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def startup_table(name: str, workers: int, rounds: int) -> list[tuple[str, list[float]]]:
    configs = [("serial loop (main imports MeltingPot)", "serial", workers, None, True),
               ("TorchRL ParallelEnv + MeltingpotEnv", "torchrl", workers, None, False),
               ("ours, TorchRL's MeltingpotEnv (fork)", "wrapper", workers, "fork", False)]
    for n in (2, 4):
        for method in ("fork", "forkserver", "spawn"):
            configs.append((f"ours native, {n} workers, {method}, main imports MeltingPot", "native", n, method, True))
        configs.append((f"ours native, {n} workers, fork, constructor imports it", "native", n, "fork", False))
    times = {label: [] for label, *_ in configs}
    for r in range(rounds):
        for label, row, n, method, preimport in configs if r % 2 == 0 else reversed(configs):
            times[label].append(first_batch(row, name, n, method, preimport))
            print(f"startup round {r + 1}: {label}: {times[label][-1]:.1f} s", flush=True)
    return [(label, times[label]) for label, *_ in configs]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--substrate", default="commons_harvest__open")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-rounds", type=int, default=2)
    parser.add_argument("--child", choices=list(ROWS), help=argparse.SUPPRESS)
    parser.add_argument("--method", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--preimport", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        method = None if args.method == "default" else args.method
        first_batch_child(args.child, args.substrate, args.workers, method, args.preimport)
        return
    print(f"{args.substrate}, {args.workers} workers, {args.steps} steps per env per round, random actions")
    results = throughput(args.substrate, args.workers, args.steps, args.rounds)
    serial = np.median(results["serial"])
    print("\n| row | frames/s (median of rounds) | rounds | × serial |\n|---|---:|---|---:|")
    for row, label in ROWS.items():
        med = np.median(results[row])
        print(f"| {label} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in results[row])} | {med / serial:.2f} |")
    if args.startup_rounds:
        table = startup_table(args.substrate, args.workers, args.startup_rounds)
        print("\n| time to first batch (process start to the first step) | median s | rounds |\n|---|---:|---|")
        for label, values in table:
            print(f"| {label} | {np.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")


if __name__ == "__main__":
    main()
