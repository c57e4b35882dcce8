"""Speedup of A over B with a bootstrap CI of the ratio, and the configuration behind every ratio.

The paper's "L4 is up to 4.4× T4" names no configuration; here every ratio is a row that states
both sides' model, engine, precision, batch, memory format, threads and resolution. Two levels:

- *matched*: the same configuration on both sides (same batch, threads …);
- *best batch*: per model, engine, precision, memory format and resolution, each side at its own
  highest-throughput batch (and thread count) — the "peak vs peak" comparison of the paper's Table I.

Throughput is batch / median latency, so the ratio A/B = (batch_A / batch_B) · median(lat_B) /
median(lat_A); its 95% CI is `deepgap.stats.ratio_ci` over the pooled raw per-iteration latencies of
each side's (unflagged) measurements. The paper publishes no samples: a ratio against it carries our
side's CI only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis.frame import accuracy_label, config_label
from deepgap.analysis.tables import best_rows
from deepgap.stats import N_RESAMPLES, ratio_ci

# result ids → pooled per-iteration latencies in seconds (empty when none are stored)
SamplesFn = Callable[[list[int]], np.ndarray]

MATCH_KEYS = [
    "model",
    "engine",
    "precision",
    "batch_size",
    "memory_format",
    "threads",
    "resolution",
    "include_transfer",
]
BEST_KEYS = ["model", "engine", "precision", "memory_format", "resolution", "include_transfer"]
_SIDE = [
    "platform",
    "device",
    "batch_size",
    "threads",
    "throughput_ips",
    "throughput_ci_low_ips",
    "throughput_ci_high_ips",
    "n_measurements",
    "flags",
    "warnings",
    "flagged",
    "run_ids",
    "result_ids",
    "rel_l2",
    "cosine",
    "top1_agreement",
]


# Above this many pooled samples a side's CI is bootstrapped on an evenly spaced subsample (in time order):
# the interval gets slightly wider (conservative) and a comparison of hundreds of configurations stays fast.
MAX_BOOTSTRAP_SAMPLES = 4000


def _thin(x: np.ndarray) -> np.ndarray:
    if x.size <= MAX_BOOTSTRAP_SAMPLES:
        return x
    return x[np.linspace(0, x.size - 1, MAX_BOOTSTRAP_SAMPLES).round().astype(int)]


def throughput_ratio(
    a: dict[str, Any],
    b: dict[str, Any],
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, float, float, str]:
    """Throughput ratio A/B of two aggregated configurations: (point, CI low, CI high, method)."""
    la = samples_a(list(a.get("result_ids") or []))
    lb = samples_b(list(b.get("result_ids") or []))
    k = float(a["batch_size"]) / float(b["batch_size"])
    if la.size and lb.size:
        point = float(np.median(lb) / np.median(la))
        _, lo, hi = ratio_ci(_thin(lb), _thin(la), n_resamples=n_resamples)
        thinned = (
            f", CI on {MAX_BOOTSTRAP_SAMPLES} evenly spaced"
            if max(la.size, lb.size) > MAX_BOOTSTRAP_SAMPLES
            else ""
        )
        return k * point, k * lo, k * hi, f"bootstrap of pooled latencies (n={la.size} vs {lb.size}{thinned})"
    point = float(a["throughput_ips"]) / float(b["throughput_ips"])
    return point, float("nan"), float("nan"), "unavailable: no raw samples stored"


def _pair_row(
    a: dict[str, Any],
    b: dict[str, Any],
    keys: list[str],
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int,
) -> dict[str, Any]:
    point, lo, hi, method = throughput_ratio(a, b, samples_a, samples_b, n_resamples)
    row: dict[str, Any] = {k: a[k] for k in keys}
    for side, r in (("a", a), ("b", b)):
        for c in _SIDE:
            if c not in keys:
                row[f"{c}_{side}"] = r.get(c)
        row[f"configuration_{side}"] = config_label(r)
        row[f"accuracy_{side}"] = accuracy_label(r)
    row.update(
        speedup=point,
        speedup_ci_low=lo,
        speedup_ci_high=hi,
        ci_method=method,
        flagged=bool(a["flagged"] or b["flagged"]),
        flags=[f"A:{f}" for f in a["flags"]] + [f"B:{f}" for f in b["flags"]],
        warnings=[f"A:{w}" for w in a["warnings"]] + [f"B:{w}" for w in b["warnings"]],
    )
    return row


def _pairs(
    left: pd.DataFrame,
    right: pd.DataFrame,
    keys: list[str],
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int,
) -> pd.DataFrame:
    if left.empty or right.empty:
        return pd.DataFrame(
            columns=[*keys, "platform_a", "platform_b", "speedup", "speedup_ci_low", "speedup_ci_high"]
        )
    idx: dict[tuple, list[dict[str, Any]]] = {}
    for b in right.to_dict("records"):
        idx.setdefault(tuple(b[k] for k in keys), []).append(b)
    out = [
        _pair_row(a, b, keys, samples_a, samples_b, n_resamples)
        for a in left.to_dict("records")
        for b in idx.get(tuple(a[k] for k in keys), [])
    ]
    if not out:
        return pd.DataFrame(
            columns=[*keys, "platform_a", "platform_b", "speedup", "speedup_ci_low", "speedup_ci_high"]
        )
    return pd.DataFrame(out).sort_values(keys).reset_index(drop=True)


def compare(
    agg_a: pd.DataFrame,
    agg_b: pd.DataFrame,
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int = N_RESAMPLES,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Speedups of A over B: (matched configurations, each side at its best batch).

    Args:
        agg_a: aggregated configurations of side A (`deepgap.analysis.frame.aggregate`).
        agg_b: the same for side B.
        samples_a: pooled raw latencies of A's result ids.
        samples_b: the same for B.
        n_resamples: bootstrap resamples per ratio.
    """
    matched = _pairs(agg_a, agg_b, MATCH_KEYS, samples_a, samples_b, n_resamples)
    best_a = best_rows(agg_a, ["platform", *BEST_KEYS]) if not agg_a.empty else agg_a
    best_b = best_rows(agg_b, ["platform", *BEST_KEYS]) if not agg_b.empty else agg_b
    best = _pairs(best_a, best_b, BEST_KEYS, samples_a, samples_b, n_resamples)
    return matched, best


