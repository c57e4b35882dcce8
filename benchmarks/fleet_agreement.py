"""Do lanes measure what one GPU measures? Per configuration: median latency, lanes store vs one-GPU store.

Issue 34's bar: median latency within 3% for at least 90% of the configurations, none beyond 10%; power,
energy and temperature read from each lane's own GPU (each lane's rows name a different GPU UUID).

    python benchmarks/fleet_agreement.py ONE_GPU.sqlite LANES.sqlite [--label 2-lanes] [--out DIR]

A configuration is a stored key without its sweep pass and device (the median over its OK, unflagged
measurements). Writes DIR/agreement-LABEL.md (the table and the verdict) and .json; exit 0 when the bar is
met, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pandas as pd

from deepgap.analysis.cards import KEYS
from deepgap.analysis.frame import prepare
from deepgap.store import Store

WITHIN, SHARE, NONE_BEYOND = 0.03, 0.90, 0.10


def medians(path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per configuration: median latency and what measured it; the prepared OK rows)."""
    s = Store(path, readonly=True)
    try:
        df = prepare(s.results_frame())
    finally:
        s.close()
    ok = df[(df["status"] == "ok") & ~df["flagged"]].copy()
    ok["lane"] = [getattr(e, "lane", None) or d for e, d in zip(ok["extra"], ok["device"], strict=True)]
    # the GPU that NVML read power, energy and temperature from
    tel = [(e.telemetry.get("settings") or {}) if e.telemetry is not None else {} for e in ok["extra"]]
    ok["telemetry_uuid"] = [t.get("uuid") for t in tel]
    agg = ok.groupby(KEYS, dropna=False).agg(
        latency_median_s=("latency_median_s", "median"),
        n=("latency_median_s", "size"),
        lanes=("lane", lambda v: ",".join(sorted(set(map(str, v))))),
        cards=("card", lambda v: len(set(v) - {""})),
        power_w=("mean_power_w", "median"),
        max_temp_c=("max_temp_c", "max"),
    )
    return agg.reset_index(), ok


def agreement(one: pd.DataFrame, lanes: pd.DataFrame) -> pd.DataFrame:
    """Both sides per configuration, with lanes / one − 1 of the median latency."""
    both = one.merge(lanes, on=KEYS, suffixes=("_one", "_lanes"))
    both["rel_diff"] = both["latency_median_s_lanes"] / both["latency_median_s_one"] - 1
    return both.sort_values("rel_diff", key=np.abs, ascending=False).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("one")
    p.add_argument("lanes")
    p.add_argument("--label", default="lanes")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args(argv)
    for path in (a.one, a.lanes):
        if not os.path.exists(path):
            print(
                f"fleet_agreement: {path} does not exist; run the sweeps first (benchmarks/fleet_gpus.sh)",
                file=sys.stderr,
            )
            return 2
    one, _ = medians(a.one)
    lanes, rows = medians(a.lanes)
    both = agreement(one, lanes)
    if both.empty:
        print(
            "fleet_agreement: no configuration is in both stores; use the same sweep flags", file=sys.stderr
        )
        return 2
    within = float((both["rel_diff"].abs() <= WITHIN).mean())
    worst = float(both["rel_diff"].abs().max())
    ok = within >= SHARE and worst <= NONE_BEYOND
    per_lane_cards = rows.groupby("lane")["card"].agg(lambda v: sorted(set(v) - {""}))
    distinct = len({c for cs in per_lane_cards for c in cs}) == len(per_lane_cards) and all(
        len(cs) == 1 for cs in per_lane_cards
    )
    read = rows[rows["telemetry_uuid"].notna() & (rows["card"] != "")]
    own = float((read["telemetry_uuid"] == read["card"]).mean()) if len(read) else float("nan")
    lines = [
        f"# {a.label} vs one GPU: median latency per configuration",
        "",
        f"{len(both)} configurations; within {100 * WITHIN:.0f}%: {100 * within:.1f}% "
        f"(bar ≥ {100 * SHARE:.0f}%); "
        f"worst {100 * worst:.1f}% (bar ≤ {100 * NONE_BEYOND:.0f}%): **{'met' if ok else 'NOT met'}**",
        "",
        f"each lane on its own GPU (one card per lane, all different): {distinct} — "
        + "; ".join(f"{lane}: {', '.join(cs) or 'no UUID'}" for lane, cs in per_lane_cards.items()),
        "",
        f"power, energy and temperature read from the lane's own GPU: {100 * own:.0f}% of {len(read)} rows "
        "with both UUIDs (NVML's and the fingerprint's)",
        "",
        "| configuration | one GPU ms | lanes ms | lanes/one − 1 | lane(s) | W one | W lanes |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in both.to_dict("records"):
        cfg = f"{r['model']} {r['engine']} {r['precision']} {r['memory_format']} bs{int(r['batch_size'])}"
        lines.append(
            f"| {cfg} | {1e3 * r['latency_median_s_one']:.4g} | {1e3 * r['latency_median_s_lanes']:.4g} | "
            f"{100 * r['rel_diff']:+.1f}% | {r['lanes_lanes']} | {r['power_w_one']:.0f} | "
            f"{r['power_w_lanes']:.0f} |"
        )
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"agreement-{a.label}.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, f"agreement-{a.label}.json"), "w") as fh:
        json.dump(
            {
                "configurations": len(both),
                "share_within_3pct": within,
                "worst_rel_diff": worst,
                "met": ok,
                "lanes_on_distinct_gpus": distinct,
                "telemetry_on_own_gpu": own,
                "rows": json.loads(both.to_json(orient="records")),
            },
            fh,
            indent=1,
        )
    print("\n".join(lines[:7]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
