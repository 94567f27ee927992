"""The same-numbers benchmark's report: its tables count the runs equal to the reference, and it reports without
the prefetch rounds when asked for none."""
import pytest

from benchmarks import same_numbers

pytestmark = pytest.mark.timeout(30)


def test_the_table_counts_runs_equal_to_the_reference_and_every_outcome():
    lines = same_numbers.table({"shipped, 1 env": ["a", "a", "b"], "tdcollect run, 1 env": ["a", "a", "a"]},
                               {"shipped, 1 env": "a", "tdcollect run, 1 env": "a"})
    assert "| shipped, 1 env | 2 of 3 | a: 2, b: 1 |" in lines
    assert "| tdcollect run, 1 env | 3 of 3 | a: 3 |" in lines


def test_no_prefetch_rounds_leaves_their_table_out(tmp_path, monkeypatch):
    monkeypatch.setattr(same_numbers, "run_once", lambda command, arguments, log_dir: "digest")
    out = tmp_path / "out.md"
    assert same_numbers.main(["--rounds", "2", "--prefetch-rounds", "0", "--hogs", "0", "--md", str(out)]) == 0
    text = out.read_text()
    assert "| shipped, 1 env | 2 of 2 | digest: 2 |" in text
    assert "prefetch" not in text
