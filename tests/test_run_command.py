"""``tdcollect run SCRIPT``: a TorchRL script run unchanged with tdcollect's batched envs and collectors in place of
TorchRL's, in the script's process and in the processes it starts (fork and spawn); the script's arguments, hydra
config and exit status as ``python SCRIPT`` gives them; no worker left behind."""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from tdcollect import swap

ROOT = Path(__file__).resolve().parent.parent

#: a script that reports, for each public TorchRL path, whether the class it gets there is tdcollect's
CHECK_PATHS = """
import sys


def ours():
    from torchrl.envs import ParallelEnv, SerialEnv
    from torchrl.envs.batched_envs import ParallelEnv as BatchedParallelEnv
    from torchrl.collectors import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
    from torchrl.collectors.collectors import Collector as LegacyCollector
    classes = [ParallelEnv, SerialEnv, BatchedParallelEnv, Collector, MultiSyncCollector, MultiAsyncCollector,
               AsyncCollector, LegacyCollector]
    return all(any(base.__module__.startswith("tdcollect.") for base in cls.__mro__) for cls in classes)


def child(queue):
    queue.put(ours())


if __name__ == "__main__":
    import multiprocessing

    context = multiprocessing.get_context(sys.argv[1])
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    in_child = queue.get(timeout=120)
    process.join(60)
    print("main", ours(), "child", in_child, "args", sys.argv[2:])
"""


