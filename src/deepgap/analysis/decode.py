"""Decode results as the views show them: units in every column name, the tail named, the roofline bound.

Why a frame of its own: a decode row's figures (`deepgap.core.result_details.Decode`, from
`deepgap.store.Store.decode_frame`) are TTFT, TPOT and tokens/s, not a forward pass's latency and
images/s; `show` and `export` print these columns, never the forward columns, for them.

**The roofline bound is computed here, at view time** (`deepgap.analysis.decode_roofline`): bytes and
FLOPs per decode token from the shape, batch, mean context and the precision's bytes per element, over the
device's memory bandwidth and compute peak (measured by ``deepgap peaks`` where the store holds them, else
``data/gpu_specs.csv``'s). Why not stored: a corrected sheet or a later ``peaks`` run must not need a
re-measurement. A CPU row, or a GPU the sheet lacks, has no bound (blank).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from deepgap.analysis.decode_roofline import roof
from deepgap.core.result_details import Decode, ResultDetails
from deepgap.core.stats import P99_MIN_N

# the configuration's columns, then the figures (units in the names: ms, tokens/s, J/token, bytes)
CONFIG_COLUMNS = (
    "run_id",
    "result_id",
    "model",
    "engine",
    "precision",
    "device",
    "device_name",
    "batch_size",
    "input_len",
    "output_len",
    "kv_cache",  # "" = the decoder's own dtype; "fp8" (core.records.KV_CACHE_LABELS): never pooled with it
    "threads",
    "sweep",
    "status",
    "reason",
)


def _ms(v: Any) -> float:
    return v * 1e3 if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def _num(v: Any) -> float:
    return (
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan
    )


def tail_label(d: Decode) -> str:
    """'p99 of n=381' or 'max of n=21' (a p99 only where n ≥ 368: `deepgap.analysis.tails`)."""
    if not d.tpot_n:
        return ""
    kind = "p99" if d.tpot_tail_kind == "p99" and d.tpot_n >= P99_MIN_N else "max"
    return f"{kind} of n={d.tpot_n}"


def figures(row: dict[str, Any], peaks: Any = None) -> dict[str, Any]:
    """One decode row's figures as the views name them (blank where the row is not ok).

    ``peaks``: measured ceilings (`deepgap.roofline.storage.peaks_frame`), preferred to the spec sheet's.
    """
    ex = ResultDetails.of(row.get("extra"))
    d = ex.decode or Decode()
    ok = row.get("status") == "ok"
    c = ex.correctness
    rf = roof(row, d, peaks)
    b = rf.memory_bound_tok_s
    rate = _num(row.get("throughput_ips")) if ok else math.nan
    out = {
        "ttft_median_ms": _ms(d.ttft_median_s),
        "ttft_n": d.ttft_n,
        "tpot_median_ms": _ms(d.tpot_median_s),
        "tpot_median_ci_low_ms": _ms(row.get("latency_median_ci_low_s")),
        "tpot_median_ci_high_ms": _ms(row.get("latency_median_ci_high_s")),
        "tpot_n": d.tpot_n,
        "tpot_tail_ms": _ms(d.tpot_tail_s),
        "tpot_tail_label": tail_label(d),
        "decode_tokens_per_s": rate,  # batch / median TPOT
        "decode_tokens_per_s_ci_low": _num(row.get("throughput_ci_low_ips")) if ok else math.nan,
        "decode_tokens_per_s_ci_high": _num(row.get("throughput_ci_high_ips")) if ok else math.nan,
        "pipelined_decode_tokens_per_s": _num(d.pipelined_decode_tok_s),
        "output_tokens_per_s": _num(d.output_tok_s),
        "total_tokens_per_s": _num(d.total_tok_s),
        "joules_per_token": _num(d.joules_per_token),
        "energy_window_s": _num(d.energy_window_s),
        "kv_cache_bytes": d.kv_cache_bytes,
        "weight_bytes": d.weight_bytes,
        "bytes_per_token": rf.bytes_per_token,  # weights as stored + the KV cache at the mean context
        "flops_per_token": rf.flops_per_token,
        "weight_bytes_per_step": rf.weight_bytes_per_step,
        "kv_bytes_per_step": rf.kv_bytes_per_step,
        "intensity_flop_per_byte": rf.intensity,
        "achieved_tflops": rate * rf.flops_per_token / 1e12,
        "bandwidth_gb_s": rf.bandwidth_gb_s,
        "peak_tflops": rf.peak_tflops,
        "bound_tokens_per_s": b,  # memory-bound decode tokens/s: bandwidth / bytes per token
        "bound_source": rf.bandwidth_source,
        "fraction_of_bound": rate / b if b > 0 else math.nan,
        "compute_bound_tokens_per_s": rf.compute_bound_tok_s,
        "compute_bound_source": rf.peak_source,
        "bound_limiter": rf.limiter,
        "tokens_checked": d.tokens_checked,
        "token_agreement_vs_fp32": _num(d.token_agreement),
        "first_mismatch": d.first_mismatch,
        "logits_rel_l2_vs_fp32": _num(c.rel_l2) if c else math.nan,
        "logits_cosine_vs_fp32": _num(c.cosine) if c else math.nan,
        "logits_flagged": bool(c.flagged) if c and c.flagged is not None else None,
        "decode_step": d.step or "",
        "decode_pdl": d.pdl or "",  # the graph's launch and why ("on: timed …"; `llm_steps._kept`)
        # how the prompt ran (`llm_steps.make_prefill`): rows stored before session 44 ran it eager
        "decode_prefill": d.prefill or "eager",
        "decode_attention": d.attention
        or "",  # the static step's ("split 8×32 (auto)"; `llm_attention.describe`)
        "decode_tiles": d.tiles or "",  # the worker's tuned GEMV tiles (`quant.gemv.chosen`)
        "decode_angles": d.angles or "",  # RoPE's: "one kernel" or "formula" ("": stored before session 53)
    }
    kept = (
        "decode_step",
        "decode_pdl",
        "decode_prefill",
        "decode_attention",
        "decode_tiles",
        "decode_angles",
    )
    return out if ok else {k: (v if k in kept else None) for k, v in out.items()}


def decode_table(df: pd.DataFrame, peaks: Any = None) -> pd.DataFrame:
    """`Store.decode_frame`'s rows as the views' frame: configuration columns, then `figures`.

    ``peaks``: the store's measured ceilings (`deepgap.roofline.storage.peaks_frame`), or None.
    """
    if df.empty:
        return pd.DataFrame(columns=[*CONFIG_COLUMNS, *figures({"status": "ok"}), "config_key"])
    recs = []
    for row in df.to_dict("records"):
        base = {k: row.get(k) for k in CONFIG_COLUMNS}
        base["kv_cache"] = kv_cell(row.get("kv_cache"))  # a hand-built frame may have none
        recs.append({**base, **figures(row, peaks), "config_key": row.get("config_key")})
    tab = pd.DataFrame.from_records(recs)
    for c in COUNTS:  # counts stay integers beside a skipped row's blanks (not 3.0)
        tab[c] = pd.to_numeric(tab[c], errors="coerce").round().astype("Int64")
    return tab


COUNTS = (
    "batch_size",
    "input_len",
    "output_len",
    "ttft_n",
    "tpot_n",
    "kv_cache_bytes",
    "weight_bytes",
    "tokens_checked",
    "first_mismatch",
)


def kv_cell(value: Any) -> str:
    """A ``kv_cache`` cell as the views hold it: "" for the decoder's own dtype (None, NaN, ""), else its name."""
    return value if isinstance(value, str) else ""


