"""Serving tables in a deepgap store: created on first use, written in one transaction per serve run.

Additive to the store's schema (``CREATE TABLE IF NOT EXISTS``; the schema version is unchanged, so
older deepgap versions still open the file and ignore these tables). A serve run is one row of
``runs`` (its spec is a sweep spec of the served configuration whose ``options.serve`` holds the
serving settings) plus: ``serve_runs``, one row per measured load level (a single-stream run, an
offline run at one batch size, a server run at one rate, a tenant in one co-location phase) with
the simulator's prediction for the same arrivals beside it; ``serve_requests``, its requests;
``serve_curves``, the calibrated service curve; ``capacity``, search results (measured and simulated).
Everything of a serve run is written in one transaction at its end, so a run is stored whole or not at all.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store

_LEVEL_COLS = [
    "run_id", "tenant", "scenario", "purpose", "phase", "model", "engine", "precision", "device", "memory_format",
    "resolution", "max_batch", "max_delay_s", "target_qps", "arrival", "seed", "status", "reason", "n", "n_planned",
    "duration_s", "achieved_qps", "latency_mean_s", "latency_p50_s", "latency_p90_s", "latency_p95_s",
    "latency_p99_s", "latency_max_s", "queue_mean_s", "queue_p99_s", "h2d_mean_s", "compute_mean_s", "d2h_mean_s",
    "other_mean_s", "mean_batch", "slo_s", "n_over_slo", "verdict", "stopped", "predicted_qps",
    "predicted_mean_s", "predicted_p90_s", "predicted_p99_s", "extra_json",
]
_REAL = {"max_delay_s", "target_qps", "duration_s", "achieved_qps", "slo_s", "mean_batch"} | {
    c for c in _LEVEL_COLS if c.endswith("_s") or c.startswith("predicted")}
_INT = {"resolution", "max_batch", "seed", "n", "n_planned", "n_over_slo"}

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS serve_runs (serve_id INTEGER PRIMARY KEY, "
    + ", ".join(f"{c} {'REAL' if c in _REAL else 'INTEGER' if c in _INT else 'TEXT'}" for c in _LEVEL_COLS)
    + ")",
    "CREATE INDEX IF NOT EXISTS serve_runs_by_run ON serve_runs(run_id)",
    """CREATE TABLE IF NOT EXISTS serve_requests (
        serve_id INTEGER NOT NULL REFERENCES serve_runs(serve_id), idx INTEGER NOT NULL,
        arrival_s REAL, dispatch_s REAL, done_s REAL, batch INTEGER, queue_s REAL, h2d_s REAL, compute_s REAL,
        d2h_s REAL, latency_s REAL, PRIMARY KEY (serve_id, idx))""",
    """CREATE TABLE IF NOT EXISTS serve_curves (
        run_id TEXT NOT NULL, tenant TEXT NOT NULL, model TEXT, engine TEXT, precision TEXT, device TEXT,
        memory_format TEXT, resolution INTEGER, batch_size INTEGER NOT NULL, latency_median_s REAL, n INTEGER,
        h2d_mean_s REAL, compute_mean_s REAL, d2h_mean_s REAL, samples_s BLOB, extra_json TEXT,
        PRIMARY KEY (run_id, tenant, batch_size))""",
    """CREATE TABLE IF NOT EXISTS capacity (
        capacity_id INTEGER PRIMARY KEY, run_id TEXT, tenant TEXT, source TEXT, model TEXT, engine TEXT,
        precision TEXT, device TEXT, device_name TEXT, memory_format TEXT, resolution INTEGER, slo_s REAL,
        percentile REAL, confidence REAL, max_batch INTEGER, max_delay_s REAL, capacity_qps REAL, upper_qps REAL,
        predicted_qps REAL, n_probes INTEGER, note TEXT, extra_json TEXT)""",
]


@dataclass
class LevelRow:
    """One ``serve_runs`` row and, optionally, its requests (a `RequestLog`)."""

    values: dict[str, Any]
    log: Any = None


@dataclass
class ServeRecord:
    """Everything one ``deepgap serve`` produced, written together by `save`."""

    spec: dict[str, Any]
    command: str
    env: dict[str, Any]
    status: str = "finished"
    levels: list[LevelRow] = field(default_factory=list)
    curves: list[dict[str, Any]] = field(default_factory=list)
    capacities: list[dict[str, Any]] = field(default_factory=list)


def ensure_tables(con: sqlite3.Connection) -> None:
    """Create the serving tables if absent (call inside a write transaction)."""
    for stmt in _SCHEMA:
        con.execute(stmt)


def has_tables(store: Store) -> bool:
    """Whether the store holds serving tables."""
    row = store.con.execute("SELECT count(*) FROM sqlite_master WHERE name='serve_runs'").fetchone()
    return bool(row[0])


def _clean(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def save(store: Store, rec: ServeRecord, version: str) -> str:
    """Write a serve run in one transaction; returns its run id."""
    from deepgap.session import SERVE, RunSession

    session = RunSession(store.path, SERVE, store)  # the run row, as for every kind of run
    with store.transaction() as con:
        ensure_tables(con)
        run_id = session.open(rec.spec, rec.command, rec.env, version)
        for lv in rec.levels:
            vals = {c: _clean(lv.values.get(c)) for c in _LEVEL_COLS if c != "run_id"}
            vals["extra_json"] = json.dumps(lv.values.get("extra") or {}, default=str)
            cols = ["run_id", *vals]
            cur = con.execute(f"INSERT INTO serve_runs ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                              (run_id, *vals.values()))
            if lv.log is not None and lv.log.n:
                c = lv.log.columns()
                rows = zip(range(lv.log.n), *(np.asarray(c[k]).tolist() for k in (
                    "arrival_s", "dispatch_s", "done_s", "batch", "queue_s", "h2d_s", "compute_s", "d2h_s",
                    "latency_s")), strict=True)
                con.executemany("INSERT INTO serve_requests VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                ((cur.lastrowid, *r) for r in rows))
        for cv in rec.curves:
            con.execute(
                "INSERT INTO serve_curves VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, cv.get("tenant", ""), cv["model"], cv["engine"], cv["precision"], cv["device"],
                 cv["memory_format"], cv["resolution"], cv["batch_size"], float(np.median(cv["samples_s"])),
                 len(cv["samples_s"]), cv.get("h2d_s"), cv.get("compute_s"), cv.get("d2h_s"),
                 np.asarray(cv["samples_s"], dtype="<f8").tobytes(), json.dumps(cv.get("extra") or {})),
            )
        for cap in rec.capacities:
            cols = [k for k in cap if k != "extra"]
            con.execute(
                f"INSERT INTO capacity (run_id, {', '.join(cols)}, extra_json) VALUES (?, {', '.join('?' for _ in cols)}, ?)",
                (run_id, *(_clean(cap[k]) for k in cols), json.dumps(cap.get("extra") or {}, default=str)),
            )
        session.finish(rec.status)
    return run_id


def _frame(store: Store, table: str, run_ids: list[str] | None, order: str) -> pd.DataFrame:
    import pandas as pd

    if not has_tables(store):
        return pd.DataFrame()
    q = f"SELECT * FROM {table}"
    args: tuple[Any, ...] = ()
    if run_ids:
        q += f" WHERE run_id IN ({','.join('?' for _ in run_ids)})"
        args = tuple(run_ids)
    df = pd.read_sql_query(f"{q} ORDER BY {order}", store.con, params=args)
    if "extra_json" in df:
        df["extra"] = [json.loads(x) if x else {} for x in df.pop("extra_json")]
    runs = {r["run_id"]: r for r in store.runs()}
    if "run_id" in df and len(df):
        df["device_name"] = [runs[r]["env"].get("device_name", "") if r in runs else "" for r in df["run_id"]]
    return df


def levels_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every serve level (``serve_runs`` rows), oldest first."""
    return _frame(store, "serve_runs", run_ids, "serve_id")


def capacity_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every capacity result."""
    return _frame(store, "capacity", run_ids, "capacity_id")


def curves_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Calibrated service curves (one row per batch size, with raw samples as arrays)."""
    df = _frame(store, "serve_curves", run_ids, "run_id, tenant, batch_size")
    if len(df):
        df["samples_s"] = [np.frombuffer(b, dtype="<f8") for b in df["samples_s"]]
    return df


def requests(store: Store, serve_id: int) -> pd.DataFrame:
    """The requests of one level."""
    import pandas as pd

    return pd.read_sql_query("SELECT * FROM serve_requests WHERE serve_id=? ORDER BY idx", store.con,
                             params=(int(serve_id),))
