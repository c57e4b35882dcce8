"""Tables declared to the store: name, typed columns, key and parent key (`TableSpec`).

Why declarations: the store creates every table through its versioned migrations, merges them by
their declared keys and reads and writes them through generic typed helpers, so no feature writes
SQL of its own. The declarations of the features' tables (serving, roofline) live here, beside the
migrations that create them, because a store's schema must not depend on which feature modules a
process happened to import; the features use these specs by name (``SERVE_RUNS`` …).

Key semantics, as merging uses them:

- ``key``: the primary key. A single INTEGER key is the row's own id: rows merged from another
  store get new ids, and children that point at it (``parent_key``) are mapped to them.
- ``parent_key``/``parent``: the column that names the parent row and the parent's table
  (``run_id`` → ``runs``, ``profile_id`` → ``roofline_profiles``). A table without a parent is a cache
  shared by all runs (``roofline_model_costs``): merged row by row, keeping what the output holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One declared column: SQLite type (TEXT, INTEGER, REAL, BLOB), NOT NULL, default (an SQL literal)."""

    name: str
    type: str
    not_null: bool = False
    default: str | None = None

    def sql(self) -> str:  # noqa: D102
        return (
            f"{self.name} {self.type}"
            + (" NOT NULL" if self.not_null else "")
            + (f" DEFAULT {self.default}" if self.default is not None else "")
        )


def col(text: str) -> Column:
    """A `Column` from ``"name TYPE [NOT NULL] [DEFAULT literal]"`` (declarations read like the DDL)."""
    head, _, default = text.partition(" DEFAULT ")
    name, typ, *rest = head.split()
    return Column(name, typ.upper(), "NOT NULL" in " ".join(rest).upper(), default or None)


@dataclass(frozen=True)
class TableSpec:
    """A table the store creates, reads, writes and merges (see the module doc for the key semantics)."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    parent_key: str | None = None
    parent: str | None = None
    index: tuple[str, str] | None = None  # one secondary index: (its name, its column)

    @property
    def names(self) -> list[str]:
        """Column names in declared order."""
        return [c.name for c in self.columns]

    @property
    def own_id(self) -> str | None:
        """The INTEGER PRIMARY KEY that merging renumbers, or None."""
        if len(self.key) == 1 and self.column(self.key[0]).type == "INTEGER":
            return self.key[0]
        return None

    def column(self, name: str) -> Column:
        """The declared column ``name`` (a `KeyError` for another name: callers pass declared names)."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def ddl(self, name: str | None = None) -> str:
        """``CREATE TABLE`` for this declaration (under ``name`` when given, to rebuild a table)."""
        parts = []
        for c in self.columns:
            text = c.sql()
            if c.name == self.own_id:
                text = f"{c.name} INTEGER PRIMARY KEY"
            elif c.name == self.parent_key and self.parent:
                ref = "run_id" if self.parent == "runs" else c.name
                text += f" REFERENCES {self.parent}({ref})"
            parts.append(text)
        if self.key and self.own_id is None:
            parts.append(f"PRIMARY KEY ({', '.join(self.key)})")
        return f"CREATE TABLE {name or self.name} ({', '.join(parts)})"

    def index_ddl(self) -> list[str]:
        """``CREATE INDEX`` statements (idempotent)."""
        if not self.index:
            return []
        return [f"CREATE INDEX IF NOT EXISTS {self.index[0]} ON {self.name}({self.index[1]})"]


def _t(
    name: str, columns: list[str], child_of: tuple[str, str] | None = ("runs", "run_id"), **kw
) -> TableSpec:
    """A feature table; ``child_of``: (the parent's table, the column naming its row), by default a run."""
    parent, parent_key = child_of or (None, None)
    return TableSpec(name, tuple(col(c) for c in columns), parent_key=parent_key, parent=parent, **kw)


RUN_KINDS = ("sweep", "fleet", "serve", "profile", "peaks")
# the served configuration: the same columns, in this order, in serve_runs, serve_curves and capacity
_SERVED = (
    "model TEXT",
    "engine TEXT",
    "precision TEXT",
    "device TEXT",
    "memory_format TEXT",
    "resolution INTEGER",
)

