"""MeltingPot: frames/s of every road against a serial loop of the same substrates, TorchRL's ParallelEnv and the
machine's ceiling; and the time to the first batch.

Frames/s (``--substrates``, default ``commons_harvest__open`` (7 players) and ``coins`` (2); ``--layouts``, default
``2x1 2x2``: workers x envs per worker): random actions, ``--steps`` steps of every env per round after a warm-up of
as many (a rollout's storage is made at its first call, then recycled; the first batch is timed below), the rows
interleaved within each of ``--rounds`` rounds (medians reported). Each row is built, timed and closed in its turn,
alone on the cores (an idle batched env is not free: TorchRL's workers poll); an episode of these
substrates lasts 500-1,600 steps, so few rounds hold an episode's end. A frame is one env step
(all players). Rows (``ours`` twice: the native factory ``lambda: substrate.build(name, roles=...)`` and TorchRL's
``lambda: MeltingpotEnv(name)``):

- ``serial loop``: the W*K raw substrates stepped one after the other in a Python loop (numpy actions, no tensors:
  the floor of any env API's cost);
- ``ceiling``: W processes, each stepping K raw substrates through the same steps and copying every observation,
  started together, with no hand-off at all (what two cores allow);
- ``step loop``: ``step_and_maybe_reset(rand_action(td))``;
- ``rollout``: ``env.rollout(steps, break_when_any_done=False, auto_reset=False, tensordict=td)``, going on;
- ``Collector``: ``Collector(env, None, frames_per_batch=steps * W * K)``, batches timed;
- ``MultiSyncCollector``: ``MultiSyncCollector([make] * W, None, ...)`` (a worker's env: K envs in a SerialEnv);
- ``TorchRL ParallelEnv + MeltingpotEnv``: its step loop and its ``rollout`` (going on).

``rollout`` with its default reset (``env.rollout(steps)``) rebuilds every substrate first (MeltingPot's reset:
0.3-1 s each); its row ``rollout, reset included`` is set against ``serial loop, reset included`` (each substrate
reset, then stepped as above).

Time to first batch: a fresh Python process per row, from the process's creation (imports included) to its first
step returned (reset included), for the serial loop, TorchRL's ParallelEnv and ours under each start method.

    python -m benchmarks.meltingpot [--substrates commons_harvest__open coins] [--layouts 2x1 2x2] [--rounds 3]
        [--json results.json] [--startup-rounds 2]
    python -m benchmarks.meltingpot --from-log printed.txt --json results.json   (tables from a run's output)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import re
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


FACTORIES = {"native": native_factory, "wrapper": wrapper_factory}


def serial_envs(name: str, n: int) -> list:
    return [native_factory(name)() for _ in range(n)]


def step_serial(envs: list, steps: int, rng) -> None:
    """``steps`` steps of each raw substrate, one after the other (reset where an episode ends)."""
    n_actions, players = envs[0].action_spec()[0].num_values, len(envs[0].action_spec())
    for _ in range(steps):
        for substrate in envs:
            if substrate.step(list(rng.integers(0, n_actions, players))).last():
                substrate.reset()


def copy_observations(timestep, buffers: dict) -> None:
    """What a batched env must do with a step's observations at least: copy each into memory of its own."""
    for p, observation in enumerate(timestep.observation):
        for key, value in observation.items():
            if not key.startswith("WORLD.") or p == 0:
                np.copyto(buffers.setdefault((p, key), np.empty_like(np.asarray(value))), value)


def _ceiling_worker(name: str, k: int, steps: int, ready, go, done) -> None:
    envs = serial_envs(name, k)
    for env in envs:
        env.reset()
    rng = np.random.default_rng(0)
    n_actions, players = envs[0].action_spec()[0].num_values, len(envs[0].action_spec())
    buffers: dict = {}
    ready.release()
    while go.get():
        for _ in range(steps):
            for env in envs:
                timestep = env.step(list(rng.integers(0, n_actions, players)))
                copy_observations(timestep, buffers)
                if timestep.last():
                    env.reset()
        done.release()
    for env in envs:
        env.close()


