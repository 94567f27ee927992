"""TorchRL's ``auto_register_policy_transforms``: the env transforms a policy needs, appended to the env that lacks
them — ``InitTracker`` (the ``"is_init"`` entry recurrent modules read) and the ``TensorDictPrimer`` of every
recurrent module (their hidden states)."""
from __future__ import annotations

from torch import nn
from torchrl.envs import EnvBase

from tdcollect.envs.engine.user_warnings import warn_caller


def missing_transforms(env: EnvBase, policy) -> list:
    """The transforms ``policy`` needs that ``env``'s specs do not show yet (``[]`` for a policy that is not an
    ``nn.Module``): what TorchRL's collectors append."""
    if not isinstance(policy, nn.Module):
        return []
    from torchrl.envs.transforms import Compose, InitTracker
    from torchrl.modules import get_primers_from_module

    keys = set(env.full_observation_spec.keys(True, True)) | set(env.full_state_spec.keys(True, True))
    out = []
    if not any(key == "is_init" or (isinstance(key, tuple) and key[-1] == "is_init") for key in keys):
        out.append(InitTracker())
    primer = get_primers_from_module(policy, warn=False, strict=False)
    primers = list(primer) if isinstance(primer, Compose) else [primer] if primer is not None else []
    return out + [p for p in primers if not set(p.primers.keys(True, True)) <= keys]


def with_policy_transforms(env: EnvBase, policy, register: bool | None, owner: str) -> EnvBase:
    """``env`` with the transforms ``policy`` needs appended when ``register`` is True. ``None`` (TorchRL's
    default until v0.15) appends nothing, with TorchRL's ``FutureWarning`` when the policy has recurrent state the
    env does not prime; ``False`` appends nothing, silently."""
    if register is False or not isinstance(policy, nn.Module):
        return env
    missing = missing_transforms(env, policy)
    if register is None:
        primed = [type(t).__name__ for t in missing if type(t).__name__ != "InitTracker"]
        if primed:
            warn_caller(f"{owner}: the env lacks transforms the policy needs ({', '.join(primed)}, InitTracker). "
                        "From torchrl v0.15 collectors append them; pass auto_register_policy_transforms=True to "
                        "have them appended now, or False to silence this warning.", FutureWarning)
        return env
    if not missing:
        return env
    from torchrl.envs import Compose, TransformedEnv

    return TransformedEnv(env, Compose(*missing))
