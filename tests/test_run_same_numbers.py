"""``tdcollect run`` changes nothing but the time: a seeded TorchRL script logs, under the command, the numbers it
logs as shipped (TorchRL's CSV logger, file by file); and a script that logs tqdm's rate after a fast first batch
exits 0 under the command (see ``cli/progress.py``).

The scripts (``tests/seeded_scripts/``): one env; a ``ParallelEnv`` of 4 envs, which the command lays out as 2
workers x 2 envs (the command runs on 2 cores here, its affinity); ``init_random_frames`` and exploration noise over
a ``ParallelEnv`` of 2 envs; a DDPG-shaped script (``ddpg_shaped.py``), also written with tdcollect's classes."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "seeded_scripts"


def two_cores() -> None:
    """In the child before it runs: at most 2 cores (the machine layout of a ParallelEnv of 4 envs is 2 x 2)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def run(script: Path, log_dir: Path, command: bool, *arguments: str) -> subprocess.CompletedProcess:
    prefix = ["-m", "tdcollect", "run"] if command else []
    done = subprocess.run([sys.executable, *prefix, str(script), str(log_dir), *arguments], capture_output=True,
                          text=True, timeout=300, cwd=script.parent, preexec_fn=two_cores if command else None)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def logged(log_dir: Path) -> dict[str, str]:
    """``{scalar name: the CSV logger's file, as text}``."""
    return {path.stem: path.read_text() for path in sorted(log_dir.rglob("*.csv"))}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", ["one_env", "parallel_env", "random_frames_and_noise"])
def test_a_seeded_script_logs_the_same_numbers_under_the_command(script, tmp_path, no_leaks):
    shipped = run(SCRIPTS / f"{script}.py", tmp_path / "shipped", command=False)
    ours = run(SCRIPTS / f"{script}.py", tmp_path / "ours", command=True)
    assert "tdcollect run:" not in shipped.stderr and "tdcollect run:" in ours.stderr
    if script == "parallel_env":
        assert "ParallelEnv(4, ...) laid out as 2 workers x 2 envs" in ours.stderr
    as_shipped, under_command = logged(tmp_path / "shipped"), logged(tmp_path / "ours")
    assert len(as_shipped) == 3 and all(text.count("\n") >= 5 for text in as_shipped.values()), as_shipped
    for name, text in as_shipped.items():
        assert under_command.get(name) == text, f"{script}: {name} as shipped:\n{text}\nunder the command:\n" \
                                                 f"{under_command.get(name)}"


DDPG_SHAPED = SCRIPTS / "ddpg_shaped.py"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("envs", ["1", "4"])
def test_a_ddpg_shaped_script_logs_the_same_numbers_under_the_command_and_with_our_classes(envs, tmp_path, no_leaks):
    """Item 1's shape (a seeded env, random frames first, then Ornstein-Uhlenbeck noise, replay-buffer sampling,
    DDPG losses, TorchRL's CSV logger, no ``collector.set_seed``): as shipped, under ``tdcollect run`` (4 envs: laid
    out as 2 workers x 2 envs) and written with tdcollect's classes directly, the same files byte for byte.
    (``benchmarks/same_numbers.py`` runs it again and again beside CPU hogs.)"""
    run(DDPG_SHAPED, tmp_path / "shipped", False, envs)
    ours = run(DDPG_SHAPED, tmp_path / "ours", True, envs)
    if envs == "4":
        assert "ParallelEnv(4, ...) laid out as 2 workers x 2 envs" in ours.stderr
    run(DDPG_SHAPED, tmp_path / "classes", False, envs, "--ours")
    as_shipped = logged(tmp_path / "shipped")
    assert sorted(as_shipped) == ["loss_actor", "loss_value", "reward"], as_shipped
    assert all(text.count("\n") >= 4 for text in as_shipped.values()), as_shipped
    for kind in ("ours", "classes"):
        assert logged(tmp_path / kind) == as_shipped, f"{kind}: {logged(tmp_path / kind)}\nshipped: {as_shipped}"


RATE_SCRIPT = """
import sys

import tqdm
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, ParallelEnv
from torchrl.record.loggers.csv import CSVLogger


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    logger = CSVLogger("rate", log_dir=sys.argv[1])
    collector = Collector(ParallelEnv(2, make_env), None, frames_per_batch=8, total_frames=24)
    collector.set_seed(0)
    # (tqdm records a rate only at an update mininterval after the bar's start: with 10 s, every batch here comes
    # sooner, as a fast first batch does within tqdm's default 0.1 s, however loaded the machine)
    pbar = tqdm.tqdm(total=24, mininterval=10)
    for i, batch in enumerate(collector):
        pbar.update(batch.numel())
        if i == 0:
            print("recorded a rate:", bool(pbar._ema_dt()))
        logger.log_scalar("speed", pbar.format_dict["rate"], step=i)
    collector.shutdown()
"""


@pytest.mark.timeout(300)
def test_a_script_logging_tqdms_rate_after_a_fast_first_batch_exits_0(tmp_path, no_leaks):
    script = tmp_path / "rate.py"
    script.write_text(textwrap.dedent(RATE_SCRIPT))
    done = run(script, tmp_path / "logs", command=True)
    assert "recorded a rate: False" in done.stdout  # the first batch came before tqdm recorded a rate
    rates = [float(line.split(",")[-1]) for line in (tmp_path / "logs").rglob("speed.csv").__next__().read_text()
             .splitlines() if line.strip()]
    assert len(rates) == 3 and all(math.isfinite(rate) and rate > 0 for rate in rates), rates
