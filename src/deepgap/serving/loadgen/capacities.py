"""deepgap's server capacity beside LoadGen's, per serve run: both verdicts, both p99s, the harness floor.

Why a table of its own: a capacity is only trusted when the driver users know (MLPerf's LoadGen) calls
it VALID. For every serve run with LoadGen levels it reads, from the stored rows only: deepgap's
capacity (the measured search's best, or the fixed rate) with its p99 and verdict; LoadGen's Server
verdict and p99 at that rate; LoadGen's capacity (the highest rate it called VALID stepping down from
deepgap's) and the ratio; the null-SUT floor (LoadGen's p99 when nothing is served); and LoadGen's
per-sample latency minus deepgap's for the same queries (its trace).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.serving.records.details import CapacityDetails, LevelDetails

if TYPE_CHECKING:
    import pandas as pd

P99_KEY = "99.00 percentile latency (ns)"


def loadgen_p99_s(d: LevelDetails) -> float | None:
    """LoadGen's own p99 of a ``loadgen`` level (seconds), from its parsed summary."""
    try:
        return float((d.loadgen or {})[P99_KEY]) * 1e-9
    except (KeyError, TypeError, ValueError):
        return None


def _deepgap_side(run: str, lv: pd.DataFrame, cap: pd.DataFrame) -> tuple[float | None, float | None, str]:
    """(rate, p99 s, verdict) of deepgap's own driver: its measured capacity, else its fixed server level."""
    m = cap[(cap["run_id"] == run) & (cap["source"] == "measured")] if len(cap) else cap
    if len(m) and float(m["capacity_qps"].max()) > 0:
        best = m.loc[m["capacity_qps"].astype(float).idxmax()]
        rate = float(best["capacity_qps"])
        probes = [
            p
            for p in (CapacityDetails.of(best.get("extra")).probes or [])
            if p.rate_qps == rate and p.verdict == "pass"
        ]
        return rate, probes[-1].p99_s if probes else None, "pass"
    own = lv[
        (lv["run_id"] == run)
        & (lv["scenario"] == "server")
        & (lv["status"] == "ok")
        & ~lv["purpose"].isin(["loadgen", "loadgen-null"])
    ]
    if not len(own):
        return None, None, ""
    r = own.iloc[-1]
    return float(r["target_qps"]), float(r["latency_p99_s"]), str(r["verdict"])


def loadgen_capacities(lv: pd.DataFrame, cap: pd.DataFrame) -> pd.DataFrame:
    """One row per server run with LoadGen levels (empty when there are none)."""
    import pandas as pd

    if lv.empty or "extra" not in lv:
        return pd.DataFrame()
    lgv = lv[(lv["purpose"] == "loadgen") & (lv["scenario"] == "server") & (lv["status"] == "ok")]
    rows: list[dict[str, Any]] = []
    for run, g in lgv.groupby("run_id", sort=False):
        g = g.sort_values("target_qps", ascending=False)
        det = [LevelDetails.of(e) for e in g["extra"]]
        results = [(d.loadgen or {}).get("Result is", "") for d in det]
        valid = [k for k, r in enumerate(results) if r == "VALID"]
        first, at = det[0], (det[valid[0]] if valid else None)
        null = lv[(lv["run_id"] == run) & (lv["purpose"] == "loadgen-null")]
        floor = loadgen_p99_s(LevelDetails.of(null["extra"].iloc[0])) if len(null) else None
        rate, p99, verdict = _deepgap_side(run, lv, cap)
        lg_cap = float(g["target_qps"].iloc[valid[0]]) if valid else None
        run_info = first.loadgen_run
        r0 = g.iloc[0]
        rows.append(
            {
                "run_id": run,
                "platform": r0["platform"],
                "model": r0["model"],
                "engine": r0["engine"],
                "precision": r0["precision"],
                "memory_format": r0["memory_format"],
                "slo_s": r0["slo_s"],
                "policy": r0["policy"],
                "deepgap_qps": rate,
                "deepgap_p99_s": p99,
                "deepgap_verdict": verdict,
                "loadgen_rate_qps": float(r0["target_qps"]),
                "loadgen_result": results[0],
                "loadgen_p99_s": loadgen_p99_s(first),
                "loadgen_capacity_qps": lg_cap,
                "loadgen_capacity_p99_s": loadgen_p99_s(at) if at else None,
                "loadgen_over_deepgap": lg_cap / rate if lg_cap and rate else None,
                "lowest_tried_qps": float(g["target_qps"].iloc[-1]),
                "floor_p99_s": floor,
                "per_sample_diff_p99_s": run_info.diff_p99_s if run_info else None,
                "issue_delay_p99_s": run_info.issue_delay_p99_s if run_info else None,
                "min_duration_s": run_info.min_duration_s if run_info else None,
                "min_queries": run_info.min_queries if run_info else None,
                "early_stopping": (run_info.early_stopping or "") if run_info else "",
            }
        )
    return pd.DataFrame(rows)
