"""Roofline tables in a deepgap store, added without touching the store's schema version.

Why separate tables: peaks, profiles and kernels are not per-configuration benchmark results, and the
``results`` table's columns are fixed. Each ``deepgap peaks`` / ``deepgap profile`` invocation is an ordinary
run (a ``runs`` row with its environment fingerprint, ``command`` naming it); its rows hang off the run id in
four tables created on first use with ``CREATE TABLE IF NOT EXISTS`` inside a store transaction. Stores
without them read as empty frames, and an older deepgap simply ignores them.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from deepgap.roofline.trace import KERNEL_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.roofline.peaks import PeakMeasurement
    from deepgap.roofline.profile import ProfileResult
    from deepgap.store import Store

TABLES = {
    "roofline_peaks": """CREATE TABLE IF NOT EXISTS roofline_peaks (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        name TEXT NOT NULL,               -- fp32 | tf32 | fp16 | bf16 | int8 | fp8 | memory
        kind TEXT NOT NULL,               -- matmul | bandwidth
        value REAL,                       -- TFLOP/s (TOPS for int8) or GB/s; NULL unless status = ok
        unit TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL,
        details_json TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, name))""",
    "roofline_profiles": """CREATE TABLE IF NOT EXISTS roofline_profiles (
        profile_id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        model TEXT NOT NULL, mode TEXT NOT NULL, precision TEXT NOT NULL, batch_size INTEGER NOT NULL,
        resolution INTEGER, device TEXT NOT NULL, memory_format TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL,
        step_time_median_s REAL, n_steps INTEGER, throughput_ips REAL,
        flops_per_step REAL, bytes_per_step REAL, min_bytes_per_step REAL, achieved_tflops REAL,
        profiled_steps INTEGER, kernel_time_per_step_s REAL, attributed_flops_per_step REAL,
        ncu_status TEXT, ncu_reason TEXT,
        started_at REAL, duration_s REAL,
        step_times_json TEXT NOT NULL DEFAULT '[]',
        cost_json TEXT NOT NULL DEFAULT '{}',
        ncu_json TEXT NOT NULL DEFAULT '{}',
        extra_json TEXT NOT NULL DEFAULT '{}')""",
    "roofline_kernels": """CREATE TABLE IF NOT EXISTS roofline_kernels (
        profile_id INTEGER NOT NULL REFERENCES roofline_profiles(profile_id),
        source TEXT NOT NULL,             -- torch (torch.profiler) | ncu (Nsight Compute)
        name TEXT NOT NULL, short_name TEXT NOT NULL, cluster TEXT NOT NULL,
        launches_per_step REAL, time_per_step_s REAL,
        flops_per_step REAL, ew_flops_per_step REAL, bytes_per_step REAL,
        ops TEXT NOT NULL DEFAULT '',
        metrics_json TEXT NOT NULL DEFAULT '{}')""",
    "roofline_model_costs": """CREATE TABLE IF NOT EXISTS roofline_model_costs (
        model TEXT NOT NULL, resolution INTEGER NOT NULL, mode TEXT NOT NULL,
        flops_per_image REAL, params INTEGER, cost_json TEXT NOT NULL,
        PRIMARY KEY (model, resolution, mode))""",
}


def ensure_tables(store: Store) -> None:
    """Create the roofline tables if this store lacks them (one transaction)."""
    with store.transaction() as con:
        for ddl in TABLES.values():
            con.execute(ddl)
        con.execute("CREATE INDEX IF NOT EXISTS roofline_kernels_by_profile ON roofline_kernels(profile_id)")


def _has(store: Store, table: str) -> bool:
    row = store.con.execute(
        "SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?", (table,)
    ).fetchone()
    return bool(row[0])


def _num(v: Any) -> Any:
    """None for NaN (SQLite stores NaN as NULL anyway; be explicit)."""
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def record_peaks(store: Store, run_id: str, peaks: list[PeakMeasurement]) -> None:
    """Store a run's measured ceilings."""
    ensure_tables(store)
    with store.transaction() as con:
        con.executemany(
            "INSERT OR REPLACE INTO roofline_peaks VALUES (?,?,?,?,?,?,?,?)",
            [
                (
                    run_id,
                    p.name,
                    p.kind,
                    _num(p.value),
                    p.unit,
                    p.status,
                    p.reason,
                    json.dumps(p.details, default=str),
                )
                for p in peaks
            ],
        )


def _kernel_rows(pid: int, source: str, df) -> list[tuple]:
    if df is None or len(df) == 0:
        return []
    rows = []
    for r in df.to_dict("records"):
        rows.append(
            (
                pid,
                source,
                r["name"],
                r.get("short_name", ""),
                r["cluster"],
                _num(r.get("launches_per_step")),
                _num(r.get("time_per_step_s")),
                _num(r.get("flops_per_step")),
                _num(r.get("ew_flops_per_step")),
                _num(r.get("bytes_per_step")),
                r.get("ops", "") or "",
                json.dumps(r.get("metrics", {}) or {}, default=str),
            )
        )
    return rows


