"""TorchRL's ``GymEnv`` under the per-env transforms of TorchRL's Atari scripts, stepped natively.

TorchRL's Atari scripts build each env as ``TransformedEnv(GymEnv(...), [NoopResetEnv(...), EndOfLifeTransform()])``
(``sota-implementations/*/utils_atari.py: make_base_env``). Through TorchRL's ``TransformedEnv`` each step of such an
env costs TorchRL's per-step code twice over (the transformed env's and the ``GymEnv``'s). Here the gymnasium env
inside is stepped on the ``GymEnv`` native road (``gymenv.py``) and the two transforms' entries are written with it,
with TorchRL's values:

- ``NoopResetEnv(noops, random)``: after each reset (asked for, or after an episode's end), ``noops`` steps (with
  ``random``, a count drawn as TorchRL draws it, ``torch.randint(noops, (1,))``) of actions drawn from the env's
  action spec (``spec.rand()``: the same torch RNG draws as TorchRL's ``rand_step``); an episode that ends during
  them is reset and the count started again, up to TorchRL's number of trials; the reset's observation is the last
  step's;
- ``EndOfLifeTransform()`` (default keys and ``eol_attribute``): ``"lives"`` (int64, the env's lives read through
  ``eol_attribute`` after each step and reset) and ``"end-of-life"`` (bool ``[1]``: the step lost a life, or ended the
  episode; False after a reset).

Anything else under a ``TransformedEnv`` (another transform, other keys, the two in the other order) keeps TorchRL's
step, with the reason (``env.roads()``). As on TorchRL's road in a worker, the lives a step compares with are the
ones this env's last root held here (a caller's edit of the root's ``"lives"`` is not seen).
"""
from __future__ import annotations

import torch
from torchrl.envs import TransformedEnv
from torchrl.envs.libs.gym import GymWrapper
from torchrl.envs.transforms import EndOfLifeTransform, NoopResetEnv

from ..engine.stepper import Family
from .envbase import marked_stepper, specs_of, transform_parts
from .gymenv import GymEnvStepper
from .gymenv import why_not_native as why_not_native_gymenv

NATIVE = "native: the gymnasium env stepped by tdcollect under NoopResetEnv / EndOfLifeTransform, TorchRL's data"

#: TorchRL's NoopResetEnv: how many times the noops are started again when episodes keep ending during them
MAX_NOOP_TRIALS = 10
COVERED = ([NoopResetEnv], [EndOfLifeTransform], [NoopResetEnv, EndOfLifeTransform])
EOL_KEYS = ("end-of-life", "lives")


def why_not_native(env: TransformedEnv) -> str | None:
    """None when ``env`` (a ``TransformedEnv`` over a TorchRL ``GymEnv`` / ``GymWrapper``) can take the native road;
    else why it cannot, in a few words (see the module docstring)."""
    if type(env) is not TransformedEnv:
        return f"{type(env).__name__} is a subclass of TransformedEnv"
    reason = why_not_native_gymenv(env.base_env)
    if reason is not None:
        return reason
    parts = transform_parts(env.transform)
    kinds = [type(part) for part in parts]
    if kinds not in COVERED:
        names = ", ".join(kind.__name__ for kind in kinds)
        return f"per-env transforms [{names}] (natively: NoopResetEnv, EndOfLifeTransform, in that order)"
    added = []
    for part in parts:
        if type(part) is EndOfLifeTransform:
            if (part.eol_key, part.lives_key, part.done_key) != (*EOL_KEYS, "done"):
                return "EndOfLifeTransform with other keys"
            added = list(EOL_KEYS)
            try:
                _lives_owner(env.base_env, list(part.eol_attribute))
            except AttributeError as missing:
                return f"EndOfLifeTransform finds no lives ({missing})"
    base, transformed = specs_of(env.base_env), specs_of(env)
    observed = sorted(set(transformed.observation.keys()) - set(base.observation.keys()))
    if observed != sorted(added) or set(base.observation.keys()) - set(transformed.observation.keys()):
        return f"observation entries {observed} where {sorted(added)} were expected"
    if transformed.action != base.action or transformed.reward != base.reward or transformed.done != base.done:
        return "the transforms change the action, reward or done specs"
    return None


