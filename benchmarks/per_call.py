"""Our own cost per call of the public TorchRL API: main-process time of ``step_and_maybe_reset`` and ``step`` on a
``ParallelEnv`` with the workers' step left out (``_run_step`` replaced by a no-op on the instance, so the buffers
keep what the last real step left), against the lean ``step_buffers()`` that the rollout and the collectors use.

CartPole, ``workers x envs_per_worker`` envs; "no env ended" leaves every done flag False (the next root shares the
step's tensors), "an env ended" sets one (the next root is copied from the root buffer). The ``step_and_maybe_reset``
rows include the loop's own ``root.set("action", ...)``, timed alone in the row after them: our own cost is their
difference. The best of ``--repeats``
timings of ``--calls`` calls each, per ``--rounds`` round; medians over the rounds, in microseconds per call.
Before / after a change: run it with the package of each version first on ``PYTHONPATH`` (as
``benchmarks.compare_trees`` swaps it), alternating.

    python -m benchmarks.per_call [--workers 2] [--envs-per-worker 4 32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import timeit

import gymnasium as gym
import torch


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def measure(workers: int, per_worker: int, calls: int, repeats: int) -> dict[str, float]:
    """Microseconds per call of each row, best of ``repeats``."""
    from tdcollect.envs import ParallelEnv

    rows = {}
    with ParallelEnv(workers, make_cartpole, envs_per_worker=per_worker) as env:
        root = env.reset()
        env._run_step = lambda mask=None: None  # the workers' step left out: only this process' work is timed
        action = env.action_spec.rand()
        done = env.next_buffer["done"]

        def timed(call) -> float:
            return min(timeit.repeat(call, number=calls, repeat=repeats)) / calls * 1e6

        for name, ended in (("no env ended", False), ("an env ended", True)):
            done[:] = False
            done[0] = ended
            state = {"root": root}

            def step_and_maybe_reset(state=state):
                state["root"].set("action", action)
                _, state["root"] = env.step_and_maybe_reset(state["root"])

            rows[f"step_and_maybe_reset, {name}"] = timed(step_and_maybe_reset)
        rows["the caller's set(\"action\") in those rows"] = timed(lambda: state["root"].set("action", action))
        done[:] = False
        td = root.clone().set("action", action)
        rows["step (+ del_ of its \"next\")"] = timed(lambda: env.step(td).del_("next"))  # an input without "next"
        rows["step_buffers (lean)"] = timed(env.step_buffers)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for _ in range(args.rounds):
        for k in args.envs_per_worker:
            for row, us in measure(args.workers, k, args.calls, args.repeats).items():
                results.setdefault(f"{args.workers} x {k}", {}).setdefault(row, []).append(us)
    medians = {size: {row: statistics.median(v) for row, v in rows.items()} for size, rows in results.items()}
    if args.json:
        print(json.dumps(medians))
        return
    sizes = list(medians)
    print("| call (main process only, µs) | " + " | ".join(f"CartPole {s}" for s in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for row in medians[sizes[0]]:
        print(f"| {row} | " + " | ".join(f"{medians[s][row]:.1f}" for s in sizes) + " |")


if __name__ == "__main__":
    main()