def tdcollect_run(tmp_path: Path, source: str, *args: str, options: tuple = (), name: str = "script.py",
                  timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m tdcollect run [options] SCRIPT args`` for a script of ``source``, in ``tmp_path``."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, "-m", "tdcollect", "run", *options, str(script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_every_public_path_gives_our_classes_in_the_script_and_its_processes(tmp_path, start_method, no_leaks):
    run = tdcollect_run(tmp_path, CHECK_PATHS, start_method, "--lr", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["main", "True", "child", "True", "args", "['--lr',", "'3']"]
    assert "tdcollect's classes in place of torchrl.envs.{ParallelEnv, SerialEnv}" in run.stderr


#: helper modules for IMPORT_ROADS: each binds a TorchRL class in its own way
HELPERS = {
    "helper_first.py": "from torchrl.collectors import MultiSyncCollector\n",  # imported before torchrl.envs
    "helper_after.py": "from torchrl.collectors import Collector\n",  # the smallest case
    "outer.py": "import inner\n",  # a module whose import imports torchrl.collectors inside it
    "inner.py": "from torchrl.collectors import MultiAsyncCollector\n",
    "aliased.py": "import torchrl.collectors as C\n",
    "dynamic.py": "import importlib\nCollector = importlib.import_module('torchrl.collectors').Collector\n",
    "starred.py": "from torchrl.collectors import *  # noqa: F403\n",
    "private.py": "from torchrl.collectors._single import Collector as PrivateCollector\n",
}

#: a script that imports TorchRL's collectors every way HELPERS do (and through torchrl.trainers.helpers), builds a
#: collector through two of them and reports, in its process and in a child of the given start method, which
#: classes are tdcollect's
IMPORT_ROADS = """
import sys

import helper_first
from torchrl.envs import GymEnv
import helper_after
import outer
import aliased
import dynamic
import starred
import private
from hydra.utils import get_class
from torchrl.trainers.helpers import collectors as trainer_helpers


def ours(cls):
    return any(base.__module__.startswith("tdcollect.") for base in cls.__mro__)


def roads():
    import inner

    return {"first": ours(helper_first.MultiSyncCollector), "after": ours(helper_after.Collector),
            "nested": ours(inner.MultiAsyncCollector), "aliased": ours(aliased.C.Collector),
            "importlib": ours(dynamic.Collector), "star": ours(starred.Collector) and ours(starred.AsyncCollector),
            "trainers": ours(trainer_helpers.Collector) and ours(trainer_helpers.MultiSyncCollector)
            and ours(trainer_helpers.ParallelEnv), "private": ours(private.PrivateCollector),
            "hydra": ours(get_class("torchrl.collectors.MultiSyncCollector"))}  # what a _target_ config reaches


def child(queue):
    queue.put(roads())


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    import multiprocessing

    context = multiprocessing.get_context(sys.argv[1])
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    in_child = queue.get(timeout=120)
    process.join(60)
    print("main", roads())
    print("child", in_child)
    built = [helper_after.Collector(make_env(), None, frames_per_batch=4, total_frames=8),
             trainer_helpers.sync_sync_collector(make_env, None, num_env_per_collector=1, num_collectors=1,
                                                 policy=None, frames_per_batch=4, total_frames=8)]
    for collector in built:
        next(iter(collector))
        public = type(collector).__name__ if ours(type(collector)) else "theirs"
        print("used", type(collector).__module__ + "." + public)
        collector.shutdown()
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_every_way_of_importing_the_collectors_gives_ours_and_the_line_says_what_was_used(tmp_path, start_method,
                                                                                          no_leaks):
    """Helper modules imported before and after ``torchrl.envs``, an import inside an import, an alias,
    ``importlib``, ``from ... import *`` and ``torchrl.trainers.helpers`` all get tdcollect's collectors, in the
    script and in its child; the stderr line names each class the script built, and names the one place that kept
    TorchRL's class (an import from TorchRL's private module) with the way to get ours."""
    pytest.importorskip("hydra")
    for name, source in HELPERS.items():
        (tmp_path / name).write_text(source)
    run = tdcollect_run(tmp_path, IMPORT_ROADS, start_method)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    expected = {"first": True, "after": True, "nested": True, "aliased": True, "importlib": True, "star": True,
                "trainers": True, "private": False, "hydra": True}
    assert lines[0] == f"main {expected}"
    assert lines[1] == f"child {expected}"
    used = [line.split()[1] for line in lines[2:]]
    assert used == ["torchrl.collectors._single.Collector"] * 2  # ours, named and placed as TorchRL's
    said = [line for line in run.stderr.splitlines() if line.startswith("tdcollect run: tdcollect's classes")]
    assert len(said) >= 1
    replaced = " ".join(said)
    assert "torchrl.collectors.{Collector, MultiSyncCollector, MultiAsyncCollector, AsyncCollector}" in replaced
    kept = [line for line in run.stderr.splitlines() if "stayed at" in line]
    assert kept == ["tdcollect run: TorchRL's Collector stayed at private.PrivateCollector: it was imported from "
                    "TorchRL's private module torchrl.collectors._single (import it from torchrl.collectors to get "
                    "tdcollect's)"]


def test_a_module_that_bound_torchrls_class_before_the_swap_is_given_ours(tmp_path, no_leaks):
    """TorchRL imported before the swap (``swap.install`` called late, as when a process imported TorchRL before
    ``tdcollect run`` could hook it): a module outside TorchRL holding TorchRL's class is given ours, and named."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, types
        from torchrl.collectors import Collector
        helper = types.ModuleType("early_helper")
        helper.Collector = Collector
        sys.modules["early_helper"] = helper
        from tdcollect import swap
        replaced = swap.install("asked")
        print("early_helper.Collector" in replaced, any(b.__module__.startswith("tdcollect.")
                                                         for b in helper.Collector.__mro__))
    """)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "True"]


def test_without_the_command_the_same_script_gets_torchrls(tmp_path, no_leaks):
    (tmp_path / "script.py").write_text(CHECK_PATHS)
    run = subprocess.run([sys.executable, "script.py", "fork"], capture_output=True, text=True, timeout=240,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[:4] == ["main", "False", "child", "False"]


def test_a_hydra_script_gets_its_config_and_overrides(tmp_path, no_leaks):
    pytest.importorskip("hydra")
    (tmp_path / "config.yaml").write_text("env:\n  num_envs: 2\n  name: CartPole-v1\n")
    run = tdcollect_run(tmp_path, """
        import hydra
        from torchrl.envs import GymEnv, ParallelEnv


        @hydra.main(config_path="", config_name="config", version_base="1.3")
        def main(cfg):
            env = ParallelEnv(cfg.env.num_envs, lambda: GymEnv(cfg.env.name))
            print(type(env).__mro__[1].__module__, tuple(env.rollout(3).batch_size))
            env.close()


        if __name__ == "__main__":
            main()
    """, "env.num_envs=4", "hydra.run.dir=.")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-3:] == ["tdcollect.envs.parallel", "(4,", "3)"]


def test_the_exit_status_is_the_scripts(tmp_path):
    assert tdcollect_run(tmp_path, "raise SystemExit(3)\n").returncode == 3
    assert tdcollect_run(tmp_path, "import sys\nsys.exit()\n").returncode == 0
    said = tdcollect_run(tmp_path, "raise SystemExit('stopped: no data')\n")
    assert said.returncode == 1 and "stopped: no data" in said.stderr


def test_an_exception_prints_the_scripts_traceback_and_exits_1(tmp_path):
    run = tdcollect_run(tmp_path, """
        def inner():
            raise ValueError("bad learning rate")


        inner()
    """, name="train.py")
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    assert lines[-1] == "ValueError: bad learning rate"
    assert any('train.py", line 6, in <module>' in line for line in lines)
    assert not any("runpy" in line or "script.py" in line for line in lines), run.stderr


def test_a_missing_script_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tdcollect", "run", "missing.py"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["tdcollect run: no such script: missing.py (give the path of a "
                                               "Python file, as to python)"]


def test_collector_with_num_collectors_is_our_process_collector_under_the_command(tmp_path, no_leaks):
    """TorchRL's IMPALA script builds ``Collector(make_env(), backend="process", num_collectors=2, sync=False)``:
    under ``tdcollect run`` that is our ``MultiAsyncCollector`` (it was TorchRL's: the class standing in for
    TorchRL's ``Collector`` refused the arguments only ``Collector`` itself dispatches)."""
    run = tdcollect_run(tmp_path, """
        from torchrl.collectors import Collector
        from torchrl.envs import GymEnv

        if __name__ == "__main__":
            collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=20, total_frames=40,
                                  backend="process", num_collectors=2, sync=False)
            print(type(collector).__module__, type(collector).__name__, len(list(collector)))
            collector.shutdown()
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["tdcollect.collectors.multi_async", "MultiAsyncCollector", "2"]
    assert "kept TorchRL's" not in run.stderr


def test_a_script_that_imports_tdcollect_first_gets_every_class_replaced(tmp_path, no_leaks):
    """``import tdcollect.collectors`` before any TorchRL import: TorchRL is imported inside tdcollect's own import,
    and the names are replaced once tdcollect's classes are all defined (not halfway, which failed)."""
    run = tdcollect_run(tmp_path, """
        import tdcollect.collectors
        from torchrl.collectors import MultiSyncCollector
        from torchrl.envs import ParallelEnv

        print(MultiSyncCollector.__mro__[1].__module__, ParallelEnv.__mro__[1].__module__)
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["tdcollect.collectors.multi_sync", "tdcollect.envs.parallel"]
    said = [line for line in run.stderr.splitlines() if line.startswith("tdcollect run:")]
    assert "torchrl.collectors.{Collector" in said[0] and "torchrl.envs.{ParallelEnv" in said[0]


def test_no_worker_is_left_when_the_script_raises_with_its_env_open(tmp_path, no_leaks):
    run = tdcollect_run(tmp_path, """
        import gymnasium as gym
        from torchrl.collectors import MultiSyncCollector
        from torchrl.envs import ParallelEnv

        if __name__ == "__main__":
            env = ParallelEnv(2, lambda: gym.make("CartPole-v1"))
            env.rollout(2)
            collector = MultiSyncCollector([lambda: gym.make("CartPole-v1")] * 2, None, frames_per_batch=8,
                                           total_frames=-1)
            next(iter(collector))
            print(*env.worker_pids, *collector.worker_pids, flush=True)
            raise RuntimeError("the script failed with its env and collector open")
    """)
    assert run.returncode == 1, run.stderr[-3000:]
    pids = [int(pid) for pid in run.stdout.split()]
    assert len(pids) == 4
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_a_call_ours_refuses_keeps_torchrls_class_and_says_why(tmp_path, no_leaks):
    run = tdcollect_run(tmp_path, """
        from torchrl.envs import GymEnv, ParallelEnv
        import torchrl.envs.batched_envs as batched

        if __name__ == "__main__":
            env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"), use_buffers=False)
            print(type(env) is batched.ParallelEnv.torchrl_class, isinstance(env, ParallelEnv))
            env.rollout(2)
            env.close()
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "True"]
    assert "kept TorchRL's ParallelEnv for this call: use_buffers=False" in run.stderr


def test_the_layout_line_and_the_asked_layout(tmp_path, no_leaks):
    source = """
        import gymnasium as gym
        from torchrl.envs import ParallelEnv

        if __name__ == "__main__":
            env = ParallelEnv(4, lambda: gym.make("CartPole-v1"))
            print(env.num_workers, tuple(env.batch_size))
            env.close()
    """
    asked = tdcollect_run(tmp_path, source, options=("--layout=asked",))
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert asked.stdout.split() == ["4", "(4,)"]
    assert "laid out" not in asked.stderr
    machine = tdcollect_run(tmp_path, source)
    assert machine.returncode == 0, machine.stderr[-3000:]
    cores = psutil.Process().cpu_affinity()
    if len(cores) < 4:
        workers, per_worker = swap.machine_layout(4, None, None, len(cores))
        assert machine.stdout.split() == [str(workers), "(4,)"]
        assert f"ParallelEnv(4, ...) laid out as {workers} workers x {per_worker} envs" in machine.stderr


def test_a_laid_out_parallel_env_leaves_the_script_torchrls_threads(tmp_path, no_leaks):
    """Laid out over fewer workers (the machine's cores decide how many), a script's ``ParallelEnv(N, ...)`` lowers
    the main process' torch threads by N, as TorchRL's does: the script's own computations run on TorchRL's threads
    (and so give its numbers) on any number of cores. Forced each way: N prime and above the cores (one worker of
    N envs), and N within the cores (N workers, not laid out). (After ``close()`` the threads differ from TorchRL's
    when a script raised them after importing TorchRL: ours go back to the count before the env started, TorchRL's
    to at most the count at its import.)"""
    cores = len(psutil.Process().cpu_affinity())
    above = next(n for n in range(cores + 1, 4 * cores + 4) if all(n % d for d in range(2, n)))
    source = f"""
        import functools

        import torch
        from torchrl.envs import GymEnv, ParallelEnv

        if __name__ == "__main__":
            for n in ({above}, {min(2, cores)}):
                torch.set_num_threads({above} + 3)
                env = ParallelEnv(n, functools.partial(GymEnv, "CartPole-v1"))
                env.rollout(2)  # (TorchRL's starts its workers, and lowers the threads, here)
                print(n, env.num_workers, torch.get_num_threads())
                env.close()
    """
    script = tmp_path / "threads.py"
    script.write_text(textwrap.dedent(source))
    shipped = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    machine = tdcollect_run(tmp_path, source)
    assert machine.returncode == 0, machine.stderr[-3000:]
    assert f"ParallelEnv({above}, ...) laid out as 1 workers x {above} envs" in machine.stderr
    theirs = [line.split() for line in shipped.stdout.splitlines()]
    ours = [line.split() for line in machine.stdout.splitlines()]
    assert [row[2] for row in ours] == [row[2] for row in theirs] == ["3", str(above + 3 - min(2, cores))]
    assert ours[0][1] == "1"  # (laid out: one worker)


def test_machine_layout_rule():
    make = object()
    assert swap.machine_layout(8, make, None, 2) == (2, 4)
    assert swap.machine_layout(6, make, None, 4) == (3, 2)
    assert swap.machine_layout(7, make, None, 2) == (1, 7)
    assert swap.machine_layout(2, make, None, 4) == (2, 1)
    assert swap.machine_layout(8, [make] * 8, [{"a": 1}] * 8, 2) == (2, 4)
    assert swap.machine_layout(8, [object() for _ in range(8)], None, 2) == "a constructor per env"
    assert swap.machine_layout(4, make, [{"seed": i} for i in range(4)], 2) == "create_env_kwargs per env"


@pytest.fixture
def swapped():
    swap.install("machine", cores=2)
    try:
        yield
    finally:
        swap.uninstall()


def test_the_laid_out_env_gives_torchrls_data(swapped, no_leaks):
    """``ParallelEnv(4, make)`` laid out as 2 workers x 2 envs gives what TorchRL's ``SerialEnv`` of the same
    constructors gives, seeded the same, key by key."""
    import torchrl.envs
    from torchrl.envs import GymEnv

    def make():
        return GymEnv("CartPole-v1")

    ours = torchrl.envs.ParallelEnv(4, make)
    reference = torchrl.envs.SerialEnv.torchrl_class(4, make)
    try:
        assert ours.num_workers == 2
        data = []
        for env in (ours, reference):
            env.set_seed(7)
            torch.manual_seed(0)
            data.append(env.rollout(30, break_when_any_done=False))
        for key in data[1].keys(True, True):
            assert torch.equal(data[0][key], data[1][key]), key
    finally:
        ours.close()
        reference.close()


def test_a_copy_of_a_swapped_parallel_env_is_ours_in_every_process(swapped, no_leaks):
    """TorchRL's trainer configs hand a process collector a ``ParallelEnv`` *instance* (``batched_env``), which
    the collector copies into its workers by pickle: the copy is a new env of tdcollect's class (not TorchRL's,
    which the swapped class's TorchRL name would reach in a process without the swap), of the same constructors."""
    import pickle

    import torchrl.envs
    from torchrl.envs import GymEnv

    from tdcollect.envs import ParallelEnv as OurParallelEnv

    env = torchrl.envs.ParallelEnv(2, functools.partial(GymEnv, "CartPole-v1"))
    try:
        copy = pickle.loads(pickle.dumps(env))
        try:
            assert type(copy) is OurParallelEnv
            assert copy.batch_size == env.batch_size and copy.full_observation_spec == env.full_observation_spec
            assert copy.rollout(3).batch_size == (2, 3)
        finally:
            copy.close()
    finally:
        env.close()


TRAINERS = ROOT.parent / "shared" / "torchrl-tests" / "sota-implementations"


def test_torchrls_trainer_configs_build_our_collector_under_the_command(tmp_path, no_leaks):
    """TorchRL's hydra-configured DQN trainer (its ``_target_`` collector config, ``exploration_type="RANDOM"``, an
    ``isinstance(collector, BaseCollector)`` check, a ``batched_env`` instance) runs to its end with our collector
    and envs: no call kept TorchRL's class."""
    pytest.importorskip("hydra")
    if not (TRAINERS / "dqn_trainer").is_dir():
        pytest.skip("needs ../shared/torchrl-tests (TorchRL's pinned scripts)")
    folder = tmp_path / "dqn_trainer"
    shutil.copytree(TRAINERS / "dqn_trainer", folder)
    run = subprocess.run([sys.executable, "-m", "tdcollect", "run", "train.py", "collector.total_frames=400",
                          "collector.frames_per_batch=200", "collector.init_random_frames=200",
                          "trainer.optim_steps_per_batch=2", "trainer.progress_bar=false", "trainer.log_interval=200",
                          f"hydra.run.dir={tmp_path / 'outputs'}"],
                         capture_output=True, text=True, timeout=240, cwd=folder)
    said = [line for line in run.stderr.splitlines() if line.startswith("tdcollect run:")]
    assert run.returncode == 0, run.stderr[-3000:]
    assert said and "torchrl.collectors.{Collector" in said[0]
    assert not [line for line in said if "kept" in line], said
    assert list((tmp_path / "outputs").rglob("loss.csv")), "the trainer logged no loss"


def test_the_guide_page_shows_what_the_command_does(tmp_path, no_leaks):
    """docs/guide/your_script.md: its script, run with ``tdcollect run``, says on stderr the lines the page shows
    (the layout line where this machine has the page's two cores) and collects its batches."""
    page = (ROOT / "docs" / "guide" / "your_script.md").read_text()
    script = page.split("```python\n", 1)[1].split("```", 1)[0]
    shown = page.split("```console\n")[2].split("```", 1)[0].splitlines()
    run = tdcollect_run(tmp_path, script, name="train.py")
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if line.startswith("tdcollect run:")]
    assert said[:1] == shown[:1]
    if len(psutil.Process().cpu_affinity()) == 2:
        assert said[1:] == shown[1:]
    assert run.stdout.split("\n")[:4] == ["(4, 16)"] * 4


def test_the_command_lists_its_commands_and_runs_the_old_entry_points():
    listed = subprocess.run([sys.executable, "-m", "tdcollect", "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    for command in ("run", "demo", "autotune", "install-meltingpot"):
        assert f"    {command}" in listed.stdout, listed.stdout
    assert subprocess.run([sys.executable, "-m", "tdcollect"], capture_output=True, timeout=60).returncode == 2
    helped = subprocess.run([sys.executable, "-m", "tdcollect", "install-meltingpot", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--check" in helped.stdout


@pytest.mark.long
def test_the_demo_and_autotune_commands_run(no_leaks):
    demo = subprocess.run([sys.executable, "-m", "tdcollect", "demo", "--envs-per-worker", "2", "--steps", "50"],
                          capture_output=True, text=True, timeout=240)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "ParallelEnv" in demo.stdout and "ratio" in demo.stdout
    tuned = subprocess.run([sys.executable, "-m", "tdcollect", "autotune", "CartPole-v1", "--num-envs", "2",
                            "--budget-s", "2"], capture_output=True, text=True, timeout=240)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "best: ParallelEnv(create_env_fn=make_env, **{'num_workers':" in tuned.stdout
