"""close() lets go of memory and files at once, without Python's garbage collector: on every face, create / use /
close cycles (200 in the long tier, 10 in the default run; Ray: 10, in the long tier only, its cluster takes
minutes to start; the faces that also kill and replace a worker in every cycle: 50 / 4) in a process that runs
with the collector disabled leave its open files, its mapped shared memory and its child processes where they were
after a few warm-up cycles (see ``tests/cycles.py``). An env dropped without close() lets go of the same things (its
last reference goes: no reference cycle holds it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cycles import FACES

ROOT = Path(__file__).resolve().parent.parent
#: (cycles, Ray's cycles, cycles of the faces that kill and replace a worker each cycle: ~1 s each), per tier; Ray's
#: cluster alone takes minutes to start and settle, so its cycles run in the long tier only
CYCLES = {"short": (10, 0, 4), "long": (int(os.environ.get("TDCOLLECT_CLOSE_CYCLES", "200")), 10, 50)}
FILES_SLACK = 3
SHARED_SLACK = 4 * 2**20


def cycled(face: str, cycles: int, timeout: float) -> dict:
    run = subprocess.run([sys.executable, "-m", "tests.cycles", face, str(cycles)], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(960)
@pytest.mark.parametrize("face, tier", [
    pytest.param(face, tier, marks=[*([pytest.mark.ray] if face == "ray" else []),
                                    *([pytest.mark.long] if tier == "long" else [])])
    for tier in ("short", "long") for face in FACES if CYCLES[tier][1] or face != "ray"])
def test_create_use_close_cycles_hold_nothing_without_the_garbage_collector(face, tier, no_leaks):
    """``short``: 10 cycles (the default run: a rollout's frames held per cycle would pass the slack by then);
    ``long``: 200 (``-m long``, run by CI)."""
    if face == "ray":
        pytest.importorskip("ray")
    plain, ray, restart = CYCLES[tier]
    cycles = ray if face == "ray" else restart if face.endswith("-restart") else plain
    out = cycled(face, cycles, timeout=900)
    before, after = out["before"], out["after"]
    assert after["files"] - before["files"] <= FILES_SLACK, f"{face}: open files grew: {before} -> {after}"
    assert after["shared_bytes"] - before["shared_bytes"] <= SHARED_SLACK, f"{face}: mapped shared memory grew: " \
                                                                             f"{before} -> {after}"
    assert after["children"] <= before["children"], f"{face}: child processes left: {before} -> {after}: " \
                                                    f"{after['left']}"


def test_a_dropped_env_is_freed_by_its_last_reference(no_leaks):
    """No reference cycle holds a ParallelEnv: dropped unclosed with the collector disabled, it closes (its workers
    exit, its buffers' files close) when its last reference goes."""
    code = (
        "import gc, os, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "from tests.cycles import frames, sample\n"
        "from tdcollect.envs import ParallelEnv\n"
        "gc.disable()\n"
        "env = ParallelEnv(2, frames, envs_per_worker=2)\n"
        "env.rollout(10, break_when_any_done=False)\n"
        "before = sample()\n"
        "held = env.rollout(10, break_when_any_done=False)\n"
        "del env\n"
        "after_env = sample()\n"
        "del held\n"
        "after = sample()\n"
        "print(before['children'], after_env['children'], after['files'], after['shared_bytes'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    children_before, children_after, files, shared = map(int, run.stdout.split())
    assert children_before == 2 and children_after == 0, "the dropped env's workers did not exit"
    assert shared == 0, "shared memory still mapped after the env and its rollout were dropped"
    assert files <= 8, f"{files} files open after the env and its rollout were dropped"
