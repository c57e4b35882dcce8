"""The efficiency tables: the Pareto front of throughput against latency, energy per image, thread scaling.

Why apart from `deepgap.analysis.tables` (Table I, speedups, the host-CPU pairing): these read power and
threads, not peaks; `tables` re-exports them, so the report and the tests ask one module for every table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis.frame import CONFIG_VIEW_COLS


def pareto(agg: pd.DataFrame) -> pd.DataFrame:
    """Every configuration, with ``on_frontier`` where no configuration beats it on latency and throughput.

    On the frontier: no unflagged configuration of the same platform, model, sequence length (text
    models) and input mode has both lower-or-equal median latency and higher-or-equal throughput (one
    strictly). Flagged configurations never are. A resident input (int8 images already in GPU memory)
    has a frontier of its own: it never pushes a default-input configuration off the default frontier.
    """
    if agg.empty:
        return pd.DataFrame(
            columns=["platform", "model", "latency_median_s", "throughput_ips", "on_frontier"]
        )
    out = agg.copy()
    out["on_frontier"] = False
    # a text model's sequence lengths are separate workloads: a frontier each (seq_len 0 for images)
    for _, grp in out.groupby(["platform", "model", *_have(out, "seq_len", "input_mode")], sort=False):
        pts = grp[~grp["flagged"] & grp["latency_median_s"].notna() & grp["throughput_ips"].notna()]
        lat = pts["latency_median_s"].to_numpy()
        tp = pts["throughput_ips"].to_numpy()
        for i, ix in enumerate(pts.index):
            dominated = np.any((lat <= lat[i]) & (tp >= tp[i]) & ((lat < lat[i]) | (tp > tp[i])))
            out.loc[ix, "on_frontier"] = not dominated
    return out.sort_values(["platform", "model", "latency_median_s"]).reset_index(drop=True)


def _have(agg: pd.DataFrame, *cols: str) -> list[str]:
    """Those of ``cols`` (a text model's ``seq_len``, ``joules_per_token``, ``input_mode``) that ``agg`` has.

    Why carried: a table's units follow its rows' sequence lengths (`deepgap.render.units.of_frame`), and
    a text model's rows at two lengths are two configurations.
    """
    return [c for c in cols if c in agg]


def energy(agg: pd.DataFrame) -> pd.DataFrame:
    """Configurations with energy telemetry: mean power, images per watt (= per joule), joules per image."""
    cols = ["mean_power_w", "ips_per_watt", "joules_per_image", "energy_j", "max_temp_c"]
    if agg.empty or not any(c in agg for c in cols):
        return pd.DataFrame(columns=["platform", "model", "precision", "batch_size", *cols])
    have = agg[[c for c in cols if c in agg]].notna().any(axis=1)
    keep = [
        *CONFIG_VIEW_COLS,
        *(["input_mode"] if "input_mode" in agg else []),
        *_have(agg, "seq_len"),  # a text model's rows: per sequence length (render.units)
        "batch_size",
        "throughput_ips",
        *[c for c in cols if c in agg],
        *_have(agg, "joules_per_token"),
        "flagged",
        "flags",
        "warnings",
    ]
    return agg.loc[have, keep].reset_index(drop=True)


def thread_scaling(agg: pd.DataFrame) -> pd.DataFrame:
    """CPU throughput by thread count, with speedup and parallel efficiency over the fewest threads."""
    cpu = agg[(agg["device"] == "cpu") & (agg["threads"] > 0)] if not agg.empty else agg
    if cpu.empty:
        return pd.DataFrame(
            columns=["platform", "model", "threads", "throughput_ips", "speedup_vs_min_threads"]
        )
    out: list[dict[str, Any]] = []
    keys = ["platform", "model", "engine", "precision", "memory_format", "resolution", "batch_size"]
    for _, grp in cpu.groupby(keys, sort=True):
        if grp["threads"].nunique() < 2:
            continue
        grp = grp.sort_values("threads")
        base = grp.iloc[0]
        for r in grp.to_dict("records"):
            sp = r["throughput_ips"] / base["throughput_ips"]
            out.append(
                {
                    **{k: r[k] for k in keys},
                    **{k: r[k] for k in _have(agg, "seq_len")},
                    "threads": r["threads"],
                    "throughput_ips": r["throughput_ips"],
                    "min_threads": int(base["threads"]),
                    "speedup_vs_min_threads": sp,
                    "parallel_efficiency": sp * base["threads"] / r["threads"],
                    "flagged": bool(r["flagged"]),
                    "flags": r["flags"],
                    "warnings": r["warnings"],
                }
            )
    if not out:
        return pd.DataFrame(
            columns=["platform", "model", "threads", "throughput_ips", "speedup_vs_min_threads"]
        )
    return pd.DataFrame(out)