def decode_agg(frame: pd.DataFrame, samples=None) -> pd.DataFrame:
    """`Store.decode_frame` rows aggregated per configuration, input/output pair and KV cache (every one).

    `deepgap.analysis.aggregate` per pair and cache format: its configuration columns hold the input length
    as ``resolution`` but neither the output length nor the cache's format, so rows differing in those
    only are aggregated apart, never pooled. ``throughput_ips`` is decode tokens/s with its CI.
    """
    from deepgap.analysis import aggregate, prepare  # the package imports this module

    parts = []
    if not frame.empty:
        frame = frame.assign(kv_cache=[kv_cell(v) for v in frame.get("kv_cache", [""] * len(frame))])
        for (i, o, kv), sub in frame.groupby(["input_len", "output_len", "kv_cache"], sort=True):
            agg = aggregate(prepare(sub.reset_index(drop=True)), samples=samples)
            if len(agg):
                parts.append(agg.assign(input_len=int(i), output_len=int(o), kv_cache=str(kv)))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def across_sweeps(df: pd.DataFrame, samples=None) -> pd.DataFrame:
    """One row per decode configuration measured in two or more worker processes (``--sweeps``).

    `deepgap.analysis.aggregate` per (input, output) length pair (its configuration columns hold the
    input length as ``resolution`` but not the output length, so each pair is aggregated apart): decode
    tokens/s as ``throughput_ips`` with the two-level CI (processes, then samples), the median TPOT as
    ``latency_median_s`` and the pooled tail (``latency_tail_name``: a p99 only where the pooled n
    supports one).
    """
    agg = decode_agg(df, samples)
    if agg.empty:
        return agg
    return agg[agg["n_measurements"] >= 2].reset_index(drop=True)
