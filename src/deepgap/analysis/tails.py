"""Latency tails with their sample count: a percentile only where n supports it, else "max of n".

The timing protocol's per-call latencies are few (the ``gpu`` preset: 2 repeats × 10 iterations per
sweep). A p99 of 20 samples is the sample maximum (numpy interpolates between the two largest), and its
bootstrap CI's upper end is that maximum again: it looks like a serving tail and is not one.

When does n support the q-th percentile? The distribution-free 95% interval of a quantile runs between
two order statistics; its upper end is below the sample maximum only when
``P(Binomial(n, q) ≤ n − 1) = 1 − qⁿ ≥ 0.975``, i.e. ``n ≥ ln(0.025) / ln(q)``: 368 samples for p99,
72 for p95, 6 for the median (`min_samples`). Below that the honest statement is the maximum of the n
samples, labelled so, and that is what `recommend --slo-p99` checks (a maximum bounds the percentile
from above on those samples, so a configuration that passes on it passes on any percentile of them).
A configuration measured in several processes supports its percentile only if each measurement does
(each stored p99 is one process's); its "max of n" pools every sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from deepgap.core.stats import finite_or_none as _num

CONFIDENCE = 0.95


def min_samples(q: float, confidence: float = CONFIDENCE) -> int:
    """Fewest samples whose distribution-free ``confidence`` interval of quantile ``q`` ends below the max."""
    return int(math.ceil(math.log((1 - confidence) / 2) / math.log(q)))


P99_MIN_N = min_samples(0.99)  # 368


@dataclass(frozen=True)
class Tail:
    """The tail figure of one configuration: its seconds, what it is, and on how many samples."""

    seconds: float
    kind: str  # "p99" | "max" | "" (nothing stored)
    n: int

    def label(self) -> str:
        """'p99 of 400 samples' or 'max of 40 samples; too few for a p99, which needs ≥ 368'."""
        if self.kind == "p99":
            return f"p99 of {self.n} samples"
        if self.kind == "max":
            return f"max of {self.n} samples; too few for a p99, which needs ≥ {P99_MIN_N}"
        return "no latency samples stored"

    def short(self) -> str:
        """'P99' or 'tail (max of 40 calls)' — the name to print before a tail's value."""
        if self.kind == "p99":
            return "P99"
        return f"tail (max of {self.n} calls)" if self.kind == "max" else "tail"


def tail_of(used: pd.DataFrame) -> Tail:
    """The tail of a configuration's (unflagged) measurements.

    Their worst p99 if each has the samples for one, else the maximum over all their samples.
    """
    n_each = pd.to_numeric(used.get("n_samples", pd.Series(dtype=float)), errors="coerce").dropna()
    n_total = int(n_each.sum()) if len(n_each) else 0
    p99 = pd.to_numeric(used.get("latency_p99_s", pd.Series(dtype=float)), errors="coerce").dropna()
    mx = pd.to_numeric(used.get("latency_max_s", pd.Series(dtype=float)), errors="coerce").dropna()
    if len(n_each) and len(n_each) == len(used) and int(n_each.min()) >= P99_MIN_N and len(p99):
        return Tail(float(p99.max()), "p99", n_total)
    if len(mx):
        return Tail(float(mx.max()), "max", n_total)
    if len(p99):  # an old or hand-built row without its maximum: its p99 is the best bound stored
        return Tail(float(p99.max()), "max", n_total)
    return Tail(float("nan"), "", n_total)


def from_row(row) -> Tail:
    """The `Tail` an aggregated row carries (`frame.aggregate`'s ``latency_tail_*`` columns)."""
    s = _num(row.get("latency_tail_s"))
    kind = str(row.get("latency_tail_kind") or "")
    n = int(_num(row.get("latency_tail_n")) or 0)
    if s is None:  # a frame aggregated without tails: its stored P99, of unknown n
        p = _num(row.get("latency_p99_s"))
        return Tail(p if p is not None else float("nan"), "max" if p is not None else "", n)
    return Tail(s, kind, n)