class Ceiling:
    """``workers`` processes of ``k`` raw substrates each; :meth:`run` has them all step ``steps`` steps (copying
    every observation) and returns when the last is done: no hand-off per step."""

    def __init__(self, name: str, workers: int, k: int, steps: int):
        context = multiprocessing.get_context("fork")
        self.ready, self.done = context.Semaphore(0), context.Semaphore(0)
        self.go = [context.SimpleQueue() for _ in range(workers)]
        self.processes = [context.Process(target=_ceiling_worker, args=(name, k, steps, self.ready, queue,
                                                                         self.done), daemon=True)
                          for queue in self.go]
        for process in self.processes:
            process.start()
        self._from_every_worker(self.ready, "start")

    def run(self) -> None:
        for queue in self.go:
            queue.put(True)
        self._from_every_worker(self.done, "finish")

    def _from_every_worker(self, semaphore, what: str) -> None:
        for _ in self.processes:
            if not semaphore.acquire(timeout=300):
                raise RuntimeError(f"a ceiling worker did not {what}")

    def close(self) -> None:
        for queue in self.go:
            queue.put(False)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()


class Row:
    """One row, built for rollouts or batches of ``chunk`` steps of every env: ``run(steps)`` runs ``steps // chunk``
    of them (``steps`` a multiple of ``chunk``) and returns the frames; ``close()``."""

    def __init__(self, run, close, frames_per_step: int, chunk: int):
        self.run_steps = run
        self.close = close
        self.frames_per_step = frames_per_step
        self.chunk = chunk

    def run(self, steps: int) -> int:
        for _ in range(steps // self.chunk):
            self.run_steps(self.chunk)
        return steps * self.frames_per_step


def build_row(row: str, name: str, workers: int, k: int, steps: int) -> Row:
    """The row's env(s); ``steps``: the length of one rollout or batch (a round may run several, see ``Row``)."""
    n = workers * k
    if row in ("serial", "serial_reset"):
        envs = serial_envs(name, n)
        for env in envs:
            env.reset()
        rng = np.random.default_rng(0)

        def run(t):
            if row == "serial_reset":
                for env in envs:
                    env.reset()
            step_serial(envs, t, rng)

        return Row(run, lambda: [env.close() for env in envs], n, steps)
    if row == "ceiling":
        ceiling = Ceiling(name, workers, k, steps)
        return Row(lambda t: ceiling.run(), ceiling.close, n, steps)
    if row in ("torchrl_loop", "torchrl_rollout"):
        from torchrl.envs import ParallelEnv as TorchRLParallelEnv

        env = TorchRLParallelEnv(n, wrapper_factory(name))
        if row == "torchrl_loop":
            return _loop_row(env, n, steps)
        first = env.reset()
        return Row(lambda t: env.rollout(t, break_when_any_done=False, auto_reset=False, tensordict=first),
                   env.close, n, steps)
    form, road = row.split("_", 1)
    make = FACTORIES[form](name)
    if road == "multisync":
        from tdcollect.collectors import MultiSyncCollector
        from tdcollect.envs import SerialEnv

        worker_env = make if k == 1 else (lambda: SerialEnv(k, make))
        collector = MultiSyncCollector([worker_env] * workers, None, frames_per_batch=steps * n, total_frames=-1)
        batches = iter(collector)
        return Row(lambda t: next(batches), collector.shutdown, n, steps)
    from tdcollect.envs import ParallelEnv

    env = ParallelEnv(workers, make, envs_per_worker=k)
    if road == "loop":
        return _loop_row(env, n, steps)
    if road in ("rollout", "rollout_reset"):
        first = env.reset()

        def roll(t):
            if road == "rollout_reset":
                env.rollout(t, break_when_any_done=False)
            else:  # (the workers' envs go on from where they are; ``first`` is only step 0's recorded root)
                env.rollout(t, break_when_any_done=False, auto_reset=False, tensordict=first)

        return Row(roll, env.close, n, steps)
    if road == "collector":
        from tdcollect.collectors import Collector

        collector = Collector(env, None, frames_per_batch=steps * n, total_frames=-1)
        batches = iter(collector)

        def close():
            collector.shutdown()
            env.close()

        return Row(lambda t: next(batches), close, n, steps)
    raise ValueError(row)


def _loop_row(env, n: int, chunk: int) -> Row:
    state = {"td": env.reset()}

    def run(t):
        td = state["td"]
        for _ in range(t):
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        state["td"] = td

    return Row(run, env.close, n, chunk)


ROWS = {
    "serial": "serial loop",
    "ceiling": "ceiling: processes stepping and copying, no hand-off",
    "native_loop": "ours, native factory: step loop",
    "native_rollout": "ours, native factory: rollout",
    "native_collector": "ours, native factory: Collector",
    "native_multisync": "ours, native factory: MultiSyncCollector",
    "wrapper_loop": "ours, MeltingpotEnv: step loop",
    "wrapper_rollout": "ours, MeltingpotEnv: rollout",
    "wrapper_collector": "ours, MeltingpotEnv: Collector",
    "wrapper_multisync": "ours, MeltingpotEnv: MultiSyncCollector",
    "torchrl_loop": "TorchRL ParallelEnv + MeltingpotEnv: step loop",
    "torchrl_rollout": "TorchRL ParallelEnv + MeltingpotEnv: rollout",
    "serial_reset": "serial loop, reset included",
    "native_rollout_reset": "ours, native factory: rollout, reset included",
}
#: rows set against the reset-including serial loop
AGAINST_RESET = {"serial_reset", "native_rollout_reset"}


def throughput(name: str, workers: int, k: int, steps: int, rounds: int, rows: list[str],
               chunk: int | None = None) -> dict[str, list[float]]:
    """Frames/s of each row in each round. A row is built, warmed up (its first steps and page faults), timed and
    closed within its turn, so that no other row's processes share the cores while it runs (idle workers are not
    free: TorchRL's poll); the order alternates between rounds. ``chunk``: rollouts and batches of that many steps,
    ``steps // chunk`` of them per round (default: one of ``steps``)."""
    chunk = chunk or steps
    results: dict[str, list[float]] = {row: [] for row in rows}
    for r in range(rounds):
        for row in rows if r % 2 == 0 else list(reversed(rows)):
            built = build_row(row, name, workers, k, chunk)
            try:
                built.run(chunk)  # warm-up of one chunk: a rollout's storage is made once, then recycled
                start = time.perf_counter()
                frames = built.run(steps)
                results[row].append(frames / (time.perf_counter() - start))
            finally:
                built.close()
        print(f"{name} {workers}x{k} round {r + 1}: " + " | ".join(
            f"{row} {results[row][-1]:,.0f}" for row in rows), flush=True)
    return results


def table(name: str, workers: int, k: int, results: dict[str, list[float]]) -> list[str]:
    serial = float(np.median(results["serial"]))
    serial_reset = float(np.median(results["serial_reset"])) if "serial_reset" in results else None
    lines = [f"\n{name}, {workers} workers x {k} env(s), random actions\n",
             "| row | frames/s (median) | rounds | x serial loop |", "|---|---:|---|---:|"]
    for row, values in results.items():
        med = float(np.median(values))
        base = serial_reset if row in AGAINST_RESET else serial
        lines.append(f"| {ROWS[row]} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {med / base:.2f} |")
    return lines


def first_batch_child(row: str, name: str, workers: int, method: str | None, preimport: bool) -> None:
    """Run in a fresh process: print the seconds from this process's creation to its first step returned."""
    import psutil

    if preimport:
        import meltingpot.substrate  # noqa: F401
    if row == "serial":
        envs = serial_envs(name, workers)
        for env in envs:
            env.reset()
        step_serial(envs, 1, np.random.default_rng(0))
        close = [env.close for env in envs]
    else:
        if row == "torchrl":
            from torchrl.envs import ParallelEnv as TorchRLParallelEnv

            env = TorchRLParallelEnv(workers, wrapper_factory(name))
        else:
            from tdcollect.envs import ParallelEnv

            env = ParallelEnv(workers, FACTORIES[row](name), mp_start_method=method)
        env.step_and_maybe_reset(env.rand_action(env.reset()))
        close = [env.close]
    seconds = time.time() - psutil.Process().create_time()
    for fn in close:
        fn()
    print(json.dumps({"seconds": seconds}))


def first_batch(row: str, name: str, workers: int, method: str | None, preimport: bool) -> float:
    args = [sys.executable, "-m", "benchmarks.meltingpot", "--child", row, "--substrates", name,
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


#: rows drawn in the README's plot (``benchmarks.plot_ratios``), under the systems' names there
PLOT_SYSTEMS = {"native_rollout": "tdcollect_parallel", "native_loop": "tdcollect_step_loop",
                "native_collector": "tdcollect_random_collector", "torchrl_rollout": "torchrl_parallel"}
ROUND_LINE = re.compile(r"^(\S+) (\d+)x(\d+) round \d+: (.*)$")


def from_log(path: str) -> dict[tuple, dict[str, list[float]]]:
    """The rounds a run printed (its ``<name> <W>x<K> round <r>: row value | ...`` lines), by configuration."""
    runs: dict[tuple, dict[str, list[float]]] = {}
    with open(path) as f:
        for line in f:
            match = ROUND_LINE.match(line.strip())
            if not match:
                continue
            name, workers, k, rows = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
            results = runs.setdefault((name, workers, k), {})
            for entry in rows.split(" | "):
                row, value = entry.rsplit(" ", 1)
                results.setdefault(row, []).append(float(value.replace(",", "")))
    return runs


def plot_records(name: str, workers: int, k: int, results: dict[str, list[float]]) -> list[dict]:
    """``benchmarks.plot_ratios``' records (``results.json`` of ``benchmarks.run``) of the rows it draws."""
    serial = float(np.median(results["serial"]))
    return [{"system": system, "workload": f"meltingpot {name.split('_')[0]}", "config_workers": workers,
             "config_envs_per_worker": k, "steps_per_s": float(np.median(results[row])),
             "rounds_steps_per_s": results[row], "vs_serial": float(np.median(results[row])) / serial}
            for row, system in PLOT_SYSTEMS.items() if row in results]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--substrates", nargs="+", default=["commons_harvest__open", "coins"])
    parser.add_argument("--layouts", nargs="+", default=["2x1", "2x2"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--chunk", type=int, help="steps per rollout or batch (default --steps): a long run of "
                                                  "ordinary batches is --steps 1500 --chunk 150")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--startup-rounds", type=int, default=0)
    parser.add_argument("--json", help="write the plotted rows as benchmarks.plot_ratios reads them")
    parser.add_argument("--from-log", help="tables (and --json) from the rounds a run printed, without running")
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["serial", "torchrl", "native", "wrapper"], help=argparse.SUPPRESS)
    parser.add_argument("--method", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--preimport", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        method = None if args.method == "default" else args.method
        first_batch_child(args.child, args.substrates[0], args.workers, method, args.preimport)
        return
    lines, records = [], []
    if args.from_log:
        runs = from_log(args.from_log)
    else:
        runs = {}
        for name in args.substrates:
            for layout in args.layouts:
                workers, k = (int(part) for part in layout.split("x"))
                runs[(name, workers, k)] = throughput(name, workers, k, args.steps, args.rounds, list(args.rows),
                                                     args.chunk)
                print("\n".join(table(name, workers, k, runs[(name, workers, k)])), flush=True)
    for (name, workers, k), results in runs.items():
        lines += table(name, workers, k, results)
        records += plot_records(name, workers, k, results)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": records}, f, indent=1)
    if args.startup_rounds:
        startup = startup_table(args.substrates[0], 2, args.startup_rounds)
        print("\n| time to first batch (process start to the first step) | median s | rounds |\n|---|---:|---|")
        for label, values in startup:
            print(f"| {label} | {np.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")


if __name__ == "__main__":
    main()
