"""``autotune``: measure how to split ``num_envs`` envs over worker processes on this machine, and the wait
strategy, within a time budget; return the fastest configuration, ready to pass to ``ParallelEnv`` (or to a
collector, one constructor per worker).

What is timed is the road a rollout or a collector takes: ``ParallelEnv.rollout(T, policy, break_when_any_done=False)``
(random actions without a policy), whole chunks of ``T`` batched steps, counted as env steps per second (one step
of one env). Pass your policy where it runs in this process: the best wait depends on what this process does
while the workers step.

The search, for a budget of ``budget_s`` seconds (start-ups included)::

    screening   every split (w workers x num_envs / w envs each, w a divisor of num_envs up to 2 x the cores):
                its env is started and timed with both waits (``spin_s`` 0: block; ``SPIN_S``: poll 1 ms
                first, switched on the running env), then closed unless it is among the leaders so far
    final       the splits within ``KEEP`` of the best (at most ``MAX_CONTENDERS``; their envs kept running)
                with both waits, and the serial reference, take turns one chunk (~0.1 s) at a time until the
                budget is spent; a configuration's rate is its steps over its seconds in all its turns

Taking turns chunk by chunk spreads every configuration over the whole final phase, so a slow spell of a shared
machine hits them alike, and an erratic configuration is scored by its typical rate, not its luckiest timing (on
16 cores, 16 blocking workers ran 34,500-46,500 steps/s from one 1.5 s timing to the next where polling ran
46,000-50,300). At most ``MAX_CONTENDERS + 1`` envs run at once.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from .engine.errors import ArgumentError
from .engine.platform_policy import SPIN_S, caller_threads, usable_cores
from .engine.shared import nbytes
from .parallel import ParallelEnv
from .serial import SerialEnv

KEEP = 0.75  #: the screened splits within this fraction of the best go on to the final phase
MAX_CONTENDERS = 3  #: at most this many splits go on to the final phase
SCREENING_SHARE = 0.5  #: of the budget, for the screening
MIN_SLICE_S = 0.2  #: the shortest screening timing of one configuration
CHUNK_S = 0.1  #: a chunk's length in time, about (its steps are fixed per env when the env starts) ...
MIN_CHUNK = 32  #: ... within these steps (a rollout call costs ~2 ms of its own on 2 cores)
MAX_CHUNK = 200
MAX_CHUNK_BYTES = 64 << 20  #: a timed chunk's rollout holds at most this much data (pixels)
WAITS = (SPIN_S, 0.0)


@dataclass
class Measured:
    """One configuration (``num_workers == 0``: the serial reference, a ``SerialEnv`` in this process), its
    screening rate and the env steps and seconds of its turns in the final phase."""

    num_workers: int
    envs_per_worker: int
    spin_s: float
    screening_rate: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    start_s: float = 0.0

    @property
    def wait(self) -> str:
        if self.num_workers == 0:
            return "(serial)"
        return "block" if self.spin_s == 0 else f"poll {self.spin_s * 1e3:g} ms"

    @property
    def rate(self) -> float:
        """Env steps/s: over its turns in the final phase if it had any, else its screening rate."""
        return self.steps / self.seconds if self.seconds else self.screening_rate


@dataclass
class Tuning:
    """``autotune``'s answer: the fastest ``num_workers`` x ``envs_per_worker`` and wait (``spin_s``), its rate,
    every configuration measured (``table``: the contenders first, fastest first) and, if timed, a serial
    ``SerialEnv``'s rate."""

    num_workers: int
    envs_per_worker: int
    spin_s: float
    steps_per_s: float
    table: list[Measured]
    seconds: float
    serial_steps_per_s: float | None = None

    @property
    def kwargs(self) -> dict:
        """``ParallelEnv(create_env_fn=make_env, **tuning.kwargs)``."""
        return {"num_workers": self.num_workers, "envs_per_worker": self.envs_per_worker, "spin_s": self.spin_s}

    def collector_env_fns(self, create_env_fn: Callable) -> list[Callable]:
        """One constructor per collector worker, each building ``envs_per_worker`` envs stepped in that worker:
        ``MultiSyncCollector(tuning.collector_env_fns(make_env), policy, ...)``."""
        return [partial(SerialEnv, self.envs_per_worker, create_env_fn)] * self.num_workers

    def __str__(self) -> str:
        lines = [f"autotune: {self.num_workers * self.envs_per_worker} envs on {usable_cores()} cores, "
                 f"{self.seconds:.1f} s",
                 "  workers  envs/worker  wait          start s   env steps/s   x pick  final s"]
        for row in self.table:
            mark = "*" if (row.num_workers, row.envs_per_worker, row.spin_s) == (
                self.num_workers, self.envs_per_worker, self.spin_s) else " "
            ratio = row.rate / self.steps_per_s if self.steps_per_s else 0.0
            lines.append(f"{mark} {row.num_workers:7d}  {row.envs_per_worker:11d}  {row.wait:12s}  "
                         f"{row.start_s:7.2f}  {row.rate:12,.0f}  {ratio:7.2f}  {row.seconds:7.1f}")
        if self.serial_steps_per_s:
            lines.append(f"  the pick runs {self.steps_per_s / self.serial_steps_per_s:.2f}x a SerialEnv of the same "
                         "envs in this process (workers 0)")
        return "\n".join(lines)


