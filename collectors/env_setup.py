"""What a collector accepts as an env, turned into a batched TorchRL env with one batch dimension."""
from __future__ import annotations

import cloudpickle
from torchrl.envs import EnvBase

from tdcollect.envs import SerialEnv
from tdcollect.envs.factories import is_env_instance
from tdcollect.envs.shared import EnvSpecs

from .policies import make_policy, policy_module


def make_batched_env(env_or_factory, owner: str) -> tuple[EnvBase, bool, bool]:
    """Returns ``(env, owned, unbatched)``. A batched TorchRL env (SerialEnv, ParallelEnv, torchrl's own) is used
    as it is; any other env the engine steps (a gymnasium env, an unbatched TorchRL env, a ``dm_env`` env such as a
    MeltingPot substrate) becomes a one-env SerialEnv, which raises a ``TypeError`` for anything else. A
    callable that is not an env is called first (``owned``: the collector built it, so it closes it).
    ``unbatched``: the env was wrapped (its batches are ``[T]`` in TorchRL's layout, not ``[1, T]``)."""
    owned = False
    env = env_or_factory
    if not is_env_instance(env):
        if not callable(env):
            raise TypeError(f"{owner} needs an env or a function that builds one, got {type(env).__name__}.")
        env, owned = env(), True
    if not isinstance(env, EnvBase) or env.batch_size == ():
        instance = env
        return SerialEnv(1, lambda: instance, owner=owner), True, True
    return env, owned, False


def worker_specs(env: EnvBase) -> EnvSpecs:
    """The specs of one env of a worker's batched ``env``: what a remote collector worker reports at start-up, so
    that the main process can check that every worker steps the same envs (bounds included)."""
    return EnvSpecs(env.full_observation_spec[0], env.full_action_spec[0], env.full_reward_spec[0],
                    env.full_done_spec[0])


def build_worker(factory, policy_payload: bytes | None, policy_device, owner: str):
    """What every remote collector worker (a MultiSyncCollector process, a RayCollector actor) builds first:
    its env (from ``factory``, as :func:`make_batched_env`), and its policy copy (``policy_payload``: the
    user's policy, cloudpickled; ``None``: random actions). Returns ``(env, policy, module, unbatched)``: ``policy`` is
    the per-step callable of :func:`~tdcollect.collectors.policies.make_policy`, ``module`` the user's ``nn.Module``
    holding the weights (or ``None``). On failure the env is closed before the error propagates."""
    env, _, unbatched = make_batched_env(factory, owner)
    try:
        user_policy = cloudpickle.loads(policy_payload) if policy_payload is not None else None
        policy = make_policy(user_policy, env.full_action_spec, policy_device)
        module = policy_module(user_policy)  # the user's module, as the shared weights were taken from it
    except BaseException:
        env.close()
        raise
    return env, policy, module, unbatched
