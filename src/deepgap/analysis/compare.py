"""Speedup of A over B with a bootstrap CI of the ratio, and the configuration behind every ratio.

The paper's "L4 is up to 4.4× T4" names no configuration; here every ratio is a row that states
both sides' model, engine, precision, batch, memory format, threads and resolution. Two levels:

- *matched*: the same configuration on both sides (same batch, threads …);
- *best batch*: per model, engine, precision, memory format and resolution, each side at its own
  highest-throughput batch (and thread count) — the "peak vs peak" comparison of the paper's Table I.
  Where the two peaks sit at different batches or threads the row's ``pairing`` says "best vs best" and
  names both configurations: such a ratio (a bs256 over a bs1) is not a like-with-like speedup.

Throughput is batch / median latency, so the ratio A/B = (batch_A / batch_B) · median(lat_B) /
median(lat_A); its 95% CI is `deepgap.core.stats.ratio_ci` over the pooled raw per-iteration latencies of
each side's (unflagged) measurements. The paper publishes no samples: a ratio against it carries our
side's CI only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis import cards
from deepgap.analysis.cards import widen_interval
from deepgap.analysis.frame import accuracy_label, config_label, is_default_input
from deepgap.analysis.tables import best_rows
from deepgap.core.stats import N_RESAMPLES, ratio_ci

# result ids → pooled per-iteration latencies in seconds (empty when none are stored)
SamplesFn = Callable[[list[int]], np.ndarray]

MATCH_KEYS = cards.KEYS  # a configuration on both sides: every axis but the platform (the cards' key too)
BEST_KEYS = ["model", "engine", "precision", "memory_format", "resolution", "include_transfer", "input_mode"]
_SIDE = [
    "platform",
    "device",
    "batch_size",
    "threads",
    "throughput_ips",
    "throughput_ci_low_ips",
    "throughput_ci_high_ips",
    "joules_per_image",
    "mean_power_w",
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
        method = f"bootstrap of pooled latencies (n={la.size} vs {lb.size}{thinned})"
        sds = [float(r.get("card_spread_rel") or float("nan")) for r in (a, b)]
        by_card = [list(r.get("card_result_ids") or []) for r in (a, b)]
        if max(len(c) for c in by_card) >= 2:  # measured on two or more cards: cards, processes, samples
            lo, hi = cards.ratio_ci(
                *[
                    c if len(c) >= 2 else [list(r.get("result_ids") or [])]
                    for c, r in zip(by_card, (a, b), strict=True)
                ],
                samples_a,
                samples_b,
                n_resamples,
            )
            method = "three-level bootstrap (cards, processes, samples): " + " vs ".join(
                f"{len(c) or 1} card(s)" for c in by_card
            )
            sds = [sd if len(c) < 2 else float("nan") for sd, c in zip(sds, by_card, strict=True)]
        if any(sd == sd for sd in sds):  # a store with two or more cards of a side's type (analysis.cards)
            lo, hi = widen_interval(point, lo, hi, sds)
            method += "; widened by the card-to-card spread " + " and ".join(
                f"±{100 * sd:.1f}% ({side})" for side, sd in zip("AB", sds, strict=True) if sd == sd
            )
        return k * point, k * lo, k * hi, method
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
        pairing=pairing(a, b),
        speedup=point,
        speedup_ci_low=lo,
        speedup_ci_high=hi,
        ci_method=method,
        flagged=bool(a["flagged"] or b["flagged"]),
        flags=[f"A:{f}" for f in a["flags"]] + [f"B:{f}" for f in b["flags"]],
        warnings=[f"A:{w}" for w in a["warnings"]] + [f"B:{w}" for w in b["warnings"]],
    )
    return row


def pairing(a: dict[str, Any], b: dict[str, Any]) -> str:
    """'like with like' where both sides share every configuration field, else 'best vs best: A … / B …'."""
    if all(a.get(k) == b.get(k) for k in MATCH_KEYS):
        return f"like with like (bs{int(a['batch_size'])} both)"
    return (
        f"best vs best: A {config_label(a, with_platform=False)} / B {config_label(b, with_platform=False)}"
    )


def _pairs(
    left: pd.DataFrame,
    right: pd.DataFrame,
    keys: list[str],
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int,
    like_kinds: bool = False,
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
        if not like_kinds or str(a.get("device")) == str(b.get("device"))
    ]
    if not out:
        return pd.DataFrame(
            columns=[*keys, "platform_a", "platform_b", "speedup", "speedup_ci_low", "speedup_ci_high"]
        )
    return pd.DataFrame(out).sort_values(keys).reset_index(drop=True)


def _with_input_mode(agg: pd.DataFrame) -> pd.DataFrame:
    """``agg`` with an ``input_mode`` column ("" = the default input) where a hand-built frame has none."""
    if agg.empty or "input_mode" in agg:
        return agg
    return agg.assign(input_mode="")


def compare(
    agg_a: pd.DataFrame,
    agg_b: pd.DataFrame,
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    n_resamples: int = N_RESAMPLES,
    like_kinds: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Speedups of A over B: (matched configurations, each side at its best batch).

    ``like_kinds``: pair only configurations of the same device kind (GPU with GPU, CPU with CPU). Two
    stores of a GPU run each hold a GPU and its host CPU; without it A's GPU was also set against B's CPU
    (an H200 store against an H100 store read 70.2×, the H200 over the H100 host's CPU).

    Args:
        agg_a: aggregated configurations of side A (`deepgap.analysis.frame.aggregate`).
        agg_b: the same for side B.
        samples_a: pooled raw latencies of A's result ids.
        samples_b: the same for B.
        n_resamples: bootstrap resamples per ratio.
        like_kinds: pair only configurations of one device kind (see above).
    """
    agg_a, agg_b = _with_input_mode(agg_a), _with_input_mode(agg_b)
    matched = _pairs(agg_a, agg_b, MATCH_KEYS, samples_a, samples_b, n_resamples, like_kinds)
    best_a = best_rows(agg_a, ["platform", *BEST_KEYS]) if not agg_a.empty else agg_a
    best_b = best_rows(agg_b, ["platform", *BEST_KEYS]) if not agg_b.empty else agg_b
    best = _pairs(best_a, best_b, BEST_KEYS, samples_a, samples_b, n_resamples, like_kinds)
    return matched, best