def autotune(create_env_fn: Callable, num_envs: int, *, policy: Callable | None = None, budget_s: float = 30.0,
             max_workers: int | None = None, serial: bool = True, verbose: bool = True, **env_options) -> Tuning:
    """Time splits of ``num_envs`` envs over worker processes, each with both waits, on this machine within about
    ``budget_s`` seconds, and return the fastest as a :class:`Tuning` (printed as a table if ``verbose``).

    Args:
        create_env_fn: the env constructor, as ``ParallelEnv`` takes it (built in the workers only, except for
            the serial reference).
        num_envs: how many envs in all; each split runs ``w`` workers of ``num_envs // w`` envs, for every
            divisor ``w`` of ``num_envs`` up to ``max_workers`` (default: twice the usable cores).
        policy: acts in the timed rollouts (``rollout``'s argument: a TensorDict in, its action keys set),
            batch ``[num_envs]``; default: random actions.
        budget_s: the time to spend, start-ups included; the screening always completes (every split once).
        serial: also time a ``SerialEnv`` of the same envs in this process, for reference (in the table and
            ``serial_steps_per_s``); pass False for envs that allow one instance per process.
        env_options: passed to every ``ParallelEnv`` (``create_env_kwargs``, ``mp_start_method``, ...).

    Example::

        tuning = autotune(make_env, num_envs=16)
        env = ParallelEnv(create_env_fn=make_env, **tuning.kwargs)
    """
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ArgumentError(f"autotune needs num_envs >= 1 (an int: how many envs in all), got {num_envs!r}.")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise ArgumentError(f"autotune needs budget_s > 0 (seconds), got {budget_s!r}.")
    for name in ("num_workers", "envs_per_worker", "spin_s"):
        if name in env_options:
            raise ArgumentError(f"autotune chooses {name} itself: leave it out (it returns the best in .kwargs).")
    limit = max_workers if max_workers is not None else 2 * usable_cores()
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ArgumentError(f"autotune needs max_workers >= 1 (an int), got {max_workers!r}.")
    if policy is not None and not callable(policy):
        raise ArgumentError(f"autotune's policy must be callable (as rollout takes it), got {type(policy).__name__}.")
    search = _Search(create_env_fn, env_options, budget_s, policy)
    try:
        return search.run(num_envs, limit, serial, verbose)
    finally:
        search.close_all()


