"""A /dev/shm too small for the buffers is a SharedMemoryError at construction on every face (how much was
needed, how much is free, the fix), never a SIGBUS, with no process and no segment left behind. Each case runs
in a child with its own small tmpfs over /dev/shm (a private mount namespace: needs root and unshare)."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.faces import FACES

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import os, sys
sys.path.insert(0, {root!r})
import numpy as np, gymnasium as gym, psutil
from gymnasium import spaces
from tests.faces import build

class Big(gym.Env):
    observation_space = spaces.Box(0, 255, (600, 600, 3), np.uint8)  # 1 MiB a frame
    action_space = spaces.Discrete(2)
    def reset(self, *, seed=None, options=None): return np.zeros((600, 600, 3), np.uint8), {{}}
    def step(self, a): return np.zeros((600, 600, 3), np.uint8), 0.0, False, False, {{}}

if {fill}:  # leave 8 KiB: even the smallest segment cannot be had
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    with open("/dev/shm/filler", "wb") as f:
        f.write(b"x" * (free - 8192))
try:
    owner = build({face!r}, Big)
    print("BUILT")
except Exception as err:
    print("ERROR", type(err).__name__, err)
    cause = getattr(err, "exc_type", None)
    print("TYPE", cause or type(err).__name__)
if {fill}:
    os.remove("/dev/shm/filler")
busy = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
print("LEFT", len(busy), sorted(os.listdir("/dev/shm")))
"""


def _in_small_shm(face: str, fill: bool) -> str:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give the test a small /dev/shm of its own")
    script = SCRIPT.format(root=ROOT, face=face, fill=fill)
    done = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=3M tmpfs /dev/shm && exec "
                           f"{sys.executable} -c \"$0\"", script], capture_output=True, text=True, timeout=100)
    if "mount" in done.stderr and done.returncode != 0 and "ERROR" not in done.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])  # -7 would be SIGBUS
    return done.stdout


@pytest.mark.parametrize("face", [f for f in FACES if f != "serial"])
def test_buffers_larger_than_dev_shm_are_a_clear_error(face):
    out = _in_small_shm(face, fill=False)
    assert "TYPE SharedMemoryError" in out, out
    assert "not enough shared memory for " in out and "MiB needed" in out and "free in /dev/shm" in out, out
    assert "--shm-size" in out
    assert "LEFT 0 []" in out, out


@pytest.mark.parametrize("face", ["parallel", "vector", "sb3"])
def test_a_full_dev_shm_is_a_clear_error_even_for_small_segments(face):
    out = _in_small_shm(face, fill=True)
    assert "TYPE SharedMemoryError" in out, out
    assert "LEFT 0 []" in out, out


def test_serial_env_needs_no_shared_memory():
    assert "BUILT" in _in_small_shm("serial", fill=False)
