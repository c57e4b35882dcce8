"""Whether each run reached thermal steady state, and how many of its measurements still ran warming up.

The paper measures at thermal steady state. deepgap's GPU sweeps run a bounded thermal warm-up before the
first measured configuration (`drive/prelude`); when it stops at its time limit instead of at a
flat temperature, or when later, heavier configurations heat the GPU further, the rows keep their numbers
and carry the ``temp-rising`` warning. This table says so per run, so the report states it instead of
leaving it to a flag column.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.analysis.flags import telemetry_flags
from deepgap.core.stats import finite_or_none


def _warmup_text(s: dict[str, Any] | None) -> str:
    if not s:
        return "off (no thermal warm-up in this run)"
    dur, slope = finite_or_none(s.get("duration_s")), finite_or_none(s.get("slope_c_per_min"))
    temps = ""
    t0, t1 = finite_or_none(s.get("temp_start_c")), finite_or_none(s.get("temp_end_c"))
    if t0 is not None and t1 is not None:
        temps = f", {t0:.0f} → {t1:.0f} °C"
    if s.get("steady"):
        return f"steady after {dur or 0:.0f} s{temps}"
    if s.get("status") not in (None, "ok"):
        return f"{s.get('status')}: {s.get('reason') or 'no temperature readings'}"
    limit = finite_or_none(s.get("timeout_s"))
    return (
        f"NOT reached: stopped at the {limit or dur or 0:.0f} s limit, still "
        f"{slope if slope is not None else float('nan'):+.2f} °C/min{temps}"
    )


def thermal_state(
    runs: list[dict[str, Any]], telemetry: dict[str, pd.DataFrame], df: pd.DataFrame
) -> pd.DataFrame:
    """One row per run: its warm-up's outcome and its measurements taken while the temperature rose.

    ``telemetry`` maps run id → `Store.telemetry_frame(run_id)`; ``df`` is the prepared results frame.
    """
    rows = []
    for r in runs:
        t = telemetry.get(r["run_id"])
        summ = None
        if t is not None and len(t) and "phase" in t:
            s = t[t["phase"] == "thermal-summary"]
            if len(s):
                last = s.iloc[-1].to_dict()
                summ = {k: v for k, v in last.items() if not (isinstance(v, float) and pd.isna(v))}
        mine = df[df["run_id"] == r["run_id"]] if len(df) and "run_id" in df else df.iloc[0:0]
        ok = mine[mine["status"] == "ok"] if len(mine) else mine
        rising = sum("temp-rising" in telemetry_flags(e or {}) for e in ok.get("extra", ()))
        rows.append(
            {
                "run_id": r["run_id"],
                "platform": r.get("env", {}).get("device_name", ""),
                "warm_up": _warmup_text(summ),
                "steady": bool(summ and summ.get("steady")),
                "measurements": len(ok),
                "temp_rising": int(rising),
            }
        )
    cols = ["run_id", "platform", "warm_up", "steady", "measurements", "temp_rising"]
    return pd.DataFrame(rows, columns=cols)
