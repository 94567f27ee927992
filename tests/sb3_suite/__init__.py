"""Stable-Baselines3's own vec-env tests, run against ``ParallelVecEnv`` (see ``runner.py``)."""