# --- serving (deepgap.serving.records.storage) ------------------------------------------------------------
SERVE_RUNS = _t(
    "serve_runs",
    [
        "serve_id INTEGER",
        "run_id TEXT",
        "tenant TEXT",
        "scenario TEXT",
        "purpose TEXT",
        "phase TEXT",
        *_SERVED,
        "max_batch INTEGER",
        "max_delay_s REAL",
        "target_qps REAL",
        "arrival TEXT",
        "seed INTEGER",
        "status TEXT",
        "reason TEXT",
        "n INTEGER",
        "n_planned INTEGER",
        "duration_s REAL",
        "achieved_qps REAL",
        "latency_mean_s REAL",
        "latency_p50_s REAL",
        "latency_p90_s REAL",
        "latency_p95_s REAL",
        "latency_p99_s REAL",
        "latency_max_s REAL",
        "queue_mean_s REAL",
        "queue_p99_s REAL",
        "h2d_mean_s REAL",
        "compute_mean_s REAL",
        "d2h_mean_s REAL",
        "other_mean_s REAL",
        "mean_batch REAL",
        "slo_s REAL",
        "n_over_slo INTEGER",
        "verdict TEXT",
        "stopped TEXT",
        "predicted_qps REAL",
        "predicted_mean_s REAL",
        "predicted_p90_s REAL",
        "predicted_p99_s REAL",
        "extra_json TEXT",
    ],
    key=("serve_id",),
    index=("serve_runs_by_run", "run_id"),
)
SERVE_REQUESTS = _t(
    "serve_requests",
    [
        "serve_id INTEGER NOT NULL",
        "idx INTEGER NOT NULL",
        "arrival_s REAL",
        "dispatch_s REAL",
        "done_s REAL",
        "batch INTEGER",
        "queue_s REAL",
        "h2d_s REAL",
        "compute_s REAL",
        "d2h_s REAL",
        "latency_s REAL",
    ],
    key=("serve_id", "idx"),
    child_of=("serve_runs", "serve_id"),
)
SERVE_CURVES = _t(
    "serve_curves",
    [
        "run_id TEXT NOT NULL",
        "tenant TEXT NOT NULL",
        *_SERVED,
        "batch_size INTEGER NOT NULL",
        "latency_median_s REAL",
        "n INTEGER",
        "h2d_mean_s REAL",
        "compute_mean_s REAL",
        "d2h_mean_s REAL",
        "samples_s BLOB",
        "extra_json TEXT",
    ],
    key=("run_id", "tenant", "batch_size"),
)
CAPACITY = _t(
    "capacity",
    [
        "capacity_id INTEGER",
        "run_id TEXT",
        "tenant TEXT",
        "source TEXT",
        *_SERVED[:4],
        "device_name TEXT",
        *_SERVED[4:],
        "slo_s REAL",
        "percentile REAL",
        "confidence REAL",
        "max_batch INTEGER",
        "max_delay_s REAL",
        "capacity_qps REAL",
        "upper_qps REAL",
        "predicted_qps REAL",
        "n_probes INTEGER",
        "note TEXT",
        "extra_json TEXT",
    ],
    key=("capacity_id",),
)
# --- roofline (deepgap.roofline.storage) ----------------------------------------------------------
ROOFLINE_PEAKS = _t(
    "roofline_peaks",
    [
        "run_id TEXT NOT NULL",
        "name TEXT NOT NULL",
        "kind TEXT NOT NULL",
        "value REAL",
        "unit TEXT NOT NULL",
        "status TEXT NOT NULL",
        "reason TEXT NOT NULL",
        "details_json TEXT NOT NULL DEFAULT '{}'",
    ],
    key=("run_id", "name"),
)
ROOFLINE_PROFILES = _t(
    "roofline_profiles",
    [
        "profile_id INTEGER",
        "run_id TEXT NOT NULL",
        "model TEXT NOT NULL",
        "mode TEXT NOT NULL",
        "precision TEXT NOT NULL",
        "batch_size INTEGER NOT NULL",
        "resolution INTEGER",
        "device TEXT NOT NULL",
        "memory_format TEXT NOT NULL",
        "status TEXT NOT NULL",
        "reason TEXT NOT NULL",
        "step_time_median_s REAL",
        "n_steps INTEGER",
        "throughput_ips REAL",
        "flops_per_step REAL",
        "bytes_per_step REAL",
        "min_bytes_per_step REAL",
        "achieved_tflops REAL",
        "profiled_steps INTEGER",
        "kernel_time_per_step_s REAL",
        "attributed_flops_per_step REAL",
        "ncu_status TEXT",
        "ncu_reason TEXT",
        "started_at REAL",
        "duration_s REAL",
        "step_times_json TEXT NOT NULL DEFAULT '[]'",
        "cost_json TEXT NOT NULL DEFAULT '{}'",
        "ncu_json TEXT NOT NULL DEFAULT '{}'",
        "extra_json TEXT NOT NULL DEFAULT '{}'",
    ],
    key=("profile_id",),
)
ROOFLINE_KERNELS = _t(
    "roofline_kernels",
    [
        "profile_id INTEGER NOT NULL",
        "source TEXT NOT NULL",
        "name TEXT NOT NULL",
        "short_name TEXT NOT NULL",
        "cluster TEXT NOT NULL",
        "launches_per_step REAL",
        "time_per_step_s REAL",
        "flops_per_step REAL",
        "ew_flops_per_step REAL",
        "bytes_per_step REAL",
        "ops TEXT NOT NULL DEFAULT ''",
        "metrics_json TEXT NOT NULL DEFAULT '{}'",
    ],
    child_of=("roofline_profiles", "profile_id"),
    index=("roofline_kernels_by_profile", "profile_id"),
)
ROOFLINE_MODEL_COSTS = _t(
    "roofline_model_costs",
    [
        "model TEXT NOT NULL",
        "resolution INTEGER NOT NULL",
        "mode TEXT NOT NULL",
        "flops_per_image REAL",
        "params INTEGER",
        "cost_json TEXT NOT NULL",
    ],
    key=("model", "resolution", "mode"),
    child_of=None,
)

# parents before children: the order tables are created, merged and copied in
FEATURE_TABLES: tuple[TableSpec, ...] = (
    SERVE_RUNS,
    SERVE_REQUESTS,
    SERVE_CURVES,
    CAPACITY,
    ROOFLINE_PEAKS,
    ROOFLINE_PROFILES,
    ROOFLINE_KERNELS,
    ROOFLINE_MODEL_COSTS,
)
TABLES = {t.name: t for t in FEATURE_TABLES}
