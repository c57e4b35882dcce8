"""Roofline rows in a deepgap store: measured ceilings, profiles, their kernels and model costs.

Why separate tables: peaks, profiles and kernels are not per-configuration benchmark results, and the
``results`` table's columns are fixed. Each ``deepgap peaks`` / ``deepgap profile`` invocation is an ordinary
run (a ``runs`` row of kind ``peaks`` or ``profile`` with its environment fingerprint); its rows hang off the
run id in four tables declared to the store (`deepgap.store.schema`), which creates them in its migrations
and reads and writes them for this module.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from deepgap.roofline.details import ProfileDetails
from deepgap.store.schema import ROOFLINE_KERNELS, ROOFLINE_MODEL_COSTS, ROOFLINE_PEAKS, ROOFLINE_PROFILES

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.roofline.peaks import PeakMeasurement
    from deepgap.roofline.profile import ProfileResult
    from deepgap.store import Store


def record_peaks(store: Store, run_id: str, peaks: list[PeakMeasurement]) -> None:
    """Store a run's measured ceilings."""
    store.insert(
        ROOFLINE_PEAKS,
        [
            {
                "run_id": run_id,
                "name": p.name,
                "kind": p.kind,
                "value": p.value,
                "unit": p.unit,
                "status": p.status,
                "reason": p.reason,
                "details_json": p.details,
            }
            for p in peaks
        ],
        replace=True,
    )


_KERNEL_NUMBERS = (
    "launches_per_step",
    "time_per_step_s",
    "flops_per_step",
    "ew_flops_per_step",
    "bytes_per_step",
)


def _kernel_rows(pid: int, source: str, df) -> list[dict[str, Any]]:
    if df is None or len(df) == 0:
        return []
    return [
        {
            "profile_id": pid,
            "source": source,
            "name": r["name"],
            "short_name": r.get("short_name", ""),
            "cluster": r["cluster"],
            **{k: r.get(k) for k in _KERNEL_NUMBERS},
            "ops": r.get("ops", "") or "",
            "metrics_json": r.get("metrics", {}) or {},
        }
        for r in df.to_dict("records")
    ]


def record_profile(store: Store, run_id: str, res: ProfileResult) -> int:
    """Store one profile, its torch and ncu kernel tables and the model's cost in one transaction.

    NaN numbers are stored as NULL (`deepgap.store.rows.typed`).
    """
    s = res.spec
    ncu = dict(res.ncu)
    row = {
        "run_id": run_id,
        "model": s.model,
        "mode": s.mode,
        "precision": s.precision,
        "batch_size": s.batch_size,
        "resolution": res.resolution or s.resolution,
        "device": s.device,
        "memory_format": s.memory_format,
        "status": res.status,
        "reason": res.reason,
        "step_time_median_s": res.step_time_median_s,
        "n_steps": len(res.step_times_s),
        "throughput_ips": res.throughput_ips,
        "flops_per_step": res.flops_per_step,
        "bytes_per_step": res.bytes_per_step,
        "min_bytes_per_step": res.min_bytes_per_step,
        "achieved_tflops": res.achieved_tflops,
        "profiled_steps": s.profiled_steps,
        "kernel_time_per_step_s": res.kernel_time_per_step_s,
        "attributed_flops_per_step": res.attributed_flops_per_step,
        "ncu_status": ncu.get("status"),
        "ncu_reason": ncu.get("reason"),
        "started_at": res.started_at,
        "duration_s": res.duration_s,
        "step_times_json": json.dumps(res.step_times_s),
        "cost_json": json.dumps(res.cost, default=str),
        "ncu_json": json.dumps(ncu, default=str),
        "extra_json": json.dumps(res.details.to_json(), default=str),
    }
    with store.transaction():
        (pid,) = store.insert(ROOFLINE_PROFILES, [row])
        kernels = _kernel_rows(pid, "torch", res.kernels) + _kernel_rows(pid, "ncu", res.ncu_kernels)
        store.insert(ROOFLINE_KERNELS, kernels, ids=False)
        if res.cost:
            c = res.cost
            store.insert(
                ROOFLINE_MODEL_COSTS,
                [
                    {
                        "model": c["model"],
                        "resolution": c["resolution"],
                        "mode": c["mode"],
                        "flops_per_image": c["flops_per_image"],
                        "params": c["params"],
                        "cost_json": json.dumps(c, default=str),
                    }
                ],
                replace=True,
            )
    return pid


def _with_runs(store: Store, df: pd.DataFrame) -> pd.DataFrame:
    runs = {r["run_id"]: r for r in store.runs()}
    df["device_name"] = [runs.get(r, {}).get("env", {}).get("device_name", "") for r in df["run_id"]]
    df["host"] = [runs.get(r, {}).get("host", "") for r in df["run_id"]]
    df["created_at"] = [runs.get(r, {}).get("created_at", float("nan")) for r in df["run_id"]]
    return df


def _where(column: str, values: list[Any] | None, **more: Any) -> dict[str, Any]:
    """A `Store.select` filter: ``column`` among ``values`` (all rows when none are given)."""
    return {**({column: list(values)} if values else {}), **{k: v for k, v in more.items() if v}}


def peaks_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Measured ceilings (run_id, name, kind, value, unit, status, reason, details) with device_name, host."""
    df = store.table_frame(ROOFLINE_PEAKS, _where("run_id", run_ids))
    df["details"] = [json.loads(x) for x in df.pop("details_json")]
    return _with_runs(store, df)


def profiles_frame(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """One row per profile (``roofline_profiles``, JSON decoded) plus device_name, host and created_at.

    The ``extra`` column holds typed `ProfileDetails` (its JSON is the stored ``extra_json``).
    """
    df = store.table_frame(ROOFLINE_PROFILES, _where("run_id", run_ids), ["profile_id"])
    for col in ("step_times", "cost", "ncu"):
        df[col] = [json.loads(x) for x in df.pop(f"{col}_json")]
    df["extra"] = [ProfileDetails.from_json(json.loads(x)) for x in df.pop("extra_json")]
    return _with_runs(store, df)


def kernels_frame(
    store: Store, profile_ids: list[int] | None = None, source: str | None = None
) -> pd.DataFrame:
    """Per-kernel rows (per step) of some profiles; ``source`` ``torch`` or ``ncu`` filters."""
    df = store.table_frame(ROOFLINE_KERNELS, _where("profile_id", profile_ids, source=source))
    df["metrics"] = [json.loads(x) for x in df.pop("metrics_json")]
    return df
