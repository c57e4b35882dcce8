"""The study's tables as pure functions of the aggregated frame (`deepgap.analysis.frame.aggregate`).

Table I (peak throughput per platform, model and precision), speedup over FP32 at each batch
(fig. 11), speedup over the CPU, like with like (docs/cpu-baseline.md), the latency–throughput Pareto
frontier (fig. 10), energy (perf-per-watt, joules per image) and CPU thread scaling. Every row carries the
configuration it comes from, so no number stands without its batch, engine, threads and run count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis.efficiency import energy, pareto, thread_scaling  # noqa: F401 - tables answers for every table
from deepgap.analysis.frame import ACCURACY_WORST, CONFIG_VIEW_COLS, accuracy_label, config_label
from deepgap.core.precision import PRECISIONS

_EMPTY_T1 = ["platform", "model", "precision", "engine", "batch_size", "throughput_ips"]


def _clean_first(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted so unflagged configurations come before flagged ones, then by throughput."""
    return (
        frame.assign(_f=frame["flagged"].astype(int))
        .sort_values(["_f", "throughput_ips"], ascending=[True, False])
        .drop(columns="_f")
    )


def best_rows(agg: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per ``keys`` group, the highest-throughput unflagged configuration (flagged only when nothing else)."""
    if agg.empty:
        return agg.copy()
    ranked = _clean_first(agg[agg["throughput_ips"].notna()])
    return ranked.groupby(keys, sort=True, dropna=False).head(1).sort_values(keys).reset_index(drop=True)


def precision_class(precision: str) -> str:
    """'8-bit' (int8, fp8: quantized), '16-bit' (fp16, bf16) or '32-bit' (fp32, tf32): what a × CPU pairs.

    Why classes, not names: the CPU runs int8 where the GPU runs fp8, and both are the 8-bit
    quantized answer to "how fast with quantization"; fp16 has no CPU counterpart at all.
    """
    p = PRECISIONS.get(str(precision))
    if p is None:
        return str(precision)
    return "8-bit" if p.quantized else f"{8 * p.itemsize}-bit"


def host_cpu_for(row: dict[str, Any], cpu: pd.DataFrame) -> tuple[dict[str, Any] | None, str]:
    """The CPU configuration a row's × CPU divides by, and how it was paired (like with like).

    The CPU of the row's own run where it has one (the host-CPU part of a GPU run, docs/cpu-baseline.md),
    else any CPU of the selection; the same model and resolution; the same precision where the CPU
    measured it, else the same precision class (`precision_class`: int8 over fp8's 8 bits, fp32 over
    tf32), else the CPU's best of any precision, labelled "best vs best" with both configurations.
    The answer's "× host CPU", Table I, the speedup figure and ``compare --paper`` all pair through here,
    so one GPU configuration shows one × CPU everywhere.
    ``cpu``: the unflagged CPU configurations (`clean_cpu`).
    """
    if cpu.empty:
        return None, "unavailable: no unflagged CPU result (run without --no-cpu-baseline, or --device cpu)"
    same = cpu[(cpu["model"] == row["model"]) & (cpu["resolution"] == row["resolution"])]
    runs = set(row.get("run_ids") or [])
    mine = [bool(runs & set(r or [])) for r in same["run_ids"]] if runs and "run_ids" in same else []
    own = same[mine] if any(mine) else same.iloc[0:0]
    where = "its run's host CPU" if len(own) else "a CPU of this selection"
    pool = own if len(own) else same
    if pool.empty:
        return None, f"unavailable: no unflagged CPU result for {row['model']}"
    prec, cls = str(row["precision"]), precision_class(row["precision"])
    exact = pool[pool["precision"] == prec]
    if len(exact):
        return best_rows(exact, ["model"]).iloc[0].to_dict(), f"like with like ({prec}), {where}"
    kin = pool[[precision_class(p) == cls for p in pool["precision"]]]
    if len(kin):
        b = best_rows(kin, ["model"]).iloc[0].to_dict()
        return b, f"like with like ({cls}: {prec} over {b['precision']}), {where}"
    b = best_rows(pool, ["model"]).iloc[0].to_dict()
    return b, (
        f"best vs best ({where} measured no {prec} nor any {cls} {row['model']}): "
        f"{config_label(row, with_platform=False)} vs {config_label(b, with_platform=False)}"
    )


def ratio_interval(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float]:
    """Throughput A / B and a 95% interval from both sides' bootstrap CIs: (A low / B high, A high / B low).

    Conservative (each side's interval holds with 95%, so the ratio's with at least 90%, in practice more);
    NaN bounds where a side stored no CI.
    """

    def num(r: dict[str, Any], k: str) -> float:
        v = r.get(k)
        return float(v) if v is not None and v == v else float("nan")

    point = num(a, "throughput_ips") / num(b, "throughput_ips")
    lo = num(a, "throughput_ci_low_ips") / num(b, "throughput_ci_high_ips")
    hi = num(a, "throughput_ci_high_ips") / num(b, "throughput_ci_low_ips")
    return point, lo, hi


def _vs_cpu(row: dict[str, Any], cpu: pd.DataFrame) -> dict[str, Any]:
    """The × CPU columns of one configuration: ratio, its interval, the CPU's configuration and the match."""
    b, how = host_cpu_for(row, cpu)
    if b is None:
        return {
            "speedup_vs_cpu": np.nan,
            "speedup_vs_cpu_ci_low": np.nan,
            "speedup_vs_cpu_ci_high": np.nan,
            "cpu_baseline": how,
            "cpu_match": how,
            "cpu_throughput_ips": np.nan,
        }
    point, lo, hi = ratio_interval(row, b)
    return {
        "speedup_vs_cpu": point,
        "speedup_vs_cpu_ci_low": lo,
        "speedup_vs_cpu_ci_high": hi,
        "cpu_baseline": f"{config_label(b)} ({how})",
        "cpu_match": how,
        "cpu_configuration": config_label(b),
        "cpu_throughput_ips": b["throughput_ips"],
    }


def table1(agg: pd.DataFrame) -> pd.DataFrame:
    """Table I: peak-throughput configuration per platform, model and precision.

    Args:
        agg: aggregated configurations.

    Returns:
        One row per (platform, model, precision) with the batch, engine, memory format, threads, the
        throughput and its 95% CI, measurement and run counts, achieved TFLOPS, speedup over the CPU
        baseline (with that baseline's configuration), flags and warnings.
    """
    if agg.empty:
        return pd.DataFrame(columns=_EMPTY_T1)
    # a text model has a row per sequence length (seq_len 0 for every image model: one row, as before);
    # a resident input (records.INPUT_MODES) a row of its own, never the default input's peak
    t = best_rows(agg, ["platform", "model", "precision", *_own_rows(agg)])
    cpu = clean_cpu(agg)
    out = []
    for r in t.to_dict("records"):
        row = {
            k: r.get(k, np.nan)
            for k in [
                "platform",
                "device",
                "model",
                "precision",
                "engine",
                "memory_format",
                "threads",
                "resolution",
                "include_transfer",
                "input_mode",
                "batch_size",
                "throughput_ips",
                "throughput_ci_low_ips",
                "throughput_ci_high_ips",
                "ci_method",
                "throughput_pipelined_ips",
                "latency_median_s",
                "latency_p99_s",
                "latency_tail_s",  # what the table prints: a p99 only where n supports one (analysis.tails)
                "latency_tail_kind",
                "latency_tail_n",
                "latency_tail_name",
                "n_measurements",
                "n_runs",
                "n_excluded",
                "flagged",
                "flags",
                "warnings",
                "run_ids",
            ]
        }
        row.update(
            {
                k: r.get(k, np.nan)
                for k in ("seq_len", "tokens_per_s", "tokens_ci_low_per_s", "tokens_ci_high_per_s")
            }
        )  # text models (analysis.tokens)
        if "tokens_per_sample" in r:  # a frame with a mixed-length text batch: its real tokens per sequence
            row["tokens_per_sample"] = r["tokens_per_sample"]
        flops = r.get("flops_per_image")
        row["achieved_tflops"] = r["throughput_ips"] * flops / 1e12 if flops and flops == flops else np.nan
        row["pct_of_peak"] = _pct_of_peak(row["platform"], row["precision"], row["achieved_tflops"])
        v = _vs_cpu(r, cpu)
        row.update(
            {
                k: v[k]
                for k in ("speedup_vs_cpu", "speedup_vs_cpu_ci_low", "speedup_vs_cpu_ci_high", "cpu_baseline")
            }
        )
        row["configuration"] = config_label(r)
        row["peak_over"] = peak_over(agg, r)
        for c in ACCURACY_WORST:  # every row, so a quantized row stands beside its evidence
            row[c] = r.get(c, np.nan)
        row["accuracy"] = accuracy_label(r)
        out.append(row)
    return pd.DataFrame(out)


def _own_rows(agg: pd.DataFrame) -> list[str]:
    """The columns beyond platform, model and precision that give a configuration its own peak row."""
    return [k for k in ("seq_len", "input_mode") if k in agg]


def _seq_of(agg: pd.DataFrame, r: dict[str, Any]) -> dict[str, Any]:
    """A row's ``seq_len`` where the frame has the column: a text model's table speaks in sequences.

    Its units follow it (`deepgap.render.units.of_frame`); 0 for an image model, as in the aggregate.
    """
    return {"seq_len": r.get("seq_len", 0)} if "seq_len" in agg else {}


def _modes(agg: pd.DataFrame) -> list[str]:
    """``["input_mode"]`` where the frame has the column (a hand-built frame may not)."""
    return ["input_mode"] if "input_mode" in agg else []


def peak_over(agg: pd.DataFrame, r: dict[str, Any]) -> str:
    """Which batches a Table I peak was chosen from, and those a flag left out.

    E.g. 'best of bs1; excluded: bs256 quant (accuracy-loss)': a peak at batch 1 below fp32's is then
    read for what it is.
    """
    same = agg[
        (agg["platform"] == r["platform"])
        & (agg["model"] == r["model"])
        & (agg["precision"] == r["precision"])
    ]
    for k in _own_rows(same):  # the row's own sequence length and input mode only
        same = same[same[k] == r.get(k)]
    ok = sorted({int(b) for b in same.loc[~same["flagged"], "batch_size"]})
    text = "best of " + ", ".join(f"bs{b}" for b in ok) if ok else "every configuration flagged"
    bad = same[same["flagged"]]
    if len(bad):
        text += "; excluded: " + ", ".join(
            f"bs{int(x['batch_size'])} {x['engine']} ({', '.join(f.split('(')[0] for f in x['flags'])})"
            for x in bad.sort_values("batch_size").to_dict("records")
        )
    return text


def _pct_of_peak(platform: str, precision: str, tflops: float) -> float:
    """Achieved over the spec sheet's dense peak (`deepgap.roofline.specs`, the one datasheet), in percent."""
    from deepgap.roofline.specs import spec_for, spec_peak

    if tflops != tflops:
        return np.nan
    row = spec_for(platform)
    # A precision without its own tensor-core peak on a GPU runs at its table's ``peak_fallback``'s
    # (TF32 off: fp32; bf16 as fp16).
    p = PRECISIONS.get(precision)
    peak = spec_peak(row, precision) or (spec_peak(row, p.peak_fallback) if p and p.peak_fallback else None)
    return 100.0 * tflops / peak if peak else np.nan


def speedup_vs_fp32(agg: pd.DataFrame) -> pd.DataFrame:
    """Throughput of every non-FP32 configuration over FP32 at the same batch (fig. 11).

    The baseline is FP32 with the same engine when that engine has FP32, else eager FP32, on the same
    platform, model, batch, memory format, threads and resolution; where eager FP32 was measured only in
    another memory format (the default GPU grid: eager NCHW beside quant int8/fp8 in channels_last), the
    fastest eager FP32 of that batch in any format, named in ``baseline_memory_format``. Every row names
    its baseline (``baseline``: engine, format, batch) and says whether it is ``like_with_like`` (same
    engine and format: only the precision differs); a quant fp8 channels_last row over eager fp32 NCHW
    is not, and its figure and table label say so.
    """
    if agg.empty:
        return pd.DataFrame(columns=["platform", "model", "engine", "precision", "batch_size", "speedup"])
    same = ["platform", "model", "batch_size", "memory_format", "threads", "resolution", "include_transfer"]
    same += _modes(agg)  # a resident input over fp32 of its own input only
    fp32 = agg[(agg["precision"] == "fp32")]
    idx = {(*(r[c] for c in same), r["engine"]): r for r in fp32.to_dict("records")}
    any_format = [c for c in same if c != "memory_format"]
    eager_any: dict[tuple, dict[str, Any]] = {}
    for r in fp32[fp32["engine"] == "eager"].sort_values("throughput_ips").to_dict("records"):
        eager_any[tuple(r[c] for c in any_format)] = r  # the fastest format last, so it stays
    out = []
    for r in agg[agg["precision"] != "fp32"].to_dict("records"):
        key = tuple(r[c] for c in same)
        b = (
            idx.get((*key, r["engine"]))
            or idx.get((*key, "eager"))
            or eager_any.get(tuple(r[c] for c in any_format))
        )
        if b is None:
            continue
        out.append(
            {
                **{c: r[c] for c in [*CONFIG_VIEW_COLS, "include_transfer", "batch_size"]},
                "input_mode": r.get("input_mode", ""),
                **_seq_of(agg, r),
                "throughput_ips": r["throughput_ips"],
                "baseline_engine": b["engine"],
                "baseline_memory_format": b["memory_format"],
                "baseline": config_label(b, with_platform=False),
                "like_with_like": b["engine"] == r["engine"] and b["memory_format"] == r["memory_format"],
                "baseline_throughput_ips": b["throughput_ips"],
                "speedup": r["throughput_ips"] / b["throughput_ips"],
                "flagged": bool(r["flagged"] or b["flagged"]),
                "flags": sorted(set(r["flags"]) | set(b["flags"])),
                "warnings": sorted(set(r["warnings"]) | set(b["warnings"])),
            }
        )
    return pd.DataFrame(out)


def clean_cpu(agg: pd.DataFrame) -> pd.DataFrame:
    """The unflagged CPU configurations with a throughput (what a × CPU may divide by)."""
    if agg.empty:
        return agg
    return agg[(agg["device"] == "cpu") & ~agg["flagged"].astype(bool) & agg["throughput_ips"].notna()]


def speedup_vs_cpu(agg: pd.DataFrame) -> pd.DataFrame:
    """Peak throughput of each non-CPU platform, model and precision over the CPU's, like with like.

    The CPU side is `host_cpu_for`'s (same model and precision class, the run's own host CPU first; else
    "best vs best", said in ``cpu_match``); the interval is `ratio_interval`'s.
    """
    cpu = clean_cpu(agg)
    if agg.empty or cpu.empty:
        return pd.DataFrame(columns=["platform", "model", "precision", "speedup_vs_cpu"])
    peaks = best_rows(agg[agg["device"] != "cpu"], ["platform", "model", "precision", *_own_rows(agg)])
    out = []
    for r in peaks.to_dict("records"):
        v = _vs_cpu(r, cpu)
        if v["speedup_vs_cpu"] != v["speedup_vs_cpu"]:
            continue
        out.append(
            {
                "platform": r["platform"],
                "model": r["model"],
                "precision": r["precision"],
                "engine": r["engine"],
                "memory_format": r["memory_format"],
                "threads": r["threads"],
                "batch_size": r["batch_size"],
                "input_mode": r.get("input_mode", ""),
                **_seq_of(agg, r),
                "configuration": config_label(r),
                "throughput_ips": r["throughput_ips"],
                **{
                    k: v[k]
                    for k in (
                        "cpu_configuration",
                        "cpu_match",
                        "cpu_throughput_ips",
                        "speedup_vs_cpu",
                        "speedup_vs_cpu_ci_low",
                        "speedup_vs_cpu_ci_high",
                    )
                },
                "flagged": bool(r["flagged"]),
                "flags": r["flags"],
                "warnings": r["warnings"],
            }
        )
    if not out:
        return pd.DataFrame(columns=["platform", "model", "precision", "speedup_vs_cpu"])
    return pd.DataFrame(out)
