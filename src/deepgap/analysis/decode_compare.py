"""Two sides' decode rows set against each other: decode tokens/s A ÷ B with its bootstrap CI over the TPOTs.

Why: ``deepgap compare`` read forward rows only, so two stores of decoder runs (an H200's and an H100's)
printed "no results" on both sides and "nothing to compare". A decode row's samples are its decode steps'
seconds (TPOT), and its decode tokens/s is batch ÷ median TPOT, so the forward comparison's machinery
(`deepgap.analysis.compare.compare`: the same pairing, ratio and bootstrap over pooled samples) gives
decode tokens/s A ÷ B and its interval, once each side's rows are aggregated per configuration
(`deepgap.analysis.decode.decode_agg`). Rows of other input/output lengths are other workloads: each pair
of lengths is compared apart, and a length pair one side lacks is not compared. Each row's configuration
names its lengths.
"""

from __future__ import annotations

import pandas as pd

from deepgap.analysis.compare import SamplesFn, compare


def _label(r: dict, side: str) -> str:
    """``llama-3.1-8b quant fp8 bs1 128/128 tokens on NVIDIA H200 (cuda)``: a decode side's configuration."""

    def of(col: str):  # a pairing key is one column; a side's own field is suffixed
        return r.get(f"{col}_{side}", r.get(col))

    return (
        f"{r['model']} {r['engine']} {r['precision']} bs{int(of('batch_size'))} "
        f"{int(r['input_len'])}/{int(r['output_len'])} tokens on {of('platform')} ({of('device')})"
    )


def compare_decode(
    agg_a: pd.DataFrame,
    agg_b: pd.DataFrame,
    samples_a: SamplesFn,
    samples_b: SamplesFn,
    like_kinds: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(matched configurations, each side at its best batch) of decode tokens/s, per input/output pair."""
    matched, best = [], []
    if agg_a.empty or agg_b.empty:
        return pd.DataFrame(), pd.DataFrame()
    lengths = [set(zip(g["input_len"], g["output_len"], strict=True)) for g in (agg_a, agg_b)]
    pairs = sorted(lengths[0] & lengths[1])  # a length pair one side lacks is another workload: left out
    for i, o in pairs:
        a = agg_a[(agg_a["input_len"] == i) & (agg_a["output_len"] == o)]
        b = agg_b[(agg_b["input_len"] == i) & (agg_b["output_len"] == o)]
        m, bb = compare(a, b, samples_a, samples_b, like_kinds=like_kinds)
        for frame, out in ((m, matched), (bb, best)):
            if len(frame):
                out.append(frame.assign(input_len=int(i), output_len=int(o)))
    frames = []
    for parts in (matched, best):
        df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        for side in ("a", "b"):
            if len(df):
                df[f"configuration_{side}"] = [_label(r, side) for r in df.to_dict("records")]
        frames.append(df)
    return frames[0], frames[1]
