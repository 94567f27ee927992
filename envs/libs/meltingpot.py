"""The MeltingPot family: substrates built by their own factories (``meltingpot.substrate.build``), TorchRL's
``MeltingpotEnv`` stepped natively, and the install.

A substrate steps through the family of the env API it implements (dm_env: its per-player specs become the
``"agents"`` group of TorchRL's ``MeltingpotEnv``, see ``dm_env.py``).

**TorchRL's** ``MeltingpotEnv`` / ``MeltingpotWrapper`` **on the native road**: the substrate inside is stepped
by the dm_env family's stepper, and TorchRL's data are written straight into the buffers (the same keys, dtypes,
shapes and values as its ``step``: per-player observations under ``("agents", "observation", NAME)``, the global
``WORLD.*`` observations once, under ``NAME``, from player 0's dict, ``("agents", "reward")``, and ``"done"`` =
``"terminated"`` = the timestep is the episode's last or ``max_steps`` steps were taken since the reset; the env's
``num_cycles`` counts them as its own step does), without TorchRL's per-step code (a TensorDict per player, spec
encoding, a stack). Resets are the substrate's (MeltingPot rebuilds its engine at each one), seeding is TorchRL's
(which MeltingPot does not support: it raises as TorchRL's does). Anything else keeps TorchRL's ``step``, with
the reason in ``env.roads()``: a subclass, a batched env, a device other than the CPU, one-hot actions
(``categorical_actions=False``), a ``group_map`` other than all players in one ``"agents"`` group, a substrate
whose specs TorchRL converts otherwise (integer observations with a minimum other than 0, other dtypes or shapes).

What is otherwise MeltingPot's own: recognising a substrate object handed where a constructor belongs (and showing
the factory call to pass instead), the costly import a constructor brings (``import meltingpot`` imports
tensorflow, about 5 s of one core: the owner imports it once before its workers start, see ``engine/preload.py``),
and the installer.

**Install** with no network access beyond the package registries: ``python -m tdcollect.envs.meltingpot_install``
(add ``--check`` to build a substrate afterwards).

``dm-meltingpot`` ships as a source package whose build downloads a bot-assets tarball from a storage host, and
skips the download when ``<tempfile.gettempdir()>/meltingpot-assets-<version>.tar.gz`` already exists. Those
assets are the saved bot policies of MeltingPot's *scenarios*; *substrates* (the environments) never read them:
their levels are Lua files inside the package. So this installer first writes a valid tarball holding an empty
``assets/saved_models/`` folder there (an existing file is left alone), then installs the ``meltingpot`` extra of
tdcollect (its pins live in ``pyproject.toml``) with pip. Scenarios need the real assets and stay out of scope.
"""
from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata

from ..engine.stepper import Family, of_package
from .dm_env import GROUP, DmEnvStepper, player_list_layout
from .envbase import marked_stepper, specs_of

ASSETS_VERSION = "2.3.0"  # the version dm-meltingpot 2.4.1's build asks for
EXTRA = "meltingpot"


def assets_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"meltingpot-assets-{ASSETS_VERSION}.tar.gz")


def write_empty_assets(path: str | None = None) -> tuple[str, bool]:
    """Write a gzip tarball holding only ``assets/`` and ``assets/saved_models/`` at ``path`` (default:
    :func:`assets_path`) unless a valid tarball is already there. Returns ``(path, written)``."""
    path = path or assets_path()
    if os.path.exists(path) and tarfile.is_tarfile(path):
        return path, False
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("assets", "assets/saved_models"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = int(time.time())
            tar.addfile(info)
    tmp = f"{path}.{os.getpid()}.part"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
    os.replace(tmp, path)
    return path, True


def extra_requirements(extra: str = EXTRA) -> list[str]:
    """The requirements of tdcollect's ``extra``, read from the installed package's metadata."""
    marker = re.compile(r";\s*extra\s*==\s*['\"]" + re.escape(extra) + r"['\"]\s*$")
    found = [marker.sub("", req).strip() for req in metadata.requires("tdcollect") or [] if marker.search(req)]
    if not found:
        raise RuntimeError(f"tdcollect's metadata lists no '{extra}' extra; reinstall tdcollect (pip install -e .).")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tdcollect.envs.meltingpot_install",
                                     description="Install MeltingPot with no network access beyond "
                                                 "the package registries.")
    parser.add_argument("--check", action="store_true", help="build and step a substrate after installing")
    args = parser.parse_args(argv)
    path, written = write_empty_assets()
    print(f"{'wrote' if written else 'found'} {path} (the bot assets, which substrates never read)", flush=True)
    requirements = extra_requirements()
    print("installing", " ".join(requirements), flush=True)
    start = time.perf_counter()
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *requirements])
    print(f"installed in {time.perf_counter() - start:.0f} s", flush=True)
    if args.check:
        code = ("from meltingpot import substrate; c = substrate.get_config('coins'); "
                "e = substrate.build('coins', roles=c.default_player_roles); e.reset(); e.step([0, 0]); e.close(); "
                "print('meltingpot substrate coins: reset and step ok')")
        subprocess.check_call([sys.executable, "-c", code])
    return 0


