"""benchmarks/compare_trees.py: its table pairs each round's runs with that round's serial loop."""
from benchmarks.compare_trees import table


def run(system, rate, workload="costly", num_envs=8):
    return {"system": system, "workload": workload, "num_envs": num_envs, "steps_per_s": rate}


def test_the_table_gives_medians_and_per_round_ratios_for_both_versions():
    rounds = {
        # round 1 is a slow spell for everything: its ratio is still 1.5
        "base": [[run("serial", 100.0), run("ours", 150.0)], [run("serial", 50.0), run("ours", 75.0)],
                 [run("serial", 100.0), run("ours", 150.0)]],
        "head": [[run("serial", 100.0), run("ours", 200.0)], [run("serial", 100.0), run("ours", 180.0)],
                 [run("serial", 90.0), run("ours", 200.0), run("only_here", 10.0, "cheap", 64)]],
    }
    lines = table(rounds).splitlines()
    assert "| costly | 8 | ours | 150 (1.50x) | 200 (2.00x) |" in lines
    assert "| costly | 8 | serial | 100 (1.00x) | 100 (1.00x) |" in lines
    # a system without a serial row at its point has no ratio to show, and no base run: "-"
    assert "| cheap | 64 | only_here | - | 10 |" in lines
