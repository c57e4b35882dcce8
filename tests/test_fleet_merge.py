"""``deepgap merge``: idempotence, conflicts, foreign/other-version stores, extension tables, CLI errors."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store

from deepgap.errors import StoreError
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
    con.execute("UPDATE results SET latency_median_s = latency_median_s * 2 WHERE result_id = "
                "(SELECT min(result_id) FROM results WHERE status = 'ok')")
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


def test_extension_tables_follow_their_runs_with_keys_remapped(two_machines, tmp_path):
    a, b = two_machines
    for path, n in ((a, 2), (b, 3)):  # a module's parent table (run_id, own key) and child table
        con = sqlite3.connect(path)
        run_id = con.execute("SELECT run_id FROM runs LIMIT 1").fetchone()[0]
        con.execute("CREATE TABLE IF NOT EXISTS ext_runs (ext_id INTEGER PRIMARY KEY, run_id TEXT, v REAL)")
        con.execute("CREATE TABLE IF NOT EXISTS ext_rows (ext_id INTEGER NOT NULL, i INTEGER, w REAL)")
        con.execute("CREATE TABLE IF NOT EXISTS ext_cache (k TEXT PRIMARY KEY, v REAL)")
        for j in range(n):
            eid = con.execute("INSERT INTO ext_runs (run_id, v) VALUES (?, ?)", (run_id, float(j))).lastrowid
            con.executemany("INSERT INTO ext_rows VALUES (?, ?, ?)", [(eid, i, eid * 10.0 + i) for i in range(4)])
        con.execute("INSERT OR IGNORE INTO ext_cache VALUES ('shared', 1.0)")
        con.commit()
        con.close()
    out = str(tmp_path / "all.sqlite")
    merge([a, b], out)
    merge([b, a], out)
    c = counts(out)
    assert (c["ext_runs"], c["ext_rows"], c["ext_cache"]) == (5, 20, 1)
    con = sqlite3.connect(out)
    orphans = con.execute("SELECT count(*) FROM ext_rows WHERE ext_id NOT IN (SELECT ext_id FROM ext_runs)")
    assert orphans.fetchone()[0] == 0
    per_parent = con.execute("SELECT ext_id, count(*) FROM ext_rows GROUP BY ext_id").fetchall()
    assert sorted(n for _, n in per_parent) == [4] * 5
    con.close()


def test_run_selection_takes_only_those_runs_and_their_rows(two_machines, tmp_path):
    a, b = two_machines
    con = sqlite3.connect(b)
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id")]
    con.execute("CREATE TABLE ext_runs (ext_id INTEGER PRIMARY KEY, run_id TEXT, v REAL)")
    con.executemany("INSERT INTO ext_runs (run_id, v) VALUES (?, 1.0)", [(r,) for r in runs])
    con.commit()
    want = {"results": con.execute("SELECT count(*) FROM results WHERE run_id = ?", (runs[0],)).fetchone()[0],
            "telemetry": con.execute("SELECT count(*) FROM telemetry WHERE run_id = ?",
                                     (runs[0],)).fetchone()[0]}
    con.close()
    out = str(tmp_path / "one.sqlite")
    rep = merge([a, b], out, runs=[runs[0]])
    con = sqlite3.connect(out)
    assert [r for (r,) in con.execute("SELECT run_id FROM runs")] == [runs[0]] and rep.runs_added == 1
    assert con.execute("SELECT count(*) FROM results").fetchone()[0] == want["results"] > 0
    assert con.execute("SELECT count(*) FROM telemetry").fetchone()[0] == want["telemetry"]
    assert con.execute("SELECT run_id FROM ext_runs").fetchall() == [(runs[0],)]
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