def record_profile(store: Store, run_id: str, res: ProfileResult) -> int:
    """Store one profile, its torch and ncu kernel tables and the model's cost in one transaction."""
    ensure_tables(store)
    s = res.spec
    ncu = dict(res.ncu)
    with store.transaction() as con:
        cur = con.execute(
            "INSERT INTO roofline_profiles (run_id, model, mode, precision, batch_size, resolution, device, "
            "memory_format, status, reason, step_time_median_s, n_steps, throughput_ips, flops_per_step, "
            "bytes_per_step, min_bytes_per_step, achieved_tflops, profiled_steps, kernel_time_per_step_s, "
            "attributed_flops_per_step, ncu_status, ncu_reason, started_at, duration_s, step_times_json, "
            "cost_json, ncu_json, extra_json) VALUES (" + ",".join("?" * 28) + ")",
            (
                run_id,
                s.model,
                s.mode,
                s.precision,
                s.batch_size,
                res.resolution or s.resolution,
                s.device,
                s.memory_format,
                res.status,
                res.reason,
                _num(res.step_time_median_s),
                len(res.step_times_s),
                _num(res.throughput_ips),
                _num(res.flops_per_step),
                _num(res.bytes_per_step),
                _num(res.min_bytes_per_step),
                _num(res.achieved_tflops),
                s.profiled_steps,
                _num(res.kernel_time_per_step_s),
                _num(res.attributed_flops_per_step),
                ncu.get("status"),
                ncu.get("reason"),
                res.started_at,
                res.duration_s,
                json.dumps(res.step_times_s),
                json.dumps(res.cost, default=str),
                json.dumps(ncu, default=str),
                json.dumps(res.extra, default=str),
            ),
        )
        pid = int(cur.lastrowid)
        con.executemany(
            "INSERT INTO roofline_kernels VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            _kernel_rows(pid, "torch", res.kernels) + _kernel_rows(pid, "ncu", res.ncu_kernels),
        )
        if res.cost:
            c = res.cost
            con.execute(
                "INSERT OR REPLACE INTO roofline_model_costs VALUES (?,?,?,?,?,?)",
                (
                    c["model"],
                    c["resolution"],
                    c["mode"],
                    c["flops_per_image"],
                    c["params"],
                    json.dumps(c, default=str),
                ),
            )
    return pid


def _with_runs(store: Store, df: pd.DataFrame) -> pd.DataFrame:
    runs = {r["run_id"]: r for r in store.runs()}
    df["device_name"] = [runs.get(r, {}).get("env", {}).get("device_name", "") for r in df["run_id"]]
    df["host"] = [runs.get(r, {}).get("host", "") for r in df["run_id"]]
    df["created_at"] = [runs.get(r, {}).get("created_at", float("nan")) for r in df["run_id"]]
    return df


def _frame(store: Store, table: str, columns: list[str], where: str = "", args: tuple = ()) -> pd.DataFrame:
    import pandas as pd

    if not _has(store, table):
        return pd.DataFrame(columns=columns)
    return pd.read_sql_query(f"SELECT * FROM {table} {where}", store.con, params=args)


def _in(column: str, values: list[Any] | None) -> tuple[str, tuple]:
    if not values:
        return "", ()
    return f"WHERE {column} IN ({','.join('?' for _ in values)})", tuple(values)


def peaks_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Measured ceilings (run_id, name, kind, value, unit, status, reason, details) with device_name, host."""
    where, args = _in("run_id", run_ids)
    df = _frame(
        store,
        "roofline_peaks",
        ["run_id", "name", "kind", "value", "unit", "status", "reason", "details_json"],
        where,
        args,
    )
    df["details"] = [json.loads(x) for x in df.pop("details_json")]
    return _with_runs(store, df)


def profiles_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """One row per profile (``roofline_profiles``, JSON decoded) plus device_name, host and created_at."""
    where, args = _in("run_id", run_ids)
    df = _frame(
        store,
        "roofline_profiles",
        [
            "profile_id",
            "run_id",
            "model",
            "mode",
            "precision",
            "batch_size",
            "status",
            "step_times_json",
            "cost_json",
            "ncu_json",
            "extra_json",
        ],
        where,
        args,
    )
    for col in ("step_times", "cost", "ncu", "extra"):
        df[col] = [json.loads(x) for x in df.pop(f"{col}_json")]
    return _with_runs(store, df)


def kernels_frame(
    store: Store, profile_ids: list[int] | None = None, source: str | None = None
) -> pd.DataFrame:
    """Per-kernel rows (per step) of some profiles; ``source`` ``torch`` or ``ncu`` filters."""
    where, args = _in("profile_id", profile_ids)
    if source:
        where = (where + " AND" if where else "WHERE") + " source = ?"
        args = args + (source,)
    df = _frame(
        store,
        "roofline_kernels",
        ["profile_id", "source", *KERNEL_COLUMNS, "metrics_json"],
        where,
        args,
    )
    df["metrics"] = [json.loads(x) for x in df.pop("metrics_json")]
    return df
