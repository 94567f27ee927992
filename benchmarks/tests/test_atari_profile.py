"""The Atari road's profile (``benchmarks/atari_profile.py``): its parts are measured on live games and its ceiling
processes step and end."""
from __future__ import annotations

import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from benchmarks import atari_profile  # noqa: E402 - after the skips


def test_the_profile_times_each_part_of_a_step():
    profile = atari_profile.per_step_profile(steps=40)
    parts = ("emulator", "screens", "max-pool", "resize", "stack")
    assert all(profile[part] > 0 for part in parts), profile
    assert profile["native step (sum)"] == pytest.approx(sum(profile[part] for part in parts))
    assert profile["gymnasium's step of the chain"] > 0


def test_the_ceiling_runs_its_processes_to_the_end(no_leaks):
    assert atari_profile.ceiling(steps=5, envs_per_worker=2) > 0
