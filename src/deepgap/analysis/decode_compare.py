"""Two sides' decode rows set against each other: decode tokens/s A ÷ B with its bootstrap CI over the TPOTs.

Why: ``deepgap compare`` read forward rows only, so two stores of decoder runs (an H200's and an H100's)
printed "no results" on both sides and "nothing to compare". A decode row's samples are its decode steps'
seconds (TPOT), and its decode tokens/s is batch ÷ median TPOT, so the forward comparison's machinery
(`deepgap.analysis.compare.compare`: the same pairing, ratio and bootstrap over pooled samples) gives
decode tokens/s A ÷ B and its interval, once each side's rows are aggregated per configuration
(`deepgap.analysis.decode.decode_agg`). Rows of other input/output lengths are other workloads: each pair
of lengths is compared apart, and a length pair one side lacks is not compared. So is each KV-cache format
(``kv_cache``: an fp8 cache against an fp8 cache only, never against the decoder's own). Each row's
configuration names its lengths and a cache of its own format.
"""

from __future__ import annotations

import pandas as pd

from deepgap.analysis.compare import SamplesFn, compare
from deepgap.core.records import kv_cache_suffix


def _label(r: dict, side: str) -> str:
    """``llama-3.1-8b quant fp8 bs1 128/128 tokens on NVIDIA H200 (cuda)``: a decode side's configuration."""

    def of(col: str):  # a pairing key is one column; a side's own field is suffixed
        return r.get(f"{col}_{side}", r.get(col))

    return (
        f"{r['model']} {r['engine']} {r['precision']} bs{int(of('batch_size'))} "
        f"{int(r['input_len'])}/{int(r['output_len'])} tokens{kv_cache_suffix(r.get('kv_cache'))} on {of('platform')} "
        f"({of('device')})"
    )


def _workloads(agg: pd.DataFrame) -> set[tuple[int, int, str]]:
    """(input length, output length, KV cache) of a side's `decode_agg` rows: what is compared apart."""
    return set(zip(agg["input_len"], agg["output_len"], agg["kv_cache"], strict=True))


def _of(agg: pd.DataFrame, i: int, o: int, kv: str) -> pd.DataFrame:
    """A side's rows of one input/output pair and KV cache."""
    return agg[(agg["input_len"] == i) & (agg["output_len"] == o) & (agg["kv_cache"] == kv)]


def compare_decode(
    agg_a: pd.DataFrame,
    agg_b: pd.DataFrame,
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    like_kinds: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(matched configurations, each side at its best batch) of decode tokens/s, per input/output pair and cache."""
    matched, best = [], []
    if agg_a.empty or agg_b.empty:
        return pd.DataFrame(), pd.DataFrame()
    # a length pair (or a cache format) one side lacks is another workload: left out
    for i, o, kv in sorted(_workloads(agg_a) & _workloads(agg_b)):
        a, b = _of(agg_a, i, o, kv), _of(agg_b, i, o, kv)
        m, bb = compare(a, b, samples_a, samples_b, like_kinds=like_kinds)
        for frame, out in ((m, matched), (bb, best)):
            if len(frame):
                out.append(frame.assign(input_len=int(i), output_len=int(o), kv_cache=str(kv)))
    frames = []
    for parts in (matched, best):
        df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        for side in ("a", "b"):
            if len(df):
                df[f"configuration_{side}"] = [_label(r, side) for r in df.to_dict("records")]
        frames.append(df)
    return frames[0], frames[1]