class _Search:
    """The phases of :func:`autotune`, with the envs they keep running."""

    def __init__(self, create_env_fn: Callable, env_options: dict, budget_s: float, policy: Callable | None):
        self.create_env_fn = create_env_fn
        self.env_options = env_options
        self.budget_s = budget_s
        self.policy = policy
        self.started = time.perf_counter()
        #: this process' torch threads: each chunk runs with as many as its env alone would leave it (the envs
        #: kept running give their threads back in any order: 2 threads copying beside 2 workers on 2 cores ran
        #: Pong at 60 % of its rate)
        self.threads = torch.get_num_threads()
        #: (workers, per worker) -> (env, chunk length, a root state to start chunks from)
        self.envs: dict[tuple[int, int], tuple] = {}
        self.rows: dict[tuple[int, int, float], Measured] = {}

    def run(self, num_envs: int, limit: int, serial: bool, verbose: bool) -> Tuning:
        splits = [(w, num_envs // w) for w in range(1, min(limit, num_envs) + 1) if num_envs % w == 0]
        reference = [(0, num_envs)] if serial else []
        self.screen(reference + splits, splits, self.started + self.budget_s * SCREENING_SHARE)
        contenders = self.leaders(splits, MAX_CONTENDERS, keep=KEEP)
        for split in set(self.envs) - set(contenders + reference):
            self.close(split)
        turns = [(split, spin_s) for split in contenders + reference for spin_s in self.waits(split)]
        while time.perf_counter() + len(turns) * CHUNK_S < self.started + self.budget_s:
            for split, spin_s in turns:
                self.chunk(split, spin_s)
        best = max((self.rows[(*split, spin_s)] for split in contenders for spin_s in WAITS), key=lambda r: r.rate)
        table = sorted((row for row in self.rows.values() if row.num_workers),
                       key=lambda row: (not row.seconds, -row.rate))  # the contenders first
        ref = self.rows[(0, num_envs, 0.0)] if serial else None
        tuning = Tuning(best.num_workers, best.envs_per_worker, best.spin_s, best.rate, table + ([ref] if ref else []),
                        time.perf_counter() - self.started, ref.rate if ref else None)
        if verbose:
            print(tuning, flush=True)
        return tuning

    def screen(self, order: list, splits: list, end: float) -> None:
        """Start each of ``order`` in turn and time it with both waits for a share of the time left until
        ``end``; keep the envs of the ``MAX_CONTENDERS`` fastest splits so far (and the serial reference)."""
        for i, split in enumerate(order):
            start_s = self.open(split)
            for spin_s in self.waits(split):
                runs = sum(len(self.waits(s)) for s in order[i:]) - (spin_s != self.waits(split)[0])
                starts = start_s * (len(order) - i - 1)  # those to come, as long as this one's
                slice_s = max(MIN_SLICE_S, (end - time.perf_counter() - starts) / runs)
                self.chunk(split, spin_s)  # one in this wait first
                steps = 0
                seconds = 0.0
                while seconds < slice_s:
                    done, took = self.chunk(split, spin_s)
                    steps, seconds = steps + done, seconds + took
                self.rows[(*split, spin_s)].screening_rate = steps / seconds
            for other in splits:  # this one, or one it pushed out of the leaders
                if other in self.envs and other not in self.leaders(splits, MAX_CONTENDERS):
                    self.close(other)

    @staticmethod
    def waits(split) -> tuple[float, ...]:
        return WAITS if split[0] else (0.0,)

    def leaders(self, splits, count: int, keep: float = 0.0) -> list:
        """The ``count`` fastest measured splits (either wait), those within ``keep`` of the fastest."""
        best = {s: max(self.rows[(*s, w)].rate for w in WAITS) for s in splits if (*s, WAITS[0]) in self.rows}
        top = max(best.values(), default=0.0)
        return sorted((s for s in best if best[s] >= keep * top), key=lambda s: -best[s])[:count]

    def open(self, split) -> float:
        """Start ``split``'s env, warm it up and size its chunks; its start-up seconds."""
        workers, per_worker = split
        t0 = time.perf_counter()
        if workers == 0:
            env = SerialEnv(per_worker, self.create_env_fn, self.env_options.get("create_env_kwargs"))
        else:
            env = ParallelEnv(workers, self.create_env_fn, envs_per_worker=per_worker, **self.env_options)
        env.set_seed(0)
        root = env.reset()
        self.envs[split] = (env, MIN_CHUNK, root)
        # start-up, first pages, and the size of the chunks; a chunk goes on from where the envs are (no reset,
        # which would cost Pong's 8 envs 33 ms a chunk): its first action is taken on this stale root
        warm = env.rollout(MIN_CHUNK, self.policy, auto_reset=False, tensordict=root.clone(), break_when_any_done=False)
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()  # the second: its storage recycled, as every chunk's will be
        env.rollout(MIN_CHUNK, self.policy, auto_reset=False, tensordict=root.clone(), break_when_any_done=False)
        per_step = max(1e-6, (time.perf_counter() - t1) / MIN_CHUNK)
        fits = max(4, MAX_CHUNK_BYTES // max(1, nbytes(warm) // MIN_CHUNK))
        self.envs[split] = (env, int(min(MAX_CHUNK, fits, max(MIN_CHUNK, CHUNK_S / per_step))), root)
        for spin_s in self.waits(split):
            self.rows[(*split, spin_s)] = Measured(workers, per_worker, spin_s, start_s=start_s)
        return start_s

    def chunk(self, split, spin_s: float) -> tuple[int, float]:
        """One timed rollout chunk of ``split``'s env in wait ``spin_s``: its env steps and seconds, which count
        towards the configuration's final rate once the screening is over."""
        env, length, root = self.envs[split]
        if split[0]:
            env.spin_s = spin_s
        torch.set_num_threads(caller_threads(self.threads, split[0], self.env_options.get("num_threads")))
        root = root.clone()
        start = time.perf_counter()
        env.rollout(length, self.policy, auto_reset=False, tensordict=root, break_when_any_done=False)
        seconds = time.perf_counter() - start
        steps = length * env.batch_size.numel()
        row = self.rows[(*split, spin_s)]
        if row.screening_rate:  # screened: a turn of the final phase
            row.steps, row.seconds = row.steps + steps, row.seconds + seconds
        return steps, seconds

    def close(self, split) -> None:
        env = self.envs.pop(split)[0]
        env.close()

    def close_all(self) -> None:
        for split in list(self.envs):
            self.close(split)
        torch.set_num_threads(self.threads)
