"""The soak's flat-line check: flat series pass; growth in RSS, files, shared memory or processes, or a run that did
not kill and restart, fail."""
from benchmarks.soak import flat


def rows(n: int = 40, **grow) -> list[dict]:
    """``n`` samples of a flat run; ``grow``: a key and how much it gains per sample."""
    out = []
    for i in range(n):
        row = {"t_s": i, "rss_mb": 400.0, "workers_rss_mb": 700.0, "open_files": 45, "shared_mb": 2.8,
               "system_shmem_mb": 12.0, "children": 2, "batches": 10 * i, "kills": i // 10, "restarts": i // 10,
               "evals": i // 5}
        for key, step in grow.items():
            row[key] += step * i
        out.append(row)
    return out


def test_a_flat_run_is_flat():
    assert flat(rows()) == []


def test_growth_is_found():
    assert any("RSS" in p for p in flat(rows(rss_mb=2.0)))
    assert any("open_files" in p for p in flat(rows(open_files=1)))
    assert any("shared_mb" in p for p in flat(rows(shared_mb=0.5)))
    assert any("children" in p for p in flat(rows(children=1)))


def test_a_run_without_kills_is_not_a_soak():
    quiet = rows()
    for row in quiet:
        row["kills"] = row["restarts"] = 0
    assert any("no kills" in p for p in flat(quiet))
