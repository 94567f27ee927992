"""The sota benchmark's edits of TorchRL's scripts: imports swapped, and the line that moves the Atari transforms
into our workers."""
from __future__ import annotations

from benchmarks.sota import move_transforms, swap_imports

SCRIPT = '''from __future__ import annotations

from torchrl.envs import ParallelEnv, TransformedEnv, VecNorm


def make_parallel_env(num_envs):
    env = ParallelEnv(num_envs, make_base_env)
    env = TransformedEnv(env)
    env.append_transform(VecNorm(in_keys=["pixels"]))
    return env
'''


def test_the_transforms_move_with_one_line_before_the_return():
    out = move_transforms(swap_imports(SCRIPT))
    compile(out, "utils_atari.py", "exec")
    assert "from tdcollect.envs import ParallelEnv\n" in out
    body = out.split("def make_parallel_env(num_envs):\n")[1].splitlines()
    assert body[-2:] == ["    env = move_transforms_to_workers(env)", "    return env"]
    assert "    from tdcollect.envs import move_transforms_to_workers" in body


def test_a_module_without_the_function_is_left_alone():
    assert move_transforms("x = 1\n") == "x = 1\n"


def test_sane_reports_losses_and_returns():
    from benchmarks.sota import sane

    assert sane({"train/q_loss": [1.0, 2.0], "train/reward": [-3.0, 5.5]}) == "2 losses, all finite; return -3.0 -> 5.5"
    assert sane({"train/loss_actor": [float("nan")]}) == "1 losses, NOT ALL FINITE; return no episode ended"


def test_the_probe_logs_the_mean_of_a_list_to_the_csv_logger(tmp_path):
    """SAC logs every episode return that ended in a batch (a list where several ended); the probe gives TorchRL's
    CSV logger their mean instead of its ``float(list)`` error."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "sota_probe" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("sota_probe_under_test", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)

    class Experiment:
        def __init__(self):
            self.logged = []

        def add_scalar(self, name, value, global_step=None):
            self.logged.append((name, float(value), global_step))

    probe.log_list_means(Experiment)
    experiment = Experiment()
    experiment.add_scalar("train/reward", [-3.0, 5.0], global_step=7)
    experiment.add_scalar("train/q_loss", 0.5)
    assert experiment.logged == [("train/reward", 1.0, 7), ("train/q_loss", 0.5, None)]


def test_the_table_gives_medians_ratios_and_why_a_script_failed():
    from benchmarks.sota import table

    def ok(seconds, frames_per_s, loss=0.5):
        return {"exit": 0, "seconds": seconds, "collect_s": 1000 / frames_per_s, "frames": 1000,
                "scalars": {"train/loss": [loss]},
                "said": ["tdcollect run: tdcollect's classes in place of x.{Y}", "tdcollect run: laid out"]}

    results = {("ddpg", "torchrl"): [ok(20, 400), ok(22, 500)], ("ddpg", "run"): [ok(10, 900), ok(12, 1100)],
               ("a2c_trainer", "torchrl"): [{"exit": 1, "seconds": 5, "why": ["ValueError: no map", "full_key: x"],
                                             "said": []}]}
    lines = table(results, ["ddpg", "a2c_trainer"], ["torchrl", "run"])
    ddpg = next(line for line in lines if line.startswith("| ddpg"))
    cells = [cell.strip() for cell in ddpg.strip("|").split("|")]
    assert cells[1:5] == ["0, 21.0, 450", "0, 11.0, 1,000", "1.91", "2.22"]
    assert cells[5] == "4, all finite" and cells[6] == "laid out"
    assert "- `a2c_trainer` torchrl: exit 1: `ValueError: no map`" in lines
    results["ddpg", "run"][0]["scalars"]["train/loss"] = [float("nan")]
    assert "NOT ALL FINITE" in next(line for line in table(results, ["ddpg"], ["torchrl", "run"])
                                    if line.startswith("| ddpg"))
