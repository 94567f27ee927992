"""A pytest plugin (``-p tests.sb3_suite.substitute``) that makes Stable-Baselines3's ``SubprocVecEnv`` name
``tdcollect.envs.vector.ParallelVecEnv`` before any test module imports it, so that a test file written for
``SubprocVecEnv`` runs against ours. Loaded only in the subprocess that ``runner.py`` starts."""
from __future__ import annotations

import stable_baselines3.common.env_util as env_util
import stable_baselines3.common.vec_env as vec_env

from tdcollect.envs.vector import ParallelVecEnv

vec_env.SubprocVecEnv = ParallelVecEnv
if hasattr(env_util, "SubprocVecEnv"):
    env_util.SubprocVecEnv = ParallelVecEnv


def pytest_report_header(config):
    return f"SubprocVecEnv is {ParallelVecEnv.__module__}.{ParallelVecEnv.__name__}"
