"""The GPU-policy benchmark tool (run here with the policy on the CPU): every system collects, the table gives
each row's ratio to TorchRL's, and a system that raises is recorded with its error while the others go on."""
import pytest

from benchmarks import gpu_policy

pytestmark = pytest.mark.timeout(300)


def test_systems_run_and_the_table_compares_with_torchrl(monkeypatch):
    # (not TorchRL's MultiSyncCollector here: its weight-sync scheme hangs this process's exit in its __del__)
    systems = ["tdcollect_env_in_torchrl_collector", "torchrl_env_in_torchrl_collector", "tdcollect_multisync"]
    records = gpu_policy.run("cpu", "cheap", [2], 2, rounds=1, batches=1, systems=systems)
    assert [r["system"] for r in records] == systems
    assert all(r["error"] is None and r["frames_per_s"] > 0 and len(r["rounds"]) == 1 for r in records)
    table = gpu_policy.table(records).splitlines()
    ours = records[0]["frames_per_s"] / records[1]["frames_per_s"]
    assert table[1].split()[-1] == f"{ours:.2f}x" and table[2].split()[-1] == "1.00x"
    assert not table[3].rstrip().endswith("x")  # no TorchRL row of that kind in this run: no ratio

    def broken(system, *args):
        raise RuntimeError("no such device\nmore")

    monkeypatch.setattr(gpu_policy, "time_system", broken)
    failed = gpu_policy.run("cpu", "cheap", [2], 2, rounds=2, batches=1, systems=["torchrl_multisync"])
    assert failed[0]["frames_per_s"] is None and failed[0]["error"] == "RuntimeError: no such device"
    assert "error: RuntimeError: no such device" in gpu_policy.table(failed)
