"""The GPU-policy benchmark tool (run here with the policy on the CPU): our systems collect, the table gives each
row's ratio to TorchRL's row of the same kind, and a system that raises is recorded with its error while the
others go on. (TorchRL's systems are not started here: their start-up costs CI a minute, and their
MultiSyncCollector's weight-sync scheme hangs interpreter exit in its __del__.)"""
import pytest

from benchmarks import gpu_policy

pytestmark = pytest.mark.timeout(300)


def record(system, fps, workers=2, error=None):
    return {"system": system, "device": "cpu", "workload": "cheap", "workers": workers, "envs_per_worker": 2,
            "rounds": [] if fps is None else [fps], "error": error, "frames_per_s": fps}


def test_our_systems_run_and_failures_are_recorded(monkeypatch):
    systems = ["tdcollect_multisync", "tdcollect_env_in_torchrl_collector"]
    records = gpu_policy.run("cpu", "cheap", [2], 2, rounds=1, batches=1, systems=systems)
    assert [r["system"] for r in records] == systems
    assert all(r["error"] is None and r["frames_per_s"] > 0 and len(r["rounds"]) == 1 for r in records)

    def broken(system, *args):
        raise RuntimeError("no such device\nmore")

    monkeypatch.setattr(gpu_policy, "time_system", broken)
    failed = gpu_policy.run("cpu", "cheap", [2], 2, rounds=2, batches=1, systems=["torchrl_multisync"])
    assert failed[0]["frames_per_s"] is None and failed[0]["error"] == "RuntimeError: no such device"


def test_table_ratios_are_to_torchrls_row_of_the_same_kind_and_workers():
    rows = gpu_policy.table([record("tdcollect_multisync", 3000.0), record("torchrl_multisync", 1000.0),
                             record("tdcollect_multisync", 500.0, workers=4),
                             record("tdcollect_env_in_torchrl_collector", None, error="ValueError: bad")]).splitlines()
    assert rows[1].split()[-1] == "3.00x" and rows[2].split()[-1] == "1.00x"
    assert not rows[3].rstrip().endswith("x")  # no TorchRL row with 4 workers: no ratio
    assert rows[4].endswith("error: ValueError: bad")