def compare_paper(agg: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The user's peak per platform, model and precision beside the paper's rows for them.

    The ratio's CI is the user's throughput CI divided by the paper's number (the paper gives no samples).
    """
    cols = [
        "platform",
        "model",
        "precision",
        "configuration",
        "accuracy",
        "throughput_ips",
        "throughput_ci_low_ips",
        "throughput_ci_high_ips",
        "paper_platform",
        "paper_engine",
        "paper_batch",
        "paper_images_per_s",
        "ratio_vs_paper",
        "ratio_ci_low",
        "ratio_ci_high",
        "flagged",
        "flags",
        "warnings",
    ]
    if agg.empty:
        return pd.DataFrame(columns=cols)
    peaks = best_rows(agg, ["platform", "model", "precision"])
    out = []
    for r in peaks.to_dict("records"):
        ref = paper[(paper["model"] == r["model"]) & (paper["precision"] == r["precision"])]
        for p in ref.to_dict("records"):
            tp = float(p["peak_images_per_s"])
            out.append(
                {
                    "platform": r["platform"],
                    "model": r["model"],
                    "precision": r["precision"],
                    "configuration": config_label(r),
                    "accuracy": accuracy_label(r),
                    "throughput_ips": r["throughput_ips"],
                    "throughput_ci_low_ips": r["throughput_ci_low_ips"],
                    "throughput_ci_high_ips": r["throughput_ci_high_ips"],
                    "paper_platform": p["platform"],
                    "paper_engine": p["engine"],
                    "paper_batch": int(p["peak_batch"]),
                    "paper_images_per_s": tp,
                    "ratio_vs_paper": r["throughput_ips"] / tp,
                    "ratio_ci_low": r["throughput_ci_low_ips"] / tp,
                    "ratio_ci_high": r["throughput_ci_high_ips"] / tp,
                    "flagged": bool(r["flagged"]),
                    "flags": r["flags"],
                    "warnings": r["warnings"],
                }
            )
    return pd.DataFrame(out, columns=cols)
