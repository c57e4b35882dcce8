"""Serving rows in a deepgap store: a serve run's levels, curves and capacities, in one transaction.

A serve run is one row of ``runs`` (kind ``serve``; its spec is a sweep spec of the served
configuration whose ``options.serve`` holds the serving settings), its run-level telemetry (the idle
baseline and thermal warm-up, `deepgap.serving.run.prelude`) plus: ``serve_runs``, one row per
measured load level (a single-stream run, an offline run at one batch size, a server run at one rate, a
tenant in one co-location phase) with the simulator's prediction for the same arrivals beside it;
``serve_requests``, its requests; ``serve_curves``, the calibrated service curve; ``capacity``, search
results (measured and simulated). The tables are declared to the store (`deepgap.store.schema`), which
creates them in its migrations and writes and reads them for this module.

The run goes through the one driver and its run session as every kind of run does
(`deepgap.serving.run.serve_run.run_serve`):
opened when its worker has started, the prelude stored, then `record` writes every level of the run
in one transaction, then the run is finished. An interrupted serve keeps its run row (status
``interrupted``), prelude and the levels that finished before the stop, in one transaction: never a
half-served level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from deepgap.serving.records.details import CapacityDetails, CurveDetails, LevelDetails
from deepgap.store.schema import CAPACITY, SERVE_CURVES, SERVE_REQUESTS, SERVE_RUNS

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.drive.config import SweepSpec
    from deepgap.store import Store

_LEVEL_COLS = [c for c in SERVE_RUNS.names if c != "serve_id"]
_REQUEST_COLS = [c for c in SERVE_REQUESTS.names if c not in ("serve_id", "idx")]


@dataclass
class LevelRow:
    """One ``serve_runs`` row, optionally its requests (a `RequestLog`), and its ``extra_json``."""

    values: dict[str, Any]
    log: Any = None
    details: LevelDetails = field(default_factory=LevelDetails)


@dataclass
class ServeRecord:
    """Everything one ``deepgap serve`` produced: its run row's spec and env, and the rows `record` writes."""

    spec: SweepSpec  # the run row's spec (`deepgap.serving.run.rows.run_spec`)
    command: str
    env: dict[str, Any]
    status: str = "finished"
    levels: list[LevelRow] = field(default_factory=list)
    curves: list[dict[str, Any]] = field(default_factory=list)  # columns and "details" (`CurveDetails`)
    capacities: list[dict[str, Any]] = field(default_factory=list)  # and "details" (`CapacityDetails`)


def keep_partial(exc: KeyboardInterrupt, rec: ServeRecord) -> None:
    """Hand the levels finished before a stop (Ctrl-C, SIGTERM) to `deepgap.serving.run.serve_run`, which stores them.

    Why: a capacity search runs for minutes, one measured level after another; each finished level is
    a measurement (its requests, its verdict) and an interruption must not lose it. The level in flight
    is not among them: it raised before it was appended.
    """
    if rec.levels:
        rec.status = "interrupted"
        exc.partial = rec  # type: ignore[attr-defined]


def has_tables(store: Store) -> bool:
    """Whether the store holds serving data (every store has the tables; some have rows)."""
    return store.count(SERVE_RUNS) > 0 or store.count(CAPACITY) > 0


def record(store: Store, run_id: str, rec: ServeRecord) -> None:
    """Write a serve run's levels (with their requests), curves and capacities in one transaction."""
    with store.transaction():
        for lv in rec.levels:
            vals = {c: lv.values.get(c) for c in _LEVEL_COLS}
            vals.update(run_id=run_id, extra_json=lv.details.to_json())
            (serve_id,) = store.insert(SERVE_RUNS, [vals])
            if lv.log is not None and lv.log.n:
                c = lv.log.columns()
                cols = {k: np.asarray(c[k]).tolist() for k in _REQUEST_COLS}
                rows = (
                    {"serve_id": serve_id, "idx": i, **{k: v[i] for k, v in cols.items()}}
                    for i in range(lv.log.n)
                )
                store.insert(SERVE_REQUESTS, rows, ids=False)
        store.insert(
            SERVE_CURVES,
            [
                {
                    "run_id": run_id,
                    "tenant": cv.get("tenant", ""),
                    "model": cv["model"],
                    "engine": cv["engine"],
                    "precision": cv["precision"],
                    "device": cv["device"],
                    "memory_format": cv["memory_format"],
                    "resolution": cv["resolution"],
                    "batch_size": cv["batch_size"],
                    "latency_median_s": float(np.median(cv["samples_s"])),
                    "n": len(cv["samples_s"]),
                    "h2d_mean_s": cv.get("h2d_s"),
                    "compute_mean_s": cv.get("compute_s"),
                    "d2h_mean_s": cv.get("d2h_s"),
                    "samples_s": np.asarray(cv["samples_s"], dtype="<f8").tobytes(),
                    "extra_json": CurveDetails.of(cv.get("details")).to_json(),
                }
                for cv in rec.curves
            ],
        )
        store.insert(
            CAPACITY,
            [
                {
                    "run_id": run_id,
                    **{k: v for k, v in cap.items() if k != "details"},
                    "extra_json": CapacityDetails.of(cap.get("details")).to_json(),
                }
                for cap in rec.capacities
            ],
        )


def _frame(
    store: Store,
    table: str,
    run_ids: list[str] | None,
    order: list[str],
    details: type[CurveDetails | LevelDetails | CapacityDetails],
) -> pd.DataFrame:
    """A serving table's rows; the ``extra`` column holds each row's typed details (its ``extra_json``)."""
    df = store.table_frame(table, {"run_id": run_ids} if run_ids else None, order)
    if "extra_json" in df:
        df["extra"] = [details.of(json.loads(x) if x else None) for x in df.pop("extra_json")]
    runs = {r["run_id"]: r for r in store.runs()}
    df["device_name"] = [runs[r]["env"].get("device_name", "") if r in runs else "" for r in df["run_id"]]
    return df


def levels_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every serve level (``serve_runs`` rows), oldest first; ``extra`` holds `LevelDetails`."""
    return _frame(store, "serve_runs", run_ids, ["serve_id"], LevelDetails)


def capacity_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every capacity result; ``extra`` holds `CapacityDetails`."""
    return _frame(store, "capacity", run_ids, ["capacity_id"], CapacityDetails)


def curves_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Calibrated service curves (one row per batch size, raw samples as arrays, `CurveDetails`)."""
    df = _frame(store, "serve_curves", run_ids, ["run_id", "tenant", "batch_size"], CurveDetails)
    if len(df):
        df["samples_s"] = [np.frombuffer(b, dtype="<f8") for b in df["samples_s"]]
    return df


def requests(store: Store, serve_id: int) -> pd.DataFrame:
    """The requests of one level."""
    return store.table_frame(SERVE_REQUESTS, {"serve_id": int(serve_id)}, ["idx"])
