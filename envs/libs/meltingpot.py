"""The MeltingPot family: substrates built by their own factories (``meltingpot.substrate.build``), and its install.

A substrate steps through the family of the env API it implements (its per-player specs become the ``"agents"``
group of TorchRL's ``MeltingpotEnv``); TorchRL's ``MeltingpotEnv`` steps as any TorchRL env. What is
MeltingPot's own: recognising a substrate object handed where a constructor belongs (and showing the factory call
to pass instead), the costly import a constructor brings (``import meltingpot`` imports tensorflow, about 5 s of one
core: the owner imports it once before its workers start, see ``engine/preload.py``), and the installer.

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


def _is_substrate(obj) -> bool:
    return of_package(obj, "meltingpot")


def _remake(env) -> str | None:
    return "meltingpot.substrate.build(name, roles=roles)" if _is_substrate(env) else None


FAMILY = Family(
    name="MeltingPot",
    priority=40,
    is_instance=_is_substrate,
    remake=_remake,
    costly_imports={"meltingpot": "meltingpot.substrate", "torchrl.envs.libs.meltingpot": "meltingpot.substrate"},
)


if __name__ == "__main__":
    sys.exit(main())
