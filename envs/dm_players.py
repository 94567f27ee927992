"""Multi-player dm_env envs (MeltingPot substrates): per-player spec sequences become one agent group.

A ``dm_env.Environment`` whose ``observation_spec()``, ``action_spec()`` and ``reward_spec()`` are sequences with
one item per player (a MeltingPot substrate: a list of observation dicts, a tuple of ``DiscreteArray`` actions,
a list of reward arrays) gets the layout of TorchRL's ``MeltingpotEnv``, so a factory can switch between the
two without touching the rest of a pipeline. For ``commons_harvest__open`` (7 players, batch size ``[]``)::

    ("agents", "observation", "RGB")                uint8    [7, 88, 88, 3]   per-player observations
    ("agents", "observation", "READY_TO_SHOOT")     float64  [7, 1]           (a scalar becomes [1])
    ("agents", "observation", "COLLECTIVE_REWARD")  float64  [7, 1]
    "RGB"                                           uint8    [144, 192, 3]    "WORLD.<NAME>" -> "<NAME>",
                                                                              read from player 0's dict
    ("agents", "action")                            int64    [7]              Categorical(8)
    ("agents", "reward")                            float64  [7, 1]
    "done", "terminated", "truncated"               bool     [1]              from the step type and discount

A per-player action dict gives ``("agents", "action", NAME)``. Value conversions follow ``dm_specs.py``
(integer ranges start at 0). Every other dm_env env keeps :func:`~tdcollect.envs.dm_specs.flat_layout`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from torchrl.data import Composite

from .dm_specs import (
    OBSERVATION,
    REWARD,
    DmLayout,
    Slot,
    flat_layout,
    iter_leaves,
    key_of,
    leaf_array,
    stacked_leaf,
)
from .specs import DONE_KEYS

GROUP = "agents"
WORLD = "WORLD."


def layout_of(env) -> DmLayout:
    """The layout of a ``dm_env.Environment``: the agent-group layout (module docstring) when its specs are
    per-player sequences, else :func:`~tdcollect.envs.dm_specs.flat_layout`."""
    return player_list_layout(env) if is_player_list(env) else flat_layout(env)


def is_player_list(env) -> bool:
    """Whether ``env``'s observation spec is a non-empty sequence of per-player dicts and its action and reward
    specs are sequences of the same length."""
    obs, act, rew = env.observation_spec(), env.action_spec(), env.reward_spec()
    return (
        _is_sequence(obs) and len(obs) > 0 and all(isinstance(o, Mapping) for o in obs)
        and _is_sequence(act) and _is_sequence(rew) and len(act) == len(rew) == len(obs)
    )


def player_list_layout(env) -> DmLayout:
    """The agent-group layout of a dm_env env with per-player spec sequences (see the module docstring)."""
    obs_specs, act_specs, rew_specs = list(env.observation_spec()), list(env.action_spec()), list(env.reward_spec())
    n = len(obs_specs)
    names = list(obs_specs[0])
    for player, spec in enumerate(obs_specs):
        if list(spec) != names:
            raise ValueError(f"players' observations differ: player 0 has {names}, player {player} {list(spec)}; "
                             "an agent group needs the same observations for all its players.")

    observation = Composite({GROUP: Composite(observation=Composite(shape=(n,)), shape=(n,))}, shape=())
    obs_slots = []
    for name in names:
        if name.startswith(WORLD):
            key = (name[len(WORLD):],)
            if key[0] in (GROUP, *DONE_KEYS) or key in observation.keys():
                raise ValueError(f"global observation {name!r} would be stored as {key[0]!r}, a key already taken.")
            stacked, offset = _converted([obs_specs[0][name]], name, scalar_as_one=True)
            observation[key] = stacked[0]
            obs_slots.append(Slot((OBSERVATION, 0, name), key, offset))
        else:
            key = (GROUP, "observation", name)
            stacked, offset = _converted([spec[name] for spec in obs_specs], name, scalar_as_one=True)
            observation[key] = stacked
            obs_slots += [Slot((OBSERVATION, p, name), key, offset, player=p) for p in range(n)]

    action = Composite({GROUP: Composite(shape=(n,))}, shape=())
    act_slots = []
    single = not isinstance(act_specs[0], (Mapping, list, tuple))
    for path, _ in iter_leaves(act_specs[0]):
        per_player = [leaf_array(spec, path) for spec in act_specs]
        key = (GROUP, "action") if single else (GROUP, "action", *key_of(path))
        stacked, offset = _converted(per_player, ".".join(key), scalar_as_one=False)
        action[key] = stacked
        act_slots += [Slot((p, *path), key, offset, np.dtype(per_player[p].dtype), p) for p in range(n)]

    if not all(isinstance(r, type(rew_specs[0])) and not isinstance(r, (Mapping, list, tuple)) for r in rew_specs):
        raise TypeError(f"each player's reward spec must be a single array, got {rew_specs[0]!r}.")
    reward_spec, _ = stacked_leaf(rew_specs, "reward", scalar_as_one=True)
    reward = Composite({GROUP: Composite(reward=reward_spec, shape=(n,))}, shape=())
    reward_slots = [Slot((REWARD, p), (GROUP, "reward"), player=p) for p in range(n)]
    return DmLayout(observation, action, reward, observation_slots=obs_slots, action_slots=act_slots,
                    reward_slots=reward_slots)


def _converted(per_player: list, what: str, scalar_as_one: bool):
    try:
        return stacked_leaf(per_player, what, scalar_as_one)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def _is_sequence(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))