class TransformedGymEnvStepper(GymEnvStepper):
    """A ``TransformedEnv(GymEnv, [NoopResetEnv, EndOfLifeTransform])`` on the native road (see the module
    docstring). ``env``: the ``TransformedEnv`` (forwarded attributes, seeding and closing reach it); ``base``: the
    ``GymEnv`` inside; ``gym_env``: the gymnasium env stepped."""

    road = NATIVE

    def __init__(self, env: TransformedEnv):
        super().__init__(env.base_env)
        self.base = env.base_env
        self.env = env
        self.specs = specs_of(env)
        parts = transform_parts(env.transform)
        noop = next((part for part in parts if type(part) is NoopResetEnv), None)
        #: (noops, random) of the NoopResetEnv, or None
        self.noops = None if noop is None else (noop.noops, noop.random)
        eol = next((part for part in parts if type(part) is EndOfLifeTransform), None)
        #: the path to the env's lives from the TorchRL env (EndOfLifeTransform's eol_attribute), or None
        self.lives_path = None if eol is None else list(eol.eol_attribute)
        # the object holding the lives (e.g. the ALE interface), reached once: through TorchRL's attribute lookup
        # (its fallback onto the gymnasium env lists the env's attributes: ~0.25 ms a call)
        self._lives_owner = None if self.lives_path is None else _lives_owner(self.base, self.lives_path)
        self._root_lives = 0  # the lives in this env's root: a step that has fewer lost one

    def step(self) -> None:
        i = self._i
        obs, reward, terminated, truncated = self._advance(self._read_action(self._action, i))
        self._write_observation(obs, self._next, "step()")
        done = self._write_outcome(reward, terminated, truncated)
        if self.lives_path is not None:
            lives = self._lives()
            self._next["end-of-life"][i, 0] = bool(done) or self._root_lives > lives
            self._next["lives"][i] = lives
        if done:
            self._reset_env(self.autoreset, "reset()")
            return
        self._write_observation(obs, self._root, "step()")
        if self.lives_path is not None:
            self._root["end-of-life"][i, 0] = self._next["end-of-life"][i, 0]
            self._root["lives"][i] = lives
            self._root_lives = lives

    def _reset_env(self, reset, call: str) -> None:
        """Reset the env with ``reset`` (no arguments, ``-> (observation, info)``), take the noops, write the root
        and the lives (``reset`` and ``reset_into_seed`` are the native stepper's, through this)."""
        obs, _ = reset()
        if self.noops is not None:
            obs = self._take_noops(obs)
        self._write_observation(obs, self._root, call)
        if self.lives_path is not None:
            self._root_lives = self._lives()
            self._root["end-of-life"][self._i, 0] = False
            self._root["lives"][self._i] = self._root_lives

    def _take_noops(self, obs):
        """NoopResetEnv's steps after a reset whose observation is ``obs``; returns the last observation."""
        noops, random = self.noops
        count = noops if not random else torch.randint(noops, (1,)).item()
        for _ in range(MAX_NOOP_TRIALS + 1):
            for _ in range(count):
                action = self.base.full_action_spec.rand()["action"].numpy()[None]
                obs, _, terminated, truncated = self._advance(self._read_action(action, 0))
                if terminated or truncated:
                    obs, _ = self.gym_env.reset()
                    break
            else:
                return obs
        raise RuntimeError(f"Parent env was repeatedly done or truncated before the sampled number of noops "
                           f"(={count}) could be applied. ")

    def _lives(self) -> int:
        """The env's lives, read as ``EndOfLifeTransform`` reads them (its ``eol_attribute`` from the TorchRL env;
        the objects on the way are reached once, when the stepper is built)."""
        lives = getattr(self._lives_owner, self.lives_path[-1])
        return int(lives() if callable(lives) else lives)


def _lives_owner(env, path: list[str]):
    """The object whose attribute ``path[-1]`` holds the lives, reached from the TorchRL env ``env`` through
    ``path[:-1]`` as ``EndOfLifeTransform`` reaches it (an ``AttributeError`` where it is missing)."""
    owner = env
    for name in path[:-1]:
        owner = getattr(owner, name)
    getattr(owner, path[-1])
    return owner


def _stepper(env) -> TransformedGymEnvStepper | None:
    """The native stepper of a ``TransformedEnv`` over a TorchRL ``GymEnv`` that can take this road; None for any
    other env (one over a ``GymEnv`` that cannot is marked with the reason, and stepped by the TorchRL family)."""
    if not isinstance(env, TransformedEnv) or not isinstance(env.base_env, GymWrapper):
        return None
    return marked_stepper(env, why_not_native(env), NATIVE, TransformedGymEnvStepper)


FAMILY = Family(name="TorchRL GymEnv under per-env transforms", priority=14, stepper=_stepper)
