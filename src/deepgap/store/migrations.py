"""The store's schema as an ordered list of migrations; ``PRAGMA user_version`` counts those applied.

Why versioned steps: a store is kept for years and copied between machines, so every reader meets
files written by older deepgaps. Instead of recognising old files by their shape or date in each
reader, a store is brought to the current schema once, when it is opened: a writer applies the
missing steps to the file in one transaction, a reader to a copy in memory (a store opened for reading
is never changed). A new store is made by the same steps from version 0, so a migrated store and a new
one have the same tables with their columns in the same order (what merging compares).

Each step is a small function of an open connection inside the caller's transaction; its docstring
says why it exists. Steps are never edited once released: a change to the schema is a new step.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from deepgap.store.schema import FEATURE_TABLES, RUN_KINDS, Column, TableSpec

# The core tables as the first release made them; later steps change them (never edit this text).
CORE_V1 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL,            -- running | finished | interrupted
    command TEXT NOT NULL,
    spec_json TEXT NOT NULL,          -- the resolved SweepSpec
    env_json TEXT NOT NULL,           -- environment fingerprint
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    deepgap_version TEXT NOT NULL
);
CREATE TABLE results (
    result_id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    config_key TEXT NOT NULL,
    model TEXT NOT NULL, engine TEXT NOT NULL, precision TEXT NOT NULL, batch_size INTEGER NOT NULL,
    device TEXT NOT NULL, memory_format TEXT NOT NULL, threads INTEGER, resolution INTEGER NOT NULL,
    sweep INTEGER NOT NULL, include_transfer INTEGER NOT NULL,
    status TEXT NOT NULL, reason TEXT NOT NULL,
    n_samples INTEGER, n_repeats INTEGER, warmup INTEGER,
    latency_mean_s REAL, latency_std_s REAL, latency_min_s REAL, latency_p5_s REAL, latency_median_s REAL,
    latency_p90_s REAL, latency_p95_s REAL, latency_p99_s REAL, latency_max_s REAL,
    latency_median_ci_low_s REAL, latency_median_ci_high_s REAL, latency_p99_ci_low_s REAL, latency_p99_ci_high_s REAL,
    throughput_ips REAL, throughput_ci_low_ips REAL, throughput_ci_high_ips REAL, throughput_pipelined_ips REAL,
    cv_repeats REAL, target_ci REAL, ci_met INTEGER,
    peak_mem_allocated_bytes INTEGER, peak_mem_reserved_bytes INTEGER, device_mem_used_bytes INTEGER,
    host_rss_bytes INTEGER, flops_per_image REAL, params INTEGER, weights_sha TEXT,
    duration_s REAL, started_at REAL,
    extra_json TEXT NOT NULL DEFAULT '{}',
    UNIQUE (run_id, config_key)
);
CREATE TABLE samples (
    result_id INTEGER NOT NULL REFERENCES results(result_id),
    repeat INTEGER NOT NULL,
    latencies_s BLOB NOT NULL,        -- little-endian float64, one per timed iteration
    PRIMARY KEY (result_id, repeat)
);
CREATE TABLE telemetry (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    result_id INTEGER REFERENCES results(result_id),  -- NULL for run-level samples (idle, thermal warm-up)
    phase TEXT NOT NULL,              -- idle | warmup | measure | thermal
    t_s REAL NOT NULL,                -- seconds since the epoch
    data_json TEXT NOT NULL           -- one sample: {metric: value}
);
CREATE INDEX telemetry_by_result ON telemetry(result_id);
"""


@dataclass(frozen=True)
class Migration:
    """One schema step: ``apply`` takes a store from ``version - 1`` to ``version``."""

    version: int
    name: str
    apply: Callable[[sqlite3.Connection], None]


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}


def create(con: sqlite3.Connection, spec: TableSpec) -> None:
    """``CREATE TABLE`` (and its index) for a declared table."""
    con.execute(spec.ddl())
    for stmt in spec.index_ddl():
        con.execute(stmt)


def _core_tables(con: sqlite3.Connection) -> None:
    """The core tables of the first release: runs, results, their raw samples and telemetry."""
    # one statement at a time: executescript() would COMMIT the caller's BEGIN IMMEDIATE
    for stmt in CORE_V1.split(";"):
        if stmt.strip():
            con.execute(stmt)


