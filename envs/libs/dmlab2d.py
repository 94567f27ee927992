"""The dmlab2d family: ``DMLab2dEnv``, a DeepMind Lab2D level (``dmlab2d.Lab2d`` + ``dmlab2d.Environment``) as a
TorchRL env, stepped by the dm_env family's stepper with its own layout.

The engine names per-player values ``"<player>.<NAME>"`` (players 1..n): observations ``"1.RGB"``, actions
``"1.move"``, rewards ``"1.REWARD"``. Here they are grouped under ``"agents"``, the player dimension first;
other observations (``"WORLD.RGB"``, ...) keep their engine name at the top level. For
``commons_harvest`` with 3 players (batch size ``[]``; a batched env puts its batch dims in front)::

    ("agents", "RGB")               uint8    [3, 88, 88, 3]   per-player observations: ("agents", NAME)
    ("agents", "POSITION")          float64  [3, 2]
    ("agents", "LAYER")             int32    [3, 11, 11, 4]
    "WORLD.RGB"                     uint8    [208, 224, 3]    global observations: their engine name
    "WORLD.ZAP_COUNT"               int32    [3, 3]
    ("agents", "action", "move")    int64    [3]              Categorical(5)
    ("agents", "action", "turn")    int64    [3]              Categorical(3): 0, 1, 2 mean -1, 0, 1
    ("agents", "action", "zap")     int64    [3]              Categorical(2)
    ("agents", "reward")            float32  [3, 1]           from the "<player>.REWARD" observations
    "done", "terminated", "truncated"  bool  [1]              from the dm_env step type and discount

With one player the layout is the same with 3 -> 1. A level without numbered names (``chase_eat``,
``pushbox``) has no ``"agents"`` group: observations at the top level, ``("action", NAME)``, and
``"reward"`` ``[1]`` from the timestep. Value conversions follow ``dm_env.py`` (integer ranges start at 0);
text observations (``"GLOBAL.TEXT"``) and text actions are left out.

``dmlab2d.Lab2d`` cannot be pickled and some engines allow one instance per process: give batched envs a
constructor, ``ParallelEnv(4, lambda: DMLab2dEnv("commons_harvest"))``, and each env is built in its worker.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase

from ..engine.shared import merge_specs, numpy_tree
from ..engine.specs import DONE_KEYS
from ..engine.stepper import Family, of_package
from .dm_env import (
    OBSERVATION,
    ActionReader,
    DmEnvStepper,
    DmLayout,
    Slot,
    TimestepWriter,
    done_flags,
    leaf_to_spec,
    stacked_leaf,
)

if TYPE_CHECKING:
    import dmlab2d

GROUP = "agents"
_PER_PLAYER = re.compile(r"^(\d+)\.(.+)$")


class DMLab2dEnv(EnvBase):
    """One DeepMind Lab2D level, batch size ``[]`` (key layout in the module docstring).

    Args:
        level_name: a level shipped with dmlab2d (``"commons_harvest"``, ``"clean_up"``,
            ``"running_with_scissors"``, ``"chase_eat"``, ``"pushbox"``) or a path the engine understands.
        settings: level settings, e.g. ``{"numPlayers": 3}``; values may be str, int, float, bool or nested
            dicts / lists (flattened to the engine's dotted string settings).
        observation_names: which observations to expose: engine names (``"WORLD.RGB"``) or per-player names
            without the player prefix (``"RGB"`` = every player's RGB). Default: every non-text observation.
            Per-player rewards are read whatever this selects.
        seed: seed of the episode seeds (``set_seed`` replaces it); None: from the OS.
    """

    def __init__(
        self,
        level_name: str,
        settings: Mapping | None = None,
        observation_names: Sequence[str] | None = None,
        *,
        seed: int | None = None,
    ):
        super().__init__(batch_size=torch.Size([]), device=torch.device("cpu"))
        self.level_name = level_name
        engine_settings = engine_settings_for(level_name, settings)
        try:
            self._lab = dmlab2d_module().Lab2d(dmlab2d_module("dmlab2d.runfiles_helper").find(), engine_settings)
        except Exception as exc:  # noqa: BLE001 - the engine reports bad settings as ValueError / RuntimeError
            raise ValueError(
                f"dmlab2d could not build level {level_name!r} with settings {engine_settings}: {exc}"
            ) from exc
        exposed, fetched = _observation_names(self._lab, observation_names)
        self._fetched = fetched
        self._dm = dmlab2d_module().Environment(self._lab, fetched, seed=seed)
        self.layout = dmlab2d_layout(self._dm, exposed)
        self.full_observation_spec = self.layout.observation.clone()
        self.full_action_spec = self.layout.action.clone()
        self.full_reward_spec = self.layout.reward.clone()
        self.full_done_spec = self.layout.done.clone()
        self._bind_buffers()

    @property
    def num_players(self) -> int:
        """Players in the level (0 for a level without per-player names)."""
        return self.layout.observation[GROUP].shape[0] if GROUP in self.layout.observation.keys() else 0

    @property
    def dm_env(self) -> dmlab2d.Environment:
        """The engine's own ``dm_env`` view (replaced by ``set_seed``)."""
        return self._dm

    def native_stepper(self) -> LevelStepper:
        """The stepper batched envs use for this env: the engine's values go straight into their buffers,
        skipping ``EnvBase.step`` (same data, several times faster)."""
        return LevelStepper(self)

    def _bind_buffers(self) -> None:
        """Unbatched buffers the engine's values are written into, then cloned out each call."""
        layout = self.layout
        self._root_td = merge_specs(layout.observation, layout.done).zero()
        self._next_td = merge_specs(layout.observation, layout.reward, layout.done).zero()
        self._action_td = layout.action.zero()
        root, nxt, action = (numpy_tree(td) for td in (self._root_td, self._next_td, self._action_td))
        self._write_root = TimestepWriter(layout.observation_slots, root)
        self._write_next = TimestepWriter(layout.observation_slots + layout.reward_slots, nxt)
        self._read_action = ActionReader(layout.action_slots, action)
        self._flags = [nxt[key] for key in DONE_KEYS]
        self._action_keys = list(layout.action.keys(True, True))

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        self._write_root(self._dm.reset())
        return self._root_td.clone()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        for key in self._action_keys:
            self._action_td.get(key).copy_(tensordict.get(key))
        timestep = self._dm.step(self._read_action())
        self._write_next(timestep)
        for array, flag in zip(self._flags, done_flags(timestep)):
            array[...] = flag
        return self._next_td.clone()

    def _set_seed(self, seed: int | None) -> None:
        """A fresh ``dmlab2d.Environment`` over the same engine, its episode seeds drawn from ``seed``."""
        self._dm = dmlab2d_module().Environment(self._lab, self._fetched, seed=seed)

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Release the engine (dropping the last reference frees it); idempotent."""
        self._dm = self._lab = None
        super().close(raise_if_closed=raise_if_closed)


class LevelStepper(DmEnvStepper):
    """Steps a :class:`DMLab2dEnv`'s ``dm_env`` with the env's layout; seeds and closes through the env."""

    def __init__(self, level: DMLab2dEnv):
        super().__init__(level.dm_env, layout=level.layout)
        self.level = level

    def seed(self, seed: int) -> None:
        self.level.set_seed(seed)
        self.env = self.source = self.level.dm_env

    def close(self) -> None:
        self.level.close()


def dmlab2d_module(module: str = "dmlab2d"):
    """``dmlab2d`` (or one of its modules), imported when a level is built: a ``ModuleNotFoundError`` that says how to
    install the optional package when it is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as missing:  # the optional extra is not installed
        if (missing.name or "").split(".")[0] not in ("dmlab2d", "dm_env"):
            raise
        raise ModuleNotFoundError(
            f"DMLab2dEnv needs the optional dmlab2d package ({missing}); install it with: "
            'pip install "tdcollect[dmlab2d]"',
            name=missing.name,
        ) from missing


def engine_settings_for(level_name: str, settings: Mapping | None) -> dict[str, str]:
    """The engine's flat string settings: ``{"levelName": level_name, **flattened settings}``."""
    settings = dict(settings or {})
    if "levelName" in settings:
        raise ValueError("give the level as DMLab2dEnv's level_name, not as settings['levelName'].")
    return {"levelName": str(level_name), **dmlab2d_module("dmlab2d.settings_helper").flatten_args(settings)}


def _observation_names(lab, requested: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """``(exposed, fetched)`` engine names: the observations to expose, and those plus the rewards."""
    numeric = [n for n in lab.observation_names() if np.dtype(lab.observation_spec(n)["dtype"]).kind != "O"]
    rewards = [n for n in numeric if _split(n)[1] == "REWARD" and _split(n)[0] is not None]
    if requested is None:
        exposed = [n for n in numeric if n not in rewards]
    else:
        if isinstance(requested, str):
            raise TypeError("observation_names takes a list of names, e.g. ['RGB', 'WORLD.RGB'].")
        exposed = []
        for name in requested:
            matches = [n for n in numeric if n == name or _split(n)[1] == name and _split(n)[0] is not None]
            if not matches:
                text = [n for n in lab.observation_names() if n not in numeric]
                hint = f" (text observations such as {text} are not supported)" if name in text else ""
                raise ValueError(
                    f"level has no observation {name!r}{hint}; available: {numeric} (per-player names may "
                    "be given without the player prefix, e.g. 'RGB')."
                )
            exposed += [n for n in matches if n not in exposed]
    return exposed, exposed + [n for n in rewards if n not in exposed]


def _split(name: str) -> tuple[int | None, str]:
    """``"2.RGB"`` -> ``(2, "RGB")``; ``"WORLD.RGB"`` -> ``(None, "WORLD.RGB")``."""
    match = _PER_PLAYER.match(name)
    return (int(match.group(1)), match.group(2)) if match else (None, name)


def dmlab2d_layout(env: dmlab2d.Environment, exposed: Sequence[str]) -> DmLayout:
    """The grouped layout of a Lab2D ``dm_env`` (see the module docstring).

    ``exposed``: the engine observation names that become observations (the others fetched by ``env``,
    i.e. ``"<player>.REWARD"``, become rewards).
    """
    obs_specs = env.observation_spec()
    act_specs = {n: s for n, s in env.action_spec().items() if np.dtype(s.dtype).kind != "O"}
    players = sorted({p for p, _ in map(_split, [*obs_specs, *act_specs]) if p is not None})
    if players and players != list(range(1, len(players) + 1)):
        raise ValueError(f"expected players 1..n in the engine's names, found players {players}.")
    n = len(players)

    observation = Composite(shape=())
    obs_slots = _place(observation, {k: obs_specs[k] for k in exposed}, (), (OBSERVATION,), n)
    action = Composite(shape=())
    act_slots = _place(action, act_specs, ("action",), (), n)
    reward_names = [f"{p}.REWARD" for p in players]
    if players and all(name in obs_specs and name not in exposed for name in reward_names):
        reward = Composite({GROUP: Composite(reward=Unbounded((n, 1), dtype=torch.float32), shape=(n,))},
                           shape=())
        reward_slots = [Slot((OBSERVATION, name), (GROUP, "reward"), player=p)
                        for p, name in enumerate(reward_names)]
    else:
        reward = Composite(reward=Unbounded((1,), dtype=torch.float32), shape=())
        reward_slots = [Slot(("reward",), ("reward",))]
    return DmLayout(observation, action, reward, observation_slots=obs_slots, action_slots=act_slots,
                    reward_slots=reward_slots)


def _place(target: Composite, specs: dict, prefix: tuple, source_root: tuple, n: int) -> list[Slot]:
    """Put each engine spec into ``target``: per-player ones stacked at ``(GROUP, *prefix, NAME)`` (shape
    ``[n, ...]``), the others at ``(*prefix, name)``; return the slots (source ``(*source_root, name)``)."""
    slots = []
    grouped = {}
    for name, spec in specs.items():
        player, base = _split(name)
        if player is None:
            converted, offset = leaf_to_spec(spec)
            target[(*prefix, name)] = converted
            slots.append(Slot((*source_root, name), (*prefix, name), offset, np.dtype(spec.dtype)))
        else:
            grouped.setdefault(base, {})[player] = spec
    if grouped and GROUP not in target.keys():
        target[GROUP] = Composite(shape=(n,))
    for base, per_player in grouped.items():
        if sorted(per_player) != list(range(1, n + 1)):
            raise ValueError(f"{base!r} exists for players {sorted(per_player)} only, not for all {n}.")
        stacked, offset = stacked_leaf([per_player[p] for p in range(1, n + 1)], base)
        group = target[GROUP]
        for part in prefix:
            if part not in group.keys():
                group[part] = Composite(shape=(n,))
            group = group[part]
        group[base] = stacked
        for player in range(1, n + 1):
            slots.append(Slot((*source_root, f"{player}.{base}"), (GROUP, *prefix, base), offset,
                              np.dtype(per_player[1].dtype), player - 1))
    return slots


def _is_engine_object(obj) -> bool:
    """A ``dmlab2d.Lab2d`` or ``dmlab2d.Environment`` (not picklable: a constructor must build it in the worker)."""
    return of_package(obj, "dmlab2d")


FAMILY = Family(name="dmlab2d", priority=40, is_instance=_is_engine_object)
