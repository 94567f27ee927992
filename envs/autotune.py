"""``autotune``: measure how to split ``num_envs`` envs over worker processes on this machine, and the wait
strategy, within a time budget; return the fastest configuration, ready to pass to ``ParallelEnv`` (or to a
collector, one constructor per worker).

What is timed is the road a rollout or a collector takes: ``ParallelEnv.rollout(T, break_when_any_done=False)``
with random actions, whole chunks of ``T`` batched steps, counted as env steps per second (one step of one env).

The search, for a budget of ``budget_s`` seconds (start-ups included)::

    round 1   every split (w workers x num_envs / w envs each, w a divisor of num_envs up to 2 x the cores):
              its env is started once and timed with both waits (``spin_s`` 0: block; ``SPIN_S``: poll 1 ms
              first), switched on the running env
    round 2+  the splits within ``KEEP`` of round 1's best (at most ``MAX_CONTENDERS``, their envs kept
              running), both waits again, in up to ``LATER_ROUNDS`` rounds while the budget lasts (interleaved:
              a slow spell of a shared machine hits them alike)

A configuration's rate is the median over the rounds it ran (the best of them would favour an erratic wait: on 16
cores, 16 blocking workers ran 34,500-46,500 steps/s from one timing to the next where polling ran 46,000-50,300);
the pick is the contender of the highest median, each contender having run every round. At most
``MAX_CONTENDERS + 1`` envs run at once.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from .errors import ArgumentError
from .parallel import ParallelEnv
from .platform_policy import SPIN_S, usable_cores
from .serial import SerialEnv

KEEP = 0.75  #: round 1's splits within this fraction of its best are timed again
MAX_CONTENDERS = 3  #: at most this many splits go on to the later rounds
LATER_ROUNDS = 3  #: rounds after the first, while the budget lasts
FIRST_ROUND_SHARE = 0.5  #: of the budget, for round 1 (unless there is nothing to time after it)
MIN_SLICE_S = 0.2  #: the shortest timing of one configuration
MAX_CHUNK_BYTES = 64 << 20  #: a timed chunk's rollout holds at most this much data (pixels)
WAITS = (SPIN_S, 0.0)


@dataclass
class Measured:
    """One configuration and its rate (env steps/s) in each round it ran (``num_workers == 0``: the serial
    reference, a ``SerialEnv`` in this process)."""

    num_workers: int
    envs_per_worker: int
    spin_s: float
    rates: dict[int, float] = field(default_factory=dict)
    start_s: float = 0.0

    @property
    def wait(self) -> str:
        if self.num_workers == 0:
            return "(serial)"
        return "block" if self.spin_s == 0 else f"poll {self.spin_s * 1e3:g} ms"

    @property
    def rate(self) -> float:
        """The median over its rounds (0 before any)."""
        return statistics.median(self.rates.values()) if self.rates else 0.0


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
                 "  workers  envs/worker  wait          start s   env steps/s   x pick  rounds"]
        for row in self.table:
            mark = "*" if (row.num_workers, row.envs_per_worker, row.spin_s) == (
                self.num_workers, self.envs_per_worker, self.spin_s) else " "
            ratio = row.rate / self.steps_per_s if self.steps_per_s else 0.0
            lines.append(f"{mark} {row.num_workers:7d}  {row.envs_per_worker:11d}  {row.wait:12s}  "
                         f"{row.start_s:7.2f}  {row.rate:12,.0f}  {ratio:7.2f}  {len(row.rates):6d}")
        if self.serial_steps_per_s:
            lines.append(f"  the pick runs {self.steps_per_s / self.serial_steps_per_s:.2f}x a SerialEnv of the same "
                         "envs in this process (workers 0)")
        return "\n".join(lines)


def autotune(create_env_fn: Callable, num_envs: int, *, budget_s: float = 30.0, max_workers: int | None = None,
             serial: bool = True, verbose: bool = True, **env_options) -> Tuning:
    """Time splits of ``num_envs`` envs over worker processes, each with both waits, on this machine within about
    ``budget_s`` seconds, and return the fastest as a :class:`Tuning` (printed as a table if ``verbose``).

    Args:
        create_env_fn: the env constructor, as ``ParallelEnv`` takes it (built in the workers only, except for
            the serial reference).
        num_envs: how many envs in all; each split runs ``w`` workers of ``num_envs // w`` envs, for every
            divisor ``w`` of ``num_envs`` up to ``max_workers`` (default: twice the usable cores).
        budget_s: the time to spend, start-ups included; round 1 always completes (every split once).
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
    search = _Search(create_env_fn, env_options, budget_s)
    try:
        return search.run(num_envs, limit, serial, verbose)
    finally:
        search.close_all()


