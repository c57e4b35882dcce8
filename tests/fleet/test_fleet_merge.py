"""``deepgap merge``: idempotence, conflicts, foreign/other-version stores, extension tables, CLI errors."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store

from deepgap.core.errors import StoreError
from deepgap.fleet.merge import merge
from deepgap.store import Store


def counts(path: str) -> dict[str, int]:
    con = sqlite3.connect(path)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: con.execute(f"SELECT count(*) FROM {n}").fetchone()[0] for n in names}
    finally:
        con.close()


@pytest.fixture
def two_machines(tmp_path):
    a, b = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    build_store(a, gpu=True, cpu=False, name="Fixture GPU A")
    build_store(b, gpu=True, cpu=True, name="Fixture GPU B", scale=2.0)
    return a, b


def test_merge_combines_everything_and_twice_adds_nothing(two_machines, tmp_path):
    a, b = two_machines
    out = str(tmp_path / "all.sqlite")
    r1 = merge([a, b], out)
    ca, cb, c1 = counts(a), counts(b), counts(out)
    for table in ("runs", "results", "samples", "telemetry"):
        assert c1[table] == ca[table] + cb[table], table
    assert r1.runs_added == ca["runs"] + cb["runs"] and r1.results_added == ca["results"] + cb["results"]
    r2 = merge([a, b, out], out)  # again, and the output itself among the inputs
    assert (r2.runs_added, r2.results_added, r2.telemetry_added) == (0, 0, 0)
    assert r2.results_present == c1["results"]
    assert counts(out) == c1
    frame = Store(out, readonly=True).results_frame()
    assert {"Fixture GPU A", "Fixture GPU B", "Fixture CPU"} <= set(frame["device_name"])


def test_a_result_that_differs_is_a_conflict_and_nothing_is_written(two_machines, tmp_path):
    a, _ = two_machines
    copy = str(tmp_path / "copy.sqlite")
    shutil.copy(a, copy)
    con = sqlite3.connect(copy)
    con.execute(
        "UPDATE results SET latency_median_s = latency_median_s * 2 WHERE result_id = "
        "(SELECT min(result_id) FROM results WHERE status = 'ok')"
    )
    con.commit()
    con.close()
    out = str(tmp_path / "all.sqlite")
    with pytest.raises(StoreError, match="conflict"):
        merge([a, copy], out)
    assert not (tmp_path / "all.sqlite").exists()
    rep = merge([a, copy], out, on_conflict="first")
    assert len(rep.conflicts) == 1 and counts(out)["results"] == counts(a)["results"]


def test_other_schema_version_and_foreign_files_are_clear_errors(two_machines, tmp_path):
    a, _ = two_machines
    newer = str(tmp_path / "newer.sqlite")
    shutil.copy(a, newer)
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    out = tmp_path / "all.sqlite"
    with pytest.raises(StoreError, match="schema version"):
        merge([a, newer], str(out))
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database at all " * 10)
    with pytest.raises(StoreError):
        merge([a, str(junk)], str(out))
    assert not out.exists()


def test_feature_tables_follow_their_runs_by_their_declared_keys(two_machines, tmp_path):
    """serve_runs (parent: runs, own key serve_id) → serve_requests (parent key serve_id); a cache merges on its key."""
    a, b = two_machines
    for path, n in ((a, 2), (b, 3)):
        con = sqlite3.connect(path)
        run_id = con.execute("SELECT run_id FROM runs LIMIT 1").fetchone()[0]
        con.execute("CREATE TABLE ext_undeclared (run_id TEXT, v REAL)")
        con.execute("INSERT INTO ext_undeclared VALUES (?, 1.0)", (run_id,))
        for j in range(n):
            eid = con.execute("INSERT INTO serve_runs (run_id, n) VALUES (?, ?)", (run_id, j)).lastrowid
            con.executemany(
                "INSERT INTO serve_requests (serve_id, idx, latency_s) VALUES (?, ?, ?)",
                [(eid, i, eid * 10.0 + i) for i in range(4)],
            )
        con.execute("INSERT OR IGNORE INTO roofline_model_costs VALUES ('m', 224, 'infer', 1.0, 2, '{}')")
        con.commit()
        con.close()
    out = str(tmp_path / "all.sqlite")
    merge([a, b], out)
    merge([b, a], out)
    con = sqlite3.connect(out)
    c = {
        t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("serve_runs", "serve_requests", "roofline_model_costs")
    }
    assert (c["serve_runs"], c["serve_requests"], c["roofline_model_costs"]) == (5, 20, 1)
    orphans = con.execute(
        "SELECT count(*) FROM serve_requests WHERE serve_id NOT IN (SELECT serve_id FROM serve_runs)"
    )
    assert orphans.fetchone()[0] == 0
    per_parent = con.execute("SELECT serve_id, count(*) FROM serve_requests GROUP BY serve_id").fetchall()
    assert sorted(n for _, n in per_parent) == [4] * 5
    # each request still belongs to the level it was measured in (latency = its old serve_id * 10 + idx)
    levels = con.execute("SELECT count(DISTINCT latency_s - idx) FROM serve_requests GROUP BY serve_id")
    assert [n for (n,) in levels.fetchall()] == [1] * 5
    assert "ext_undeclared" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    con.close()


def test_run_selection_takes_only_those_runs_and_their_rows(two_machines, tmp_path):
    a, b = two_machines
    con = sqlite3.connect(b)
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id")]
    con.executemany("INSERT INTO serve_runs (run_id, n) VALUES (?, 1)", [(r,) for r in runs])
    con.commit()
    want = {
        "results": con.execute("SELECT count(*) FROM results WHERE run_id = ?", (runs[0],)).fetchone()[0],
        "telemetry": con.execute("SELECT count(*) FROM telemetry WHERE run_id = ?", (runs[0],)).fetchone()[0],
    }
    con.close()
    out = str(tmp_path / "one.sqlite")
    rep = merge([a, b], out, runs=[runs[0]])
    con = sqlite3.connect(out)
    assert [r for (r,) in con.execute("SELECT run_id FROM runs")] == [runs[0]] and rep.runs_added == 1
    assert con.execute("SELECT count(*) FROM results").fetchone()[0] == want["results"] > 0
    assert con.execute("SELECT count(*) FROM telemetry").fetchone()[0] == want["telemetry"]
    assert con.execute("SELECT run_id FROM serve_runs").fetchall() == [(runs[0],)]
    con.close()
    p = deepgap_cli("merge", a, "--run", "no-such-run", "-o", str(tmp_path / "none.sqlite"))
    assert p.returncode == 2 and "no-such-run" in p.stderr and not (tmp_path / "none.sqlite").exists()


def test_cli_merge_errors_are_one_line_exit_2(two_machines, tmp_path):
    a, _ = two_machines
    p = deepgap_cli("merge", a, str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "all.sqlite"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "missing.sqlite" in p.stderr
    assert not (tmp_path / "all.sqlite").exists()
    p = deepgap_cli("merge", a, "-o", str(tmp_path / "all.sqlite"))
    assert p.returncode == 0, p.stderr
