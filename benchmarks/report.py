"""Reporting helpers: markdown tables, throughput plots, start-up probes.

* :func:`aggregate` - merges the rounds of each point: median steps/s and
  the median of the per-round ratios to ``serial``.
* :func:`markdown_table` - one row per result, with the ratio to the
  ``serial`` reference of the same workload and ``num_envs``.
* :func:`plot_throughput` - PNG of env steps/s against worker count, one
  line per system, one subplot per (workload, envs per worker).
* :func:`measure_startup` - start-up time of any vec-env / collector and
  the resident memory of the worker processes it spawned.
* :func:`print_and_save` - a report's lines printed, and written to a
  markdown file when one is asked for.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REFERENCE = "serial"
#: Helper processes of ``multiprocessing`` that are not env workers.
_HELPER_MARKERS = ("resource_tracker", "semaphore_tracker", "forkserver")


# ------------------------------------------------------------------ tables
def print_and_save(lines: list[str], path: Path | None) -> None:
    """Print ``lines``; write them to ``path`` too (markdown) when it is given."""
    text = "\n".join(lines)
    print(text)
    if path is not None:
        Path(path).write_text(text + "\n")


def _reference_rates(results: list[dict]) -> dict[tuple, float]:
    return {(r["workload"], r["num_envs"]): r["steps_per_s"]
            for r in results
            if r.get("system") == REFERENCE and "steps_per_s" in r}


def aggregate(runs: list[dict]) -> list[dict]:
    """One record per (workload, workers, envs/worker, system) from runs
    that carry a ``round``: ``steps_per_s`` is the median over rounds,
    ``rounds_steps_per_s`` every round's value, and ``vs_serial`` the median
    of the ratios to the ``serial`` run of the same round and ``num_envs``
    (``vs_serial_range``: their min and max). A point whose every round
    failed keeps its first error record."""
    serial = {(r["workload"], r["num_envs"], r.get("round", 0)): r["steps_per_s"]
              for r in runs if r.get("system") == REFERENCE and "steps_per_s" in r}
    groups = defaultdict(list)
    for r in runs:
        groups[(r["workload"], r.get("config_workers"),
                r.get("config_envs_per_worker"), r["system"])].append(r)
    merged = []
    for group in groups.values():
        ok = [r for r in group if "steps_per_s" in r]
        if not ok:
            merged.append(group[0])
            continue
        record = dict(ok[0])
        record.pop("round", None)
        rates = [r["steps_per_s"] for r in ok]
        record.update(steps_per_s=statistics.median(rates), rounds_steps_per_s=rates,
                      failed_rounds=len(group) - len(ok))
        ratios = [r["steps_per_s"] / serial[key] for r in ok
                  if (key := (r["workload"], r["num_envs"], r.get("round", 0))) in serial]
        if ratios:
            record.update(vs_serial=statistics.median(ratios),
                          vs_serial_range=[min(ratios), max(ratios)])
        merged.append(record)
    return merged


def _sort_key(r: dict):
    return (r["workload"], r.get("config_envs_per_worker", 0),
            r.get("config_workers", 0), r["num_envs"], r["system"])


def markdown_table(results: list[dict]) -> str:
    """Markdown table of throughput and speed-up over ``serial``.

    ``workers``/``envs/worker`` are the requested configuration;
    ``procs`` is the number of worker processes the system really used
    (one per env for ``gym_async`` and ``sb3_subproc``, 0 for ``serial``).
    """
    refs = _reference_rates(results)
    lines = [
        "| workload | system | workers | envs/worker | num_envs | procs "
        "| steps/s | vs serial | rounds (ratio range) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted((r for r in results if "steps_per_s" in r), key=_sort_key):
        ref = refs.get((r["workload"], r["num_envs"]))
        spread = str(len(r.get("rounds_steps_per_s", [r["steps_per_s"]])))
        if "vs_serial" in r:
            ratio = f"{r['vs_serial']:.2f}"
            low, high = r["vs_serial_range"]
            spread += f" ({low:.2f}–{high:.2f})"
        else:
            ratio = f"{r['steps_per_s'] / ref:.2f}" if ref else "-"
        lines.append(
            f"| {r['workload']} | {r['system']} "
            f"| {r.get('config_workers', r['num_workers'])} "
            f"| {r.get('config_envs_per_worker', r['envs_per_worker'])} "
            f"| {r['num_envs']} | {r.get('processes', r['num_workers'])} "
            f"| {r['steps_per_s']:,.0f} | {ratio} | {spread} |"
        )
    return "\n".join(lines)


def wide_table(results: list[dict]) -> str:
    """One row per (workload, workers x envs/worker), one column per system: steps/s and, in parentheses,
    the ratio to ``serial`` (``vs_serial`` when the rounds were paired)."""
    refs = _reference_rates(results)
    systems = sorted({r["system"] for r in results if "steps_per_s" in r},
                     key=lambda name: (name != REFERENCE, name))
    points = defaultdict(dict)
    for r in results:
        if "steps_per_s" in r:
            key = (r["workload"], r.get("config_workers", r["num_workers"]),
                   r.get("config_envs_per_worker", r["envs_per_worker"]))
            points[key][r["system"]] = r
    lines = ["| workload | workers × envs | " + " | ".join(systems) + " |",
             "|---|---|" + "---:|" * len(systems)]
    for (workload, workers, epw), row in sorted(points.items()):
        cells = []
        for system in systems:
            r = row.get(system)
            if r is None:
                cells.append("-")
            elif system == REFERENCE:
                cells.append(f"{r['steps_per_s']:,.0f}")
            else:
                ref = refs.get((workload, r["num_envs"]))
                ratio = r.get("vs_serial", r["steps_per_s"] / ref if ref else None)
                cells.append(f"{r['steps_per_s']:,.0f}" + (f" ({ratio:.2f}×)" if ratio else ""))
        lines.append(f"| {workload} | {workers} × {epw} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def startup_table(records: list[dict]) -> str:
    """Markdown table of :func:`measure_startup` records."""
    lines = [
        "| workload | system | num_envs | procs | startup s "
        "| worker RSS MB (sum) | worker USS MB (sum) | per worker RSS MB "
        "| leftover |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in sorted(records, key=lambda r: (r["workload"], r["num_envs"],
                                            r["system"])):
        per = ", ".join(f"{m:.0f}" for m in r["worker_rss_mb"])
        lines.append(
            f"| {r['workload']} | {r['system']} | {r['num_envs']} "
            f"| {len(r['worker_rss_mb'])} | {r['startup_s']:.2f} "
            f"| {sum(r['worker_rss_mb']):.0f} "
            f"| {sum(r.get('worker_uss_mb', [])):.0f} | {per} "
            f"| {r.get('leftover_workers', '-')} |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------- plot
def plot_throughput(results: list[dict], path: str | Path) -> Path:
    """Save env steps/s vs requested workers (log y) as a PNG at ``path``.

    Rows are workloads, columns envs per worker; ``serial`` is drawn at the
    ``num_envs`` each configuration implies.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "steps_per_s" in r and "config_workers" in r]
    workloads = sorted({r["workload"] for r in rows})
    epws = sorted({r["config_envs_per_worker"] for r in rows})
    fig, axes = plt.subplots(
        max(1, len(workloads)), max(1, len(epws)), squeeze=False,
        figsize=(4.2 * max(1, len(epws)), 3.2 * max(1, len(workloads))),
    )
    for i, workload in enumerate(workloads):
        for j, epw in enumerate(epws):
            ax = axes[i][j]
            lines = defaultdict(list)
            for r in rows:
                if r["workload"] == workload and r["config_envs_per_worker"] == epw:
                    lines[r["system"]].append((r["config_workers"],
                                               r["steps_per_s"]))
            for system, points in sorted(lines.items()):
                xs, ys = zip(*sorted(points))
                style = "ks--" if system == REFERENCE else "o-"
                ax.plot(xs, ys, style, label=system)
            ax.set_xticks(sorted({r["config_workers"] for r in rows}))
            ax.set_yscale("log")
            ax.set_title(f"{workload}, {epw} env(s)/worker", fontsize=9)
            ax.set_xlabel("workers")
            ax.set_ylabel("env steps/s")
            ax.grid(True, which="both", alpha=0.3)
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels, handles = list(legend), list(legend.values())
    if handles:
        fig.legend(handles, labels, loc="lower center",
                   ncol=min(4, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------- startup
def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return any(marker in cmdline for marker in _HELPER_MARKERS)


def _default_close(obj: Any) -> None:
    # Look the method up on the type: instance attribute lookups can be
    # forwarded to worker processes by some batched envs.
    for name in ("shutdown", "close"):
        method = getattr(type(obj), name, None)
        if callable(method):
            method(obj)
            return


def measure_startup(constructor: Callable[[], Any],
                    first_use: Callable[[Any], Any] | None = None,
                    close: Callable[[Any], None] | None = None) -> dict:
    """Time ``constructor()`` (+ ``first_use(obj)``) and probe worker memory.

    Args:
        constructor: builds the vec-env / collector.
        first_use: optional call that makes lazily started workers exist
            (e.g. ``reset``); its time counts as start-up.
        close: how to release the object; defaults to the type's
            ``shutdown`` or ``close`` method.

    Returns:
        ``{"startup_s", "worker_rss_mb", "worker_uss_mb",
        "leftover_workers"}``: seconds until ready; resident set size (MB)
        of each new descendant process (multiprocessing helper processes
        excluded) - RSS counts pages shared with the parent after ``fork``,
        so the unique set size (USS) is given too; and the number of those
        processes still alive after closing (should be 0).
    """
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    start = time.perf_counter()
    obj = constructor()
    try:
        if first_use is not None:
            first_use(obj)
        startup = time.perf_counter() - start
        workers, rss, uss = [], [], []
        for proc in me.children(recursive=True):
            if proc.pid in before or _is_helper(proc):
                continue
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            rss.append(info.rss / 2**20)
            uss.append(info.uss / 2**20)
            workers.append(proc)
    finally:
        (close or _default_close)(obj)
    _, alive = psutil.wait_procs(workers, timeout=5)
    return {"startup_s": startup, "worker_rss_mb": rss, "worker_uss_mb": uss,
            "leftover_workers": len(alive)}


def plot_ratios(results: list[dict], path: str | Path, systems: list[str]) -> Path:
    """Save a bar chart of each system's ratio to serial (``vs_serial``), one group of bars per point
    (workload, workers x envs), as a PNG at ``path``; a line marks the serial loop (1.0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted({(r["workload"], r["config_workers"], r["config_envs_per_worker"]) for r in results})
    ratio = {(r["workload"], r["config_workers"], r["config_envs_per_worker"], r["system"]): r["vs_serial"]
             for r in results}
    systems = [s for s in systems if any(key[3] == s for key in ratio)]
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(points)), 4.2))
    for i, system in enumerate(systems):
        xs = [p + (i - (len(systems) - 1) / 2) * width for p in range(len(points))]
        ax.bar(xs, [ratio.get((*point, system), 0.0) for point in points], width, label=system)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(len(points)), [f"{w}\n{n} x {k}" for w, n, k in points])
    ax.set_ylabel("env steps/s, ratio to the serial loop")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