class _Search:
    """The rounds of :func:`autotune`, with the envs they keep running (``envs``: configuration split -> env)."""

    def __init__(self, create_env_fn: Callable, env_options: dict, budget_s: float):
        self.create_env_fn, self.env_options, self.budget_s = create_env_fn, env_options, budget_s
        self.started = time.perf_counter()
        self.envs: dict[tuple[int, int], tuple[object, int]] = {}  # (workers, per worker) -> (env, chunk length)
        self.rows: dict[tuple[int, int, float], Measured] = {}

    def run(self, num_envs: int, limit: int, serial: bool, verbose: bool) -> Tuning:
        splits = [(w, num_envs // w) for w in range(1, min(limit, num_envs) + 1) if num_envs % w == 0]
        reference = [(0, num_envs)] if serial else []
        first_round_end = self.started + self.budget_s * FIRST_ROUND_SHARE
        first_round = reference + splits
        for i, split in enumerate(first_round):
            start_s = self.open(split)
            for spin_s in self.waits(split):
                runs = sum(len(self.waits(s)) for s in first_round[i:]) - (spin_s != self.waits(split)[0])
                starts = start_s * (len(first_round) - i - 1)  # those to come, as long as this one's
                slice_s = (first_round_end - time.perf_counter() - starts) / runs
                self.time(split, spin_s, 0, max(MIN_SLICE_S, slice_s))
            for other in splits:  # this one, or one it pushed out of the leaders
                if other in self.envs and other not in self.leaders(splits, MAX_CONTENDERS):
                    self.close(other)
        contenders = self.leaders(splits, MAX_CONTENDERS, keep=KEEP)
        for split in set(self.envs) - set(contenders + reference):
            self.close(split)
        timed = contenders + reference  # the reference beside every round, as noisy as they
        rounds = 0
        while rounds < LATER_ROUNDS:
            runs = sum(len(self.waits(split)) for split in timed) * (LATER_ROUNDS - rounds)
            slice_s = (self.started + self.budget_s - time.perf_counter()) / runs
            if slice_s < MIN_SLICE_S:
                break
            rounds += 1
            for split in timed:
                for spin_s in self.waits(split)[:: 1 if rounds % 2 else -1]:
                    self.time(split, spin_s, rounds, min(slice_s, 3.0))
        # every contender ran every round: the pick is the contender of the highest median
        best = max((self.rows[(*split, spin_s)] for split in contenders for spin_s in WAITS), key=lambda r: r.rate)
        table = sorted((row for row in self.rows.values() if row.num_workers),
                       key=lambda row: (-len(row.rates), -row.rate))  # the contenders first
        ref = self.rows[(0, num_envs, 0.0)] if serial else None
        tuning = Tuning(best.num_workers, best.envs_per_worker, best.spin_s, best.rate, table + ([ref] if ref else []),
                        time.perf_counter() - self.started, ref.rate if ref else None)
        if verbose:
            print(tuning, flush=True)
        return tuning

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
        self.envs[split] = (env, 4)
        env.set_seed(0)
        warm = env.rollout(4, break_when_any_done=False)  # start-up, first pages, and the chunk's size
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        env.rollout(4, break_when_any_done=False)
        per_step = max(1e-6, (time.perf_counter() - t1) / 4)
        chunk_steps = max(4, MAX_CHUNK_BYTES // max(1, warm.bytes() // 4))
        self.envs[split] = (env, int(min(200, chunk_steps, max(4, MIN_SLICE_S / 4 / per_step))))
        for spin_s in self.waits(split):
            self.rows[(*split, spin_s)] = Measured(workers, per_worker, spin_s, start_s=start_s)
        return start_s

    def time(self, split, spin_s: float, round_: int, slice_s: float) -> None:
        """Env steps/s of rollout chunks for ``slice_s`` seconds, after one chunk in this wait."""
        env, length = self.envs[split]
        if split[0]:
            env.spin_s = spin_s
        env.rollout(length, break_when_any_done=False)
        steps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < slice_s or not steps:
            env.rollout(length, break_when_any_done=False)
            steps += length * env.batch_size.numel()
        row = self.rows[(*split, spin_s)]
        row.rates[round_] = max(row.rates.get(round_, 0.0), steps / elapsed)

    def close(self, split) -> None:
        env, _ = self.envs.pop(split)
        env.close()

    def close_all(self) -> None:
        for split in list(self.envs):
            self.close(split)