def code_id(run: dict[str, Any]) -> str:
    """The code that measured a run: its source hash and commit where stored, else 'not recorded'."""
    env = run.get("env") or {}
    sha, commit = env.get("deepgap_source_sha"), env.get("deepgap_commit")
    commit = None if commit == "none" else commit  # not a git checkout of deepgap: the hash stands
    if sha or commit:
        return f"source {sha or '?'}" + (f" (git {commit})" if commit else "")
    return f"not recorded (deepgap {run.get('deepgap_version') or env.get('deepgap') or '?'})"


def provenance(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> list[str]:
    """Warnings when A and B were measured by different code or in different sessions (runs).

    A ratio's bootstrap interval resamples the calls within each side: it covers their sampling noise,
    not a change of code between the sides nor the session-to-session spread (clocks, placement, a
    compiler's choices). Where either differs the interval covers neither, and the warning says so.
    """
    if not runs_a or not runs_b:
        return []
    out = []
    ca, cb = sorted({code_id(r) for r in runs_a}), sorted({code_id(r) for r in runs_b})
    unknown = any(c.startswith("not recorded") for c in ca + cb)
    if ca != cb or unknown or len(ca) > 1:
        what = (
            "A and B may have been measured by different code (not recorded for every run)"
            if unknown and ca == cb
            else "A and B were measured by different code"
        )
        out.append(f"{what}: A {'; '.join(ca)}; B {'; '.join(cb)}")
    ra, rb = {str(r["run_id"]) for r in runs_a}, {str(r["run_id"]) for r in runs_b}
    if ra != rb:
        out.append(
            f"A and B were measured in different sessions: A runs {', '.join(sorted(ra))}; "
            f"B runs {', '.join(sorted(rb))}"
        )
    if out:
        out.append(
            "the 95% intervals cover the sampling noise within each side only: they cover neither "
            "a change of code nor the spread between sessions"
        )
    return out


# Paper platforms whose "FP32" ran as TF32: PyTorch's default (torch.backends.cudnn.allow_tf32 = True) runs
# convolutions on TF32 tensor cores on compute capability >= 8.0, and the paper used PyTorch's defaults.
TF32_FROM_CC = (8, 0)


def _compute_capability(platform: str) -> tuple[int, int] | None:
    from deepgap.roofline.specs import spec_by_gpu

    row = spec_by_gpu(platform)
    cc = str((row or {}).get("compute_capability") or "")
    try:
        major, minor = cc.split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def paper_precision(paper_platform: str, paper_prec: str, measured: set[str]) -> tuple[str, str]:
    """The deepgap precision set against one paper column, and why.

    The paper's "FP32" on an Ampere-or-newer GPU (its L4) most likely ran TF32 (PyTorch's default for
    convolutions there), while deepgap's ``fp32`` is strict: that column is compared with deepgap's ``tf32``
    where it was measured, else with ``fp32`` and the label says the ratio is then not like-for-like. On the
    T4 (Turing, no TF32) and on CPUs the paper's FP32 was strict, as deepgap's ``fp32``. Other columns map
    to the same precision (the paper's int8 ran TensorRT: its engine column says so).
    """
    if paper_prec != "fp32":
        return paper_prec, f"same precision ({paper_prec})"
    cc = _compute_capability(paper_platform)
    if cc is None or cc < TF32_FROM_CC:
        why = "a CPU" if cc is None else f"compute capability {cc[0]}.{cc[1]}, no TF32"
        return "fp32", f"paper FP32 on {paper_platform} ({why}) was strict FP32, as deepgap fp32"
    if "tf32" in measured:
        return "tf32", (
            f"paper FP32 on {paper_platform} (cc {cc[0]}.{cc[1]}) most likely ran TF32, PyTorch's default "
            "for convolutions on Ampere+; deepgap tf32 is that mode (deepgap fp32 is strict)"
        )
    return "fp32", (
        f"paper FP32 on {paper_platform} most likely ran TF32; deepgap tf32 not measured here, so this is "
        "strict fp32 against it (not like-for-like: understates your side)"
    )


def compare_paper(agg: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The user's peak per platform and model beside the paper's rows, precision mapped by `paper_precision`.

    ``precision`` is deepgap's precision, ``paper_precision`` the paper's column and ``precision_mapping``
    why they are set together. The ratio's CI is the user's throughput CI divided by the paper's number
    (the paper gives no samples).
    """
    cols = [
        "platform",
        "model",
        "precision",
        "paper_precision",
        "precision_mapping",
        "configuration",
        "accuracy",
        "throughput_ips",
        "throughput_ci_low_ips",
        "throughput_ci_high_ips",
        "paper_platform",
        "paper_engine",
        "paper_batch",
        "paper_images_per_s",
        "pairing",
        "ratio_vs_paper",
        "ratio_ci_low",
        "ratio_ci_high",
        "flagged",
        "flags",
        "warnings",
    ]
    if agg.empty:
        return pd.DataFrame(columns=cols)
    # the paper timed its images as every default row does: a resident-input row is no peak to set against it
    peaks = best_rows(agg[is_default_input(agg)], ["platform", "model", "precision"])
    out = []
    for (platform, model), mine in peaks.groupby(["platform", "model"], sort=True):
        by_prec = {str(r["precision"]): r for r in mine.to_dict("records")}
        for p in paper[paper["model"] == model].to_dict("records"):
            prec, why = paper_precision(str(p["platform"]), str(p["precision"]), set(by_prec))
            r = by_prec.get(prec)
            if r is None:
                continue
            tp = float(p["peak_images_per_s"])
            out.append(
                {
                    "platform": platform,
                    "model": model,
                    "precision": prec,
                    "paper_precision": p["precision"],
                    "precision_mapping": why,
                    "configuration": config_label(r),
                    "accuracy": accuracy_label(r),
                    "throughput_ips": r["throughput_ips"],
                    "throughput_ci_low_ips": r["throughput_ci_low_ips"],
                    "throughput_ci_high_ips": r["throughput_ci_high_ips"],
                    "paper_platform": p["platform"],
                    "paper_engine": p["engine"],
                    "paper_batch": int(p["peak_batch"]),
                    "paper_images_per_s": tp,
                    "pairing": paper_pairing(str(r["device"]), str(p["platform"])),
                    "ratio_vs_paper": r["throughput_ips"] / tp,
                    "ratio_ci_low": r["throughput_ci_low_ips"] / tp,
                    "ratio_ci_high": r["throughput_ci_high_ips"] / tp,
                    "flagged": bool(r["flagged"]),
                    "flags": r["flags"],
                    "warnings": r["warnings"],
                }
            )
    df = pd.DataFrame(out, columns=cols)
    return df.sort_values(["platform", "model", "paper_precision", "paper_platform"]).reset_index(drop=True)


def paper_pairing(device: str, paper_platform: str) -> str:
    """What a row of ``compare --paper`` sets against what: "GPU vs GPU", "CPU vs CPU", or unlike kinds."""
    mine = "CPU" if device == "cpu" else "GPU"
    theirs = "CPU" if "xeon" in paper_platform.lower() or "cpu" in paper_platform.lower() else "GPU"
    if mine == theirs:
        return f"{mine} vs {theirs}"
    return f"{mine} vs {theirs} (unlike kinds: your {mine} against the paper's {theirs})"


def precision_mappings(table: pd.DataFrame) -> pd.DataFrame:
    """Per platform and model, each paper column (platform, precision) → deepgap precision, and why."""
    cols = ["platform", "model", "paper_platform", "paper_precision", "precision", "precision_mapping"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    return table[cols].drop_duplicates().sort_values(cols[:5]).reset_index(drop=True)
