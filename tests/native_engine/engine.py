"""A gymnasium env over ``one_instance_engine.c``: a native engine (a DLL on Windows, a shared object on Linux) that
allows one instance per process, stepped through ctypes. :func:`build` compiles it; :class:`OneInstanceEngineEnv`
is the env, observation float32 ``[4]``, actions ``{0, 1, 2}``; a second instance in one process raises the
engine's own :class:`EngineInUseError`."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_instance_engine.c")
#: where the Windows tier finds the DLL built on the host (the Windows Python cannot run the cross compiler)
LIBRARY_VARIABLE = "TDCOLLECT_TEST_ENGINE_LIBRARY"
_LOADED: dict[str, ctypes.CDLL] = {}


class EngineInUseError(RuntimeError):
    """The engine's own refusal of a second instance in one process."""


def build(folder: str, windows: bool = False) -> str:
    """Compile the engine into ``folder``: a Windows DLL with the mingw-w64 cross compiler (``windows``), else a
    shared object with the host's C compiler. Returns its path."""
    compiler = "x86_64-w64-mingw32-gcc" if windows else (shutil.which("cc") or "gcc")
    path = os.path.join(folder, "one_instance_engine.dll" if windows else "one_instance_engine.so")
    flags = ["-O2", "-shared"] if windows else ["-O2", "-shared", "-fPIC"]
    subprocess.run([compiler, *flags, "-o", path, SOURCE], check=True)
    return path


def library(path: str) -> ctypes.CDLL:
    """The engine loaded in this process (once: a library's globals are per process)."""
    lib = _LOADED.get(path)
    if lib is None:
        lib = ctypes.CDLL(path)
        lib.engine_create.restype = ctypes.c_int
        lib.engine_alive.restype = ctypes.c_int
        lib.engine_reset.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_float)]
        lib.engine_reset.restype = ctypes.c_int
        lib.engine_step.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float)]
        lib.engine_step.restype = ctypes.c_int
        _LOADED[path] = lib
    return lib


class OneInstanceEngineEnv(gym.Env):
    """The engine as a gymnasium env: ``reset(seed=s)`` seeds it, ``step(a)`` steps it; terminated when the first
    observation leaves [-4, 4], truncated after 200 steps."""

    metadata = {"render_modes": []}

    def __init__(self, path: str):
        self._lib = library(path)
        if self._lib.engine_create() != 0:
            raise EngineInUseError(
                f"one_instance_engine allows one instance per process, and process {os.getpid()} has one already "
                "(build each env in a process of its own: envs_per_worker=1)")
        self._alive = True
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._obs = np.zeros(4, dtype=np.float32)
        self._obs_pointer = self._obs.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._reward = ctypes.c_float()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        engine_seed = seed if seed is not None else int(self.np_random.integers(2**63))
        self._lib.engine_reset(engine_seed, self._obs_pointer)
        return self._obs.copy(), {}

    def step(self, action):
        code = self._lib.engine_step(int(action), self._obs_pointer, ctypes.byref(self._reward))
        if code < 0:
            raise ValueError(f"one_instance_engine refused the action {action!r} (it takes 0, 1 or 2)")
        return self._obs.copy(), float(self._reward.value), code == 1, code == 2, {}

    def close(self):
        if self._alive:
            self._lib.engine_destroy()
            self._alive = False


def library_path_for_this_platform(folder: str) -> str:
    """The engine's library for this interpreter: on Windows the DLL that :data:`LIBRARY_VARIABLE` names (built on
    the host by the Windows tier), elsewhere a fresh build in ``folder``."""
    if sys.platform == "win32":
        path = os.environ.get(LIBRARY_VARIABLE)
        if not path or not os.path.exists(path):
            raise RuntimeError(f"{LIBRARY_VARIABLE} must name the engine's DLL, built with tests.native_engine."
                               f"engine.build(folder, windows=True) on the host (got {path!r})")
        return path
    return build(folder)
