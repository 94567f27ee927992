"""The benchmark report merges rounds into medians and paired ratios to the serial loop."""
import pytest

from benchmarks.report import aggregate, markdown_table

pytestmark = pytest.mark.timeout(30)


def run(system, round_, rate, num_envs=8):
    return {"system": system, "workload": "cheap", "num_envs": num_envs, "num_workers": 2,
            "envs_per_worker": 4, "config_workers": 2, "config_envs_per_worker": 4, "round": round_,
            "steps_per_s": rate}


def test_rounds_become_medians_and_paired_ratios():
    # round 1 is a slow spell for everything: paired ratios stay 2.0, 2.0, 1.5
    runs = [run("serial", 0, 100.0), run("ours", 0, 200.0),
            run("serial", 1, 50.0), run("ours", 1, 100.0),
            run("serial", 2, 100.0), run("ours", 2, 150.0)]
    merged = {r["system"]: r for r in aggregate(runs)}
    assert merged["ours"]["steps_per_s"] == 150.0
    assert merged["ours"]["rounds_steps_per_s"] == [200.0, 100.0, 150.0]
    assert merged["ours"]["vs_serial"] == 2.0
    assert merged["ours"]["vs_serial_range"] == [1.5, 2.0]
    assert "round" not in merged["ours"]
    table = markdown_table(list(merged.values()))
    assert "| cheap | ours | 2 | 4 | 8 | 2 | 150 | 2.00 | 3 (1.50–2.00) |" in table


def test_failed_rounds_are_counted_and_an_all_failed_point_keeps_its_error():
    runs = [run("serial", 0, 100.0), run("ours", 0, 120.0),
            {**run("ours", 1, 0.0), "error": "RuntimeError('boom')"},
            {**run("broken", 0, 0.0), "error": "RuntimeError('x')"}]
    for r in runs:
        if "error" in r:
            del r["steps_per_s"]
    merged = {r["system"]: r for r in aggregate(runs)}
    assert merged["ours"]["failed_rounds"] == 1 and merged["ours"]["vs_serial"] == pytest.approx(1.2)
    assert merged["broken"]["error"] == "RuntimeError('x')"


def test_the_ratio_plot_is_written_from_results_files(tmp_path):
    import json

    from benchmarks.plot_ratios import main

    runs = [run("serial", 0, 100.0), run("ours", 0, 150.0), run("gym_async", 0, 40.0)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": aggregate(runs)}))
    out = tmp_path / "ratios.png"
    assert main([str(results), "--out", str(out), "--systems", "gym_async", "ours", "absent"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
