"""The env families: one module each, holding all that the engine and the faces need to know of that family.

::

    gym.py          gymnasium.Env: spaces -> specs, value checks and writers, GymStepper / GymBlockStepper
    atari.py        gymnasium's Atari preprocessing (AtariPreprocessing, FrameStackObservation over the ALE)
                    stepped natively with the ALE: AtariFrames (also each face's env.step), AtariStepper
    gymenv.py       TorchRL GymEnv / GymWrapper: the gymnasium env inside stepped natively, TorchRL's data
    gymenv_transforms.py  the same under TorchRL's per-env Atari transforms (NoopResetEnv, EndOfLifeTransform)
    envbase.py      TorchRL EnvBase (unbatched or batched): TorchRLStepper, or the env's own native_stepper()
    dm_env.py       dm_env.Environment: specs -> TorchRL specs, multi-player layouts, DmEnvStepper
    dmlab2d.py      DMLab2dEnv: a DeepMind Lab2D level as a TorchRL env (stepped by dm_env's stepper)
    meltingpot.py   MeltingPot substrates: refusing an instance, the costly import, the installer
    pettingzoo.py   PettingZoo parallel / AEC envs: stepped as TorchRL's PettingZooWrapper

Each module defines ``FAMILY``, a :class:`~tdcollect.envs.engine.stepper.Family` (how to recognise the family's
envs, their stepper, their costly imports); it imports its family's own package only when one of its envs is met,
so every module here imports without it. A module imports the engine, never another family's module, except those
that build on another family's road: ``dmlab2d.py`` on dm_env's conversions and stepper, ``gymenv.py`` on the
gymnasium and TorchRL families and the Atari road (a ``GymWrapper`` around gymnasium's Atari preprocessing),
``gymenv_transforms.py`` on ``gymenv.py``, ``atari.py`` on the gymnasium family's stepper. A family's stand-in for
an env's own ``step`` (``Family.native_env``, e.g. ``atari.py``'s) reaches the faces through :func:`native_env`.

**Adding a family** is adding one module here with a ``FAMILY`` (found at import), or, for a family that lives in
your own code, :func:`register` with your ``Family``.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..engine.stepper import Family

_REGISTERED: list[Family] = []


def _discovered() -> list[Family]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, Family):
            found.append(family)
    return found


def register(family: Family) -> None:
    """Add ``family`` to the families every batched env built from now on steps (tried in ``priority`` order).
    Under the ``spawn`` and ``forkserver`` start methods the families travel to the workers with the env's
    arguments, so a family defined in an importable module works under every start method."""
    if not isinstance(family, Family):
        raise TypeError(f"register() takes a tdcollect.envs.engine.stepper.Family, got {type(family).__name__}.")
    if family.name not in {f.name for f in _REGISTERED}:
        _REGISTERED.append(family)
        _REGISTERED.sort(key=lambda f: f.priority)


def registered() -> tuple[Family, ...]:
    """Every family, in the order they are tried."""
    return tuple(_REGISTERED)


def costly_imports() -> dict[str, str]:
    """``{module prefix: module to import once}`` of every family (see ``engine/preload.py``)."""
    out: dict[str, str] = {}
    for family in _REGISTERED:
        out.update(family.costly_imports)
    return out


def is_env_instance(obj) -> bool:
    """Whether ``obj`` is an env object of some family (rather than a constructor)."""
    return any(family.is_instance(obj) for family in _REGISTERED)


def native_env(env):
    """The first family's stand-in for ``env``'s own ``step`` and ``reset`` (see ``Family.native_env``), else
    ``env`` itself."""
    return next((made for family in _REGISTERED if (made := family.native_env(env)) is not None), env)


def remake_expression(env) -> str | None:
    """An expression that builds an env like ``env``, from the first family that knows one; None otherwise."""
    return next((made for family in _REGISTERED if (made := family.remake(env)) is not None), None)


for _family in _discovered():
    register(_family)
