"""What the pipeline benchmarks share (``atari_pipeline``, ``sac_pipeline``, ``gymenv_road``): timing a TorchRL env
with random actions, and running systems in interleaved rounds."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def steps_per_second(env, num_envs: int, steps: int, warmup: int, mode: str = "rollout") -> float:
    """Env steps per second (``num_envs * steps / seconds``) of a TorchRL env after ``warmup`` steps, random actions:
    ``mode="rollout"``, a timed ``rollout(steps)`` (TorchRL's, which stacks its steps at the end); ``"steps"``, a loop
    of ``steps`` ``step_and_maybe_reset`` calls, as a collector steps (into storage of its own)."""
    import torch

    torch.manual_seed(0)
    env.set_seed(0)
    if mode == "rollout":
        env.rollout(warmup, break_when_any_done=False)
        start = time.perf_counter()
        env.rollout(steps, break_when_any_done=False)
        return steps * num_envs / (time.perf_counter() - start)
    td = env.reset()
    for _ in range(warmup):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    start = time.perf_counter()
    for _ in range(steps):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    return steps * num_envs / (time.perf_counter() - start)


def interleaved(systems: list[str], rounds: int, timed: Callable[[str], float], label: str = "") -> dict:
    """``timed(system)`` for every system, round after round (a slow spell of the machine hits them alike), in
    reverse order every other round (no system always follows the same one), each after the processes the last one
    started are gone (:func:`settle`); prints each rate; returns ``{system: [rate per round]}``."""
    rates: dict[str, list[float]] = {system: [] for system in systems}
    for round_ in range(rounds):
        for system in systems if round_ % 2 == 0 else systems[::-1]:
            settle()
            rate = timed(system)
            rates[system].append(rate)
            print(f"round {round_ + 1} {label}{system:18s} {rate:9.0f} env steps/s", flush=True)
    return rates


def settle(within_s: float = 30.0) -> None:
    """Wait (up to ``within_s``) until this process has no child left but multiprocessing's helpers: a system
    closed lazily (TorchRL's workers exit in the background) must not share the cores with the next one timed."""
    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        children = [child for child in psutil.Process().children(recursive=True)
                    if not any(helper in " ".join(_cmdline(child)) for helper in ("resource_tracker", "forkserver"))]
        if not children:
            return
        time.sleep(0.1)


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # noqa: BLE001 - gone, or a zombie
        return []


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    return {system: statistics.median(values) for system, values in rates.items()}
