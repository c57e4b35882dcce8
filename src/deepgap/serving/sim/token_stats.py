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
from typing import Any

import numpy as np

from deepgap.core.stats import P99_MIN_N
from deepgap.serving.sim.continuous import TokenLog
from deepgap.serving.sim.log import LevelSummary, judged, latency_fields


@dataclass
class TokenStats:
    """TTFT and TPOT (median, tail with its kind and n), tokens/s, the counts over each bound.

    ``output_tokens_per_s``: every output token the level produced (partial outputs of the requests a stop
    left running included, ``output_tokens``) over its window, first arrival → last token (``window_s``).
    A level that stopped early (``n_unfinished`` requests still decoding, ``n_queued`` waiting) was
    overloaded: its rate is what the server produced while the queue grew, not a rate it sustains.
    """

    ttft_p50_s: float | None = None
    ttft_tail_s: float | None = None
    ttft_tail_kind: str = ""  # "p99" | "max"; "≥ p99" | "≥ max" where queued waits are in (lower bounds)
    ttft_n: int = 0  # requests with a first token (finished or left decoding by a stop), and those queued
    tpot_p50_s: float | None = None
    tpot_tail_s: float | None = None
    tpot_tail_kind: str = ""
    tpot_n: int = 0  # finished requests with at least two output tokens
    output_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    n_over_ttft: int | None = None  # finished, decoding and still queued requests certainly over the bound
    n_over_tpot: int | None = None
    ttft_verdict: str = "none"
    tpot_verdict: str = "none"
    slots: int = 0
    decode_steps: int = 0
    mean_active: float = 0.0  # sequences per decode step
    output_tokens: int = 0
    window_s: float | None = None
    n_unfinished: int = 0
    n_queued: int = 0


TAIL_FIELDS = ("ttft_tail_s", "ttft_tail_kind", "tpot_tail_s", "tpot_tail_kind")


def tail_fields(t: TokenStats | None, prefix: str = "") -> dict[str, Any]:
    """Both tails, each with its kind, as ``prefix``-named fields (None each without ``t``).

    What a decoder's fixed level and its capacity state of their tails, in the run's summary and in a
    capacity row's details: a tail is never written without the kind ("p99" or "max" of n) that names it.
    """
    return {prefix + k: getattr(t, k) if t else None for k in TAIL_FIELDS}


def tail(x: np.ndarray) -> tuple[float | None, str, int]:
    """(seconds, "p99" or "max", n): a p99 only where n ≥ `P99_MIN_N`."""
    if not len(x):
        return None, "", 0
    if len(x) >= P99_MIN_N:
        return float(np.percentile(x, 99)), "p99", len(x)
    return float(x.max()), "max", len(x)


def combine(verdicts: list[str]) -> str:
    """Both bounds' verdicts as one: a fail where either fails, a pass where all pass, else inconclusive."""
    if not verdicts:
        return "none"
    if "fail" in verdicts:
        return "fail"
    return "pass" if all(v == "pass" for v in verdicts) else "inconclusive"


def summarize_tokens(
    log: TokenLog,
    offered_qps: float | None,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
    percentile: float = 0.99,
    confidence: float = 0.99,
) -> LevelSummary:
    """The level's `LevelSummary` (latency = arrival → last token) with its `TokenStats` in ``tokens``.

    The TTFT bound is judged on every request with a first token and on those still queued past it
    (`TokenLog`'s module: a stopped run's violations are all counted); TPOT on the finished requests. The
    TTFT median and tail take the queued requests' waits too (lower bounds: the tail's kind says "≥").
    """
    if log.n == 0 and not (len(log.unfinished_ttft_s) or log.n_queued):
        raise ValueError("no request was served")
    ttft = np.concatenate([log.ttft_s, log.unfinished_ttft_s])
    tpot = log.tpot_s[log.output_len > 1]
    window = float(log.end_s - log.start_s)
    ts = TokenStats(slots=log.slots, decode_steps=log.steps, mean_active=log.mean_active)
    # the tail of every request that reached the server: the queued ones' waits are their TTFTs at least
    reached = np.concatenate([ttft, log.queued_wait_s])
    ts.ttft_p50_s, (ts.ttft_tail_s, ts.ttft_tail_kind, ts.ttft_n) = float(np.median(reached)), tail(reached)
    if log.n_queued:
        ts.ttft_tail_kind = f"≥ {ts.ttft_tail_kind}"
    if len(tpot):
        ts.tpot_p50_s, (ts.tpot_tail_s, ts.tpot_tail_kind, ts.tpot_n) = float(np.median(tpot)), tail(tpot)
    ts.output_tokens, ts.n_unfinished, ts.n_queued = (
        log.output_tokens,
        len(log.unfinished_ttft_s),
        log.n_queued,
    )
    if window > 0:
        ts.window_s = window
        ts.output_tokens_per_s = log.output_tokens / window
        ts.input_tokens_per_s = log.input_tokens / window
    ts.slo_ttft_s, ts.slo_tpot_s = slo_ttft_s, slo_tpot_s
    verdicts = []
    if slo_ttft_s is not None:  # the requests still queued past the bound are over it, whatever follows
        ts.n_over_ttft = int((ttft > slo_ttft_s).sum()) + log.n_queued_late
        ts.ttft_verdict = judged(log, ts.n_over_ttft, percentile, confidence, len(ttft) + log.n_queued_late)
        verdicts.append(ts.ttft_verdict)
    if slo_tpot_s is not None:
        ts.n_over_tpot = int((tpot > slo_tpot_s).sum())
        ts.tpot_verdict = judged(log, ts.n_over_tpot, percentile, confidence)
        verdicts.append(ts.tpot_verdict)
    return LevelSummary(
        **latency_fields(
            log, offered_qps, window, _or_nan(log.latency_s), _or_nan(log.admit_s - log.arrival_s)
        ),
        h2d_mean_s=0.0,
        compute_mean_s=float(_or_nan(log.first_s - log.admit_s).mean()),
        d2h_mean_s=0.0,
        other_mean_s=0.0,
        mean_batch=log.mean_active,
        slo_s=slo_ttft_s,
        n_dropped=log.n_dropped,
        n_over_slo=_over_any(log, slo_ttft_s, slo_tpot_s) if verdicts else None,
        verdict=combine(verdicts),
        stopped=log.stopped,
        tokens=ts,
    )


def _or_nan(x: np.ndarray) -> np.ndarray:
    """``x``, or one NaN where a stop left no request finished (its latency statistics are unknown, not 0)."""
    return x if len(x) else np.full(1, np.nan)


def _over_any(log: TokenLog, slo_ttft_s: float | None, slo_tpot_s: float | None) -> int:
    """Requests over either bound: finished ones over TTFT or TPOT, running or queued ones over TTFT."""
    bad = np.zeros(log.n, dtype=bool)
    extra = 0
    if slo_ttft_s is not None:
        bad |= log.ttft_s > slo_ttft_s
        extra = int((log.unfinished_ttft_s > slo_ttft_s).sum()) + log.n_queued_late
    if slo_tpot_s is not None:
        bad |= (log.tpot_s > slo_tpot_s) & (log.output_len > 1)
    return int(bad.sum()) + extra