NATIVE = "native: the substrate stepped by tdcollect, TorchRL's MeltingpotEnv data"
#: TorchRL's done keys for a MeltingPot env, in its order
TORCHRL_DONE_KEYS = ["done", "terminated"]


def why_not_native(env) -> str | None:
    """None when ``env`` (TorchRL's ``MeltingpotEnv`` / ``MeltingpotWrapper``) can take the native road; else why it
    cannot, in a few words (see the module docstring)."""
    from torchrl.envs.libs.meltingpot import MeltingpotEnv, MeltingpotWrapper

    if type(env) not in (MeltingpotEnv, MeltingpotWrapper):
        return f"{type(env).__name__} is a subclass of MeltingpotWrapper (it may step in its own way)"
    if env.batch_size:
        return "a batched env"
    if env.device is not None and env.device.type != "cpu":
        return f"device={env.device}"
    if not env.categorical_actions:
        return "one-hot actions (categorical_actions=False)"
    if dict(env.group_map) != {GROUP: list(env.agent_names)}:
        return f"group_map {dict(env.group_map)} (the native road has all players in one {GROUP!r} group)"
    if list(env.full_done_spec.keys(True, True)) != TORCHRL_DONE_KEYS:
        return f"done keys {list(env.full_done_spec.keys(True, True))}"
    try:
        layout = player_list_layout(env._env)
    except (TypeError, ValueError) as exc:
        return f"the substrate's specs ({exc})"
    return _layout_mismatch(layout, env)


def _layout_mismatch(layout, env) -> str | None:
    """Where the values the dm_env family writes for the substrate would differ from TorchRL's: None when every
    observation, action and reward leaf has TorchRL's key, shape and dtype and no value is shifted."""
    if any(slot.offset is not None for slot in layout.observation_slots + layout.action_slots):
        return "integer specs with a minimum other than 0"
    for ours, theirs in ((layout.observation, env.full_observation_spec), (layout.action, env.full_action_spec),
                         (layout.reward, env.full_reward_spec)):
        if set(ours.keys(True, True)) != set(theirs.keys(True, True)):
            return f"keys {list(theirs.keys(True, True))}"
        for key in ours.keys(True, True):
            mine, torchrl = ours[key], theirs[key]
            if mine.shape != torchrl.shape or mine.dtype != torchrl.dtype:
                return f"{key}: {tuple(torchrl.shape)} {torchrl.dtype}"
            if getattr(mine.space, "n", None) != getattr(torchrl.space, "n", None):
                return f"{key}: {getattr(torchrl.space, 'n', None)} actions"
    return None


class MeltingpotEnvStepper(DmEnvStepper):
    """TorchRL's ``MeltingpotEnv`` on the native road (see the module docstring): its substrate stepped by the
    dm_env family's stepper, TorchRL's specs and done flags. ``env`` is the TorchRL env (forwarded attributes
    reach it; its ``num_cycles`` counts the steps since the reset, as its own ``step`` does)."""

    road = NATIVE

    def __init__(self, env):
        layout = player_list_layout(env._env)
        layout.done = env.full_done_spec.clone().cpu()
        super().__init__(env, layout, source=env._env)
        self.specs = specs_of(env)

    def set_seed(self, seed: int | None, static_seed: bool = False) -> int | None:
        """TorchRL's ``set_seed`` (which MeltingPot envs refuse, as TorchRL does)."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def seed(self, seed: int) -> None:
        self.env.set_seed(seed)

    def reset(self, seed: int | None = None) -> None:
        self.env.num_cycles = 0
        super().reset(seed)

    def ended(self, timestep) -> tuple[bool, ...]:
        """``done`` and ``terminated`` as TorchRL's ``MeltingpotWrapper._step`` sets them."""
        env = self.env
        env.num_cycles += 1
        ended = timestep.last() or (env.max_steps is not None and env.num_cycles >= env.max_steps)
        return ended, ended

    def close(self) -> None:
        self.env.close(raise_if_closed=False)


def _stepper(env) -> MeltingpotEnvStepper | None:
    """The native stepper of TorchRL's ``MeltingpotEnv`` when it can take the native road; None for any other env
    (one that cannot is marked with the reason, and stepped by the TorchRL family)."""
    module = sys.modules.get("torchrl.envs.libs.meltingpot")  # (a TorchRL MeltingPot env means it is imported)
    if module is None or not isinstance(env, module.MeltingpotWrapper):
        return None
    return marked_stepper(env, why_not_native(env), NATIVE, MeltingpotEnvStepper)


def _is_substrate(obj) -> bool:
    return of_package(obj, "meltingpot")


def _remake(env) -> str | None:
    return "meltingpot.substrate.build(name, roles=roles)" if _is_substrate(env) else None


FAMILY = Family(
    name="MeltingPot",
    priority=16,  # before the TorchRL family, which steps any TorchRL env through its own step
    stepper=_stepper,
    is_instance=_is_substrate,
    remake=_remake,
    costly_imports={"meltingpot": "meltingpot.substrate", "torchrl.envs.libs.meltingpot": "meltingpot.substrate"},
)


if __name__ == "__main__":
    sys.exit(main())
