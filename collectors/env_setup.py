"""What a collector accepts as an env, turned into a batched TorchRL env with one batch dimension."""
from __future__ import annotations

import gymnasium as gym
from torchrl.envs import EnvBase

from envs import SerialEnv


def make_batched_env(env_or_factory, owner: str) -> tuple[EnvBase, bool]:
    """Returns ``(env, owned)``. A gymnasium env or an unbatched TorchRL env becomes a one-env SerialEnv;
    a batched TorchRL env (SerialEnv, ParallelEnv, torchrl's own) is used as it is. A callable is called
    first (``owned``: the collector built it, so it closes it)."""
    owned = False
    env = env_or_factory
    if not isinstance(env, (EnvBase, gym.Env)):
        if not callable(env):
            raise TypeError(f"{owner} needs an env or a function that builds one, got {type(env).__name__}.")
        env, owned = env(), True
    if isinstance(env, gym.Env) or (isinstance(env, EnvBase) and env.batch_size == ()):
        instance = env
        env, owned = SerialEnv(1, lambda: instance), True
    if not isinstance(env, EnvBase):
        raise TypeError(
            f"{owner}: the env factory returned {type(env).__name__}; return a gymnasium env or a TorchRL env."
        )
    return env, owned
