"""Versioned migrations: old stores open (read: migrated in memory; write: in place), runs.kind, resume by kind."""

import json
import sqlite3
from pathlib import Path

import pytest

from deepgap.core.errors import UsageError
from deepgap.store import SCHEMA_VERSION, Store
from deepgap.store.guard import APPLICATION_ID
from deepgap.store.migrations import CORE_V1, MIGRATIONS

_OLD_SERVE_RUNS = (
    "CREATE TABLE serve_runs (serve_id INTEGER PRIMARY KEY, run_id TEXT, mean_batch TEXT, n INTEGER)"
)


def _v1_store(path: Path, serve: bool = True) -> Path:
    """A store as the first release wrote it: an interrupted profile (kind in its spec), a sweep, a serve run."""
    con = sqlite3.connect(path)
    for stmt in CORE_V1.split(";"):
        if stmt.strip():
            con.execute(stmt)
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    con.execute("PRAGMA user_version = 1")
    runs = [
        ("r1-sweep", 1.0, "interrupted", "deepgap run", {"models": ["tinycnn"]}, {}),
        (
            "r2-profile",
            2.0,
            "interrupted",
            "deepgap profile",
            {"kind": "profile", "models": ["resnet18"]},
            {},
        ),
        (
            "r3-serve",
            3.0,
            "finished",
            "deepgap serve",
            {"models": ["resnet18"], "options": {"serve": {}}},
            {},
        ),
        (
            "r4-fleet",
            4.0,
            "finished",
            "deepgap run --devices all",
            {"models": ["tinycnn"]},
            {"fleet": {"n": 2}},
        ),
    ]
    for rid, t, status, cmd, spec, env in runs:
        con.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
            (rid, t, None, status, cmd, json.dumps(spec), json.dumps(env), "h", 1, "0.1"),
        )
    if serve:  # created by the serving feature itself then, with mean_batch declared TEXT
        con.execute(_OLD_SERVE_RUNS)
        con.execute("CREATE INDEX serve_runs_by_run ON serve_runs(run_id)")
        con.execute("INSERT INTO serve_runs VALUES (1, 'r3-serve', 3.5, 300)")
    con.commit()
    con.close()
    return path


def _kinds(s: Store) -> dict[str, str]:
    return {r["run_id"]: r["kind"] for r in s.runs()}


def test_steps_are_numbered_and_say_why():
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert SCHEMA_VERSION == MIGRATIONS[-1].version >= 3
    assert all(m.apply.__doc__ and len(m.apply.__doc__) > 40 for m in MIGRATIONS)


def test_new_store_has_the_current_version_and_kind(tmp_path):
    s = Store(str(tmp_path / "new.sqlite"))
    run = s.begin_run({}, "deepgap profile", {}, "0", kind="profile")
    assert s.run(run)["kind"] == "profile" and "kind" not in s.run(run)["spec"]
    with pytest.raises(ValueError, match="unknown run kind"):
        s.begin_run({}, "x", {}, "0", kind="nonsense")
    s.close()
    con = sqlite3.connect(tmp_path / "new.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert "serve_runs" in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}


def test_read_only_open_migrates_in_memory_and_changes_nothing(tmp_path):
    path = _v1_store(tmp_path / "old.sqlite")
    before = path.read_bytes()
    s = Store(str(path), readonly=True)
    assert _kinds(s) == {
        "r1-sweep": "sweep",
        "r2-profile": "profile",
        "r3-serve": "serve",
        "r4-fleet": "fleet",
    }
    assert "kind" not in s.run("r2-profile")["spec"]
    assert s.table_frame("serve_runs")["mean_batch"].tolist() == [3.5]
    s.close()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["old.sqlite"]


def test_writable_open_migrates_in_place(tmp_path):
    path = _v1_store(tmp_path / "old.sqlite")
    Store(str(path)).close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert con.execute("SELECT kind, spec_json FROM runs WHERE run_id = 'r2-profile'").fetchone() == (
        "profile",
        json.dumps({"models": ["resnet18"]}),
    )
    types = {r[1]: r[2] for r in con.execute("PRAGMA table_info(serve_runs)")}
    assert (
        types["mean_batch"] == "REAL" and "latency_p99_s" in types
    )  # retyped, and the declared columns added
    assert con.execute("SELECT mean_batch, n FROM serve_runs").fetchall() == [(3.5, 300)]
    indexes = [
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
    ]
    assert indexes.count("serve_runs_by_run") == 1
    con.close()
    Store(str(path)).close()  # a second open finds nothing to do
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_resume_picks_only_runs_of_its_own_kind(tmp_path):
    """An interrupted profile is never what `deepgap run --resume` continues (it failed on 'kind' before)."""
    from deepgap.api import open_resume

    path = _v1_store(tmp_path / "old.sqlite", serve=False)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET status = 'finished' WHERE run_id = 'r1-sweep'")
    con.commit()
    con.close()
    with pytest.raises(UsageError, match="no unfinished run"):
        open_resume(str(path), True)
    s = Store(str(path))
    assert s.latest_unfinished() is None
    assert s.latest_unfinished("profile")["run_id"] == "r2-profile"
    assert s.latest_unfinished(None)["run_id"] == "r2-profile"
    newer = s.begin_run({}, "deepgap profile", {}, "0", kind="profile")  # interrupted after the sweep below
    sweep = s.begin_run({"models": ["tinycnn"]}, "deepgap run", {}, "0")
    assert s.latest_unfinished()["run_id"] == sweep and s.latest_unfinished("profile")["run_id"] == newer
    s.close()
    s, row = open_resume(str(path), True)
    assert row["run_id"] == sweep
    s.close()


def test_recovery_of_an_old_store_keeps_its_rows_and_migrates_them(tmp_path):
    from deepgap.store.recover import recover

    path = _v1_store(tmp_path / "old.sqlite")
    rec = recover(str(path), str(tmp_path / "new.sqlite"))
    assert rec.saved["runs"] == 4 and rec.lost["runs"] == 0 and rec.saved["serve_runs"] == 1
    s = Store(str(tmp_path / "new.sqlite"), readonly=True)
    assert s.file_version == SCHEMA_VERSION
    assert _kinds(s) == {
        "r1-sweep": "sweep",
        "r2-profile": "profile",
        "r3-serve": "serve",
        "r4-fleet": "fleet",
    }
    assert s.table_frame("serve_runs")["mean_batch"].tolist() == [3.5]
    s.close()
