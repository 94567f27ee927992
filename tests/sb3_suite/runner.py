"""Run Stable-Baselines3's own ``tests/test_vec_envs.py`` against ``ParallelVecEnv``.

The file ships in SB3's source distribution on the package registry: :func:`suite_file` downloads the sdist of
the installed SB3 version once (``pip download --no-binary :all:``) into a folder under the system's temp dir
and unpacks its tests; :func:`run_suite` runs the file with pytest in a subprocess with ``-p
tests.sb3_suite.substitute`` (``SubprocVecEnv`` becomes ``ParallelVecEnv`` before the file imports it) and
returns every test's outcome, read from a JUnit XML report. Nothing of SB3's is copied into this repository.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "tests/test_vec_envs.py"

#: tests of the suite that do not pass against ParallelVecEnv, by name (parameters left out), with the reason
EXPECTED_FAILURES: dict[str, str] = {}

#: tests the suite itself skips on a machine like CI's, with the reason
EXPECTED_SKIPS = {
    "test_render": "the suite skips it without an X server (DISPLAY unset)",
    "test_video_recorder": "the suite skips it without moviepy",
}


def suite_file(version: str | None = None, cache: Path | None = None) -> Path:
    """The suite file of SB3 ``version`` (default: the installed one), downloaded and unpacked on first use."""
    version = version or importlib.metadata.version("stable-baselines3")
    root = Path(cache or tempfile.gettempdir()) / f"tdcollect-sb3-sdist-{version}"
    target = root / "src" / SUITE
    if target.exists():
        return target
    work = Path(tempfile.mkdtemp(prefix="download-", dir=_made(root)))
    try:
        command = [sys.executable, "-m", "pip", "download", f"stable-baselines3=={version}", "--no-deps",
                   "--no-binary", ":all:", "-q", "-d", str(work)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        archives = list(work.glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(f"could not download the sdist of stable-baselines3=={version}:\n{done.stderr}")
        unpacked = work / "src"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.isfile() and _wanted(m.name)]
            for member in members:
                member.name = member.name.split("/", 1)[1]  # drop the top folder
            archive.extractall(unpacked, members=members, **_data_filter())
        if not (unpacked / SUITE).exists():
            raise RuntimeError(f"the sdist of stable-baselines3=={version} has no {SUITE}")
        try:
            os.replace(unpacked, root / "src")  # atomic: a concurrent download may have won, that is fine
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wanted(name: str) -> bool:
    parts = name.split("/")
    return len(parts) > 1 and (parts[1] == "tests" or parts[1:] == ["pyproject.toml"])


def _data_filter() -> dict:
    return {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def run_suite(test_file: Path, report: Path, timeout: float = 600) -> dict[str, str]:
    """Run ``test_file`` against ParallelVecEnv; ``{test id: "passed" | "failed" | "error" | "skipped"}``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", str(test_file), "-p", "tests.sb3_suite.substitute",
               "-p", "no:cacheprovider", "-q", "-o", "timeout=180", f"--junitxml={report}"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if not report.exists():
        raise RuntimeError(f"the suite did not run:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[case.get("name")] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes
