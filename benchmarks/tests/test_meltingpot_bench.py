"""The MeltingPot benchmark's tables and plot records from the rounds a run printed (no substrate is built)."""
import pytest

from benchmarks.meltingpot import from_log, plot_records, table

pytestmark = pytest.mark.timeout(30)

PRINTED = "\n".join([
    "noise a run prints between its rounds",
    "commons_harvest__open 2x1 round 1: serial 1,000 | native_rollout 1,500 | torchrl_rollout 100 | "
    "serial_reset 200 | native_rollout_reset 300",
    "commons_harvest__open 2x1 round 2: serial 2,000 | native_rollout 2,400 | torchrl_rollout 300 | "
    "serial_reset 100 | native_rollout_reset 250",
    "commons_harvest__open 2x1 round 3: serial 1,500 | native_rollout 3,000 | torchrl_rollout 200 | "
    "serial_reset 150 | native_rollout_reset 150",
    "coins 2x2 round 1: serial 4,000 | native_rollout 2,000",
])

def test_rounds_printed_become_tables_and_plot_records(tmp_path):
    log = tmp_path / "printed.txt"
    log.write_text(PRINTED)
    runs = from_log(str(log))
    assert set(runs) == {("commons_harvest__open", 2, 1), ("coins", 2, 2)}
    commons = runs[("commons_harvest__open", 2, 1)]
    assert commons["native_rollout"] == [1500.0, 2400.0, 3000.0]
    lines = table("commons_harvest__open", 2, 1, commons)
    # medians over the serial loop's median; the reset rows over the reset-including serial loop's
    assert "| ours, native factory: rollout | 2,400 | 1,500, 2,400, 3,000 | 1.60 |" in lines
    assert "| TorchRL ParallelEnv + MeltingpotEnv: rollout | 200 | 100, 300, 200 | 0.13 |" in lines
    assert "| ours, native factory: rollout, reset included | 250 | 300, 250, 150 | 1.67 |" in lines
    records = {r["system"]: r for r in plot_records("commons_harvest__open", 2, 1, commons)}
    assert set(records) == {"tdcollect_parallel", "torchrl_parallel"}  # (only the rows the plot draws)
    assert records["tdcollect_parallel"]["vs_serial"] == pytest.approx(1.6)
    assert records["tdcollect_parallel"]["workload"] == "meltingpot commons"
    assert records["torchrl_parallel"]["config_envs_per_worker"] == 1