def _run_kind(con: sqlite3.Connection) -> None:
    """``runs.kind``: which driver wrote a run, so that ``--resume`` picks up only runs of its own kind.

    Before this column, ``profile`` and ``peaks`` wrote ``"kind"`` into the sweep spec (where a resumed
    sweep then failed on an unknown setting): it moves from the spec to the column. Serve runs are
    known by their ``options.serve`` settings or their serving rows, fleet runs by the ``fleet`` entry
    of their environment; every other run is a sweep. A row whose JSON does not decode is left as it
    is (the readers report it).
    """
    con.execute("ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'sweep'")
    tables = _tables(con)
    served: set[str] = set()
    for table in ("serve_runs", "serve_curves", "capacity"):
        if table in tables:
            served |= {r[0] for r in con.execute(f"SELECT DISTINCT run_id FROM {table}").fetchall()}
    for run_id, spec_json, env_json in con.execute("SELECT run_id, spec_json, env_json FROM runs").fetchall():
        try:
            spec, env = json.loads(spec_json), json.loads(env_json)
        except (TypeError, ValueError):
            continue
        if not isinstance(spec, dict) or not isinstance(env, dict):
            continue
        kind = spec.get("kind")
        if isinstance(kind, str) and kind in RUN_KINDS:
            del spec["kind"]
            con.execute(
                "UPDATE runs SET kind = ?, spec_json = ? WHERE run_id = ?", (kind, json.dumps(spec), run_id)
            )
            continue
        options = spec.get("options")
        if run_id in served or (isinstance(options, dict) and "serve" in options):
            kind = "serve"
        elif isinstance(env.get("fleet"), dict):
            kind = "fleet"
        else:
            continue
        con.execute("UPDATE runs SET kind = ? WHERE run_id = ?", (kind, run_id))


def _feature_tables(con: sqlite3.Connection) -> None:
    """The serving and roofline tables, declared to the store instead of created by each feature.

    Older stores got them on first use (``CREATE TABLE IF NOT EXISTS`` in the feature), so they may
    exist already: a missing table is created, a missing index added, and a table whose columns are
    declared with other types than today's (``serve_runs.mean_batch`` was TEXT) is rebuilt with the
    declared ones, its rows kept.
    """
    have = _tables(con)
    for spec in FEATURE_TABLES:
        if spec.name not in have:
            create(con, spec)
            continue
        stored = {r[1]: str(r[2]).upper() for r in con.execute(f"PRAGMA table_info({spec.name})").fetchall()}
        declared = {c.name: c.type for c in spec.columns}
        if any(stored.get(n, t) != t for n, t in declared.items()):
            _rebuild(con, spec, stored)
        else:
            for c in spec.columns:
                if c.name not in stored:
                    con.execute(f"ALTER TABLE {spec.name} ADD COLUMN {c.sql()}")
        for stmt in spec.index_ddl():
            con.execute(stmt)


def _rebuild(con: sqlite3.Connection, spec: TableSpec, stored: dict[str, str]) -> None:
    """Give ``spec.name`` the declared columns and types, keeping its rows (SQLite cannot retype a column).

    SQLite's recipe: build the new table under another name, copy, drop the old one, rename. Columns
    the declaration lacks are kept (after the declared ones), so no stored value is dropped.
    """
    extra = tuple(Column(n, t) for n, t in stored.items() if n not in spec.names)
    full = TableSpec(spec.name, spec.columns + extra, spec.key, spec.parent_key, spec.parent, spec.index)
    new = f"_new_{spec.name}"
    con.execute(full.ddl(new))
    cols = ", ".join(c for c in full.names if c in stored)
    con.execute(f"INSERT INTO {new} ({cols}) SELECT {cols} FROM {spec.name}")
    con.execute(f"DROP TABLE {spec.name}")  # its indexes go with it; create() below adds the declared one
    con.execute(f"ALTER TABLE {new} RENAME TO {spec.name}")


MIGRATIONS: list[Migration] = [
    Migration(1, "core tables", _core_tables),
    Migration(2, "runs.kind", _run_kind),
    Migration(3, "feature tables", _feature_tables),
]
SCHEMA_VERSION = MIGRATIONS[-1].version


def version(con: sqlite3.Connection) -> int:
    """The schema version a store says it has (``PRAGMA user_version``)."""
    return int(con.execute("PRAGMA user_version").fetchone()[0])


def migrate(con: sqlite3.Connection, target: int = SCHEMA_VERSION) -> list[str]:
    """Apply the missing steps up to ``target`` (inside a transaction); returns their names, oldest first."""
    start = version(con)
    done = []
    for step in MIGRATIONS:
        if start < step.version <= target:
            step.apply(con)
            con.execute(f"PRAGMA user_version = {step.version}")
            done.append(step.name)
    return done
