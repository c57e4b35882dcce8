"""A served decoder's level in figures: TTFT and TPOT with their tails and n, tokens/s, the two-bound verdict.

Why two verdicts: MLPerf's LLM Server scenario bounds two percentiles (TTFT p99 ≤ 2 s and TPOT p99 ≤
100 ms for Llama-3.1-8B), each on its own. Each bound gets the early-stopping verdict of
`deepgap.serving.sim.capacity_stats` on its count of requests over it; the level passes only where
both pass and fails where either fails (else it is inconclusive). A dropped request counts over both.

The stored tail follows the codebase's rule (`deepgap.core.stats.P99_MIN_N`): a p99 only where n ≥ 368,
else the maximum of the n requests, labelled ``max``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepgap.core.stats import P99_MIN_N
from deepgap.serving.sim.continuous import TokenLog
from deepgap.serving.sim.log import LevelSummary, judged, latency_fields


@dataclass
class TokenStats:
    """TTFT and TPOT (median, tail with its kind and n), tokens/s, the counts over each bound."""

    ttft_p50_s: float | None = None
    ttft_tail_s: float | None = None
    ttft_tail_kind: str = ""  # "p99" | "max"
    ttft_n: int = 0
    tpot_p50_s: float | None = None
    tpot_tail_s: float | None = None
    tpot_tail_kind: str = ""
    tpot_n: int = 0  # requests with at least two output tokens
    output_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    n_over_ttft: int | None = None
    n_over_tpot: int | None = None
    ttft_verdict: str = "none"
    tpot_verdict: str = "none"
    slots: int = 0
    decode_steps: int = 0
    mean_active: float = 0.0  # sequences per decode step


def tail(x: np.ndarray) -> tuple[float | None, str, int]:
    """(seconds, "p99" or "max", n): a p99 only where n ≥ `P99_MIN_N`."""
    if not len(x):
        return None, "", 0
    if len(x) >= P99_MIN_N:
        return float(np.percentile(x, 99)), "p99", len(x)
    return float(x.max()), "max", len(x)


def summarize_tokens(
    log: TokenLog,
    offered_qps: float | None,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
    percentile: float = 0.99,
    confidence: float = 0.99,
) -> LevelSummary:
    """The level's `LevelSummary` (latency = arrival → last token) with its `TokenStats` in ``tokens``."""
    if log.n == 0:
        raise ValueError("no request was served")
    ttft, lat = log.ttft_s, log.latency_s
    tpot = log.tpot_s[log.output_len > 1]
    span = float(log.done_s.max() - log.arrival_s.min())
    ts = TokenStats(slots=log.slots, decode_steps=log.steps, mean_active=log.mean_active)
    ts.ttft_p50_s, (ts.ttft_tail_s, ts.ttft_tail_kind, ts.ttft_n) = float(np.median(ttft)), tail(ttft)
    if len(tpot):
        ts.tpot_p50_s, (ts.tpot_tail_s, ts.tpot_tail_kind, ts.tpot_n) = float(np.median(tpot)), tail(tpot)
    if span > 0:
        ts.output_tokens_per_s = float(log.output_len.sum()) / span
        ts.input_tokens_per_s = float(log.input_len.sum()) / span
    ts.slo_ttft_s, ts.slo_tpot_s = slo_ttft_s, slo_tpot_s
    verdicts = []
    for slo, x, name in ((slo_ttft_s, ttft, "ttft"), (slo_tpot_s, tpot, "tpot")):
        if slo is None:
            continue
        over = int((x > slo).sum())
        v = judged(log, over, percentile, confidence)
        setattr(ts, f"n_over_{name}", over)
        setattr(ts, f"{name}_verdict", v)
        verdicts.append(v)
    combined = (
        "none"
        if not verdicts
        else "fail"
        if "fail" in verdicts
        else "pass"
        if all(v == "pass" for v in verdicts)
        else "inconclusive"
    )
    over_any = None
    if verdicts:
        bad = np.zeros(log.n, dtype=bool)
        bad |= (ttft > slo_ttft_s) if slo_ttft_s is not None else False
        if slo_tpot_s is not None:
            bad |= (log.tpot_s > slo_tpot_s) & (log.output_len > 1)
        over_any = int(bad.sum())
    return LevelSummary(
        **latency_fields(log, offered_qps, span, lat, log.admit_s - log.arrival_s),
        h2d_mean_s=0.0,
        compute_mean_s=float((log.first_s - log.admit_s).mean()),
        d2h_mean_s=0.0,
        other_mean_s=0.0,
        mean_batch=log.mean_active,
        slo_s=slo_ttft_s,
        n_dropped=log.n_dropped,
        n_over_slo=over_any,
        verdict=combined,
        stopped=log.stopped,
        tokens=ts,
    )
