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
A configuration measured in several processes pools its samples: its p99 (where the pooled n supports
one) and its "max of n" are of every sample, as its median and p5 are (`pooled`), so no percentile is
the worst of one process beside a median of all. Without the raw samples each stored p99 is one
process's, and the configuration supports a p99 only if each does.

Every view names the figure the same way (`Tail.name`): "p99 of n=400" or "max of n=20"; a column
that holds it is headed "tail ms", never "p99", because on the default presets it is a maximum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from deepgap.core.stats import P99_MIN_N, min_samples  # noqa: F401  (the rule, in core for the run console)
from deepgap.core.stats import finite_or_none as _num

CONFIDENCE = 0.95
SamplesFn = Callable[[int], list[np.ndarray]]  # result id → its raw per-call latencies, per repeat


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

    def name(self) -> str:
        """'p99 of n=400' or 'max of n=20': what every view prints beside (or instead of) "p99"."""
        if self.kind == "p99":
            return f"p99 of n={self.n}"
        return f"max of n={self.n}" if self.kind == "max" else "no tail stored"

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


def of_measurement(row) -> Tail:
    """The tail of one stored measurement (a row of `Store.results_frame`, or an export row)."""
    n = int(_num(row.get("n_samples")) or 0)
    p99, mx = _num(row.get("latency_p99_s")), _num(row.get("latency_max_s"))
    if n >= P99_MIN_N and p99 is not None:
        return Tail(p99, "p99", n)
    if mx is not None:
        return Tail(mx, "max", n)
    return Tail(p99, "max", n) if p99 is not None else Tail(float("nan"), "", n)


def pooled(arrays: list[np.ndarray]) -> dict[str, float] | None:
    """p5, median, p99 and max of the pooled per-call samples of a configuration's measurements.

    Why: the median of a configuration and its percentiles must describe one distribution; a p5 taken
    as the worst over sweeps beside a pooled median can exceed that median. None without samples.
    """
    parts = [np.asarray(a, dtype=float) for a in arrays if len(a)]
    if not parts:
        return None
    x = np.concatenate(parts)
    p5, p50, p99 = np.percentile(x, [5, 50, 99])
    return {"p5": float(p5), "median": float(p50), "p99": float(p99), "max": float(x.max()), "n": int(x.size)}


def from_row(row) -> Tail:
    """The `Tail` an aggregated row carries (`frame.aggregate`'s ``latency_tail_*`` columns)."""
    s = _num(row.get("latency_tail_s"))
    kind = str(row.get("latency_tail_kind") or "")
    n = int(_num(row.get("latency_tail_n")) or 0)
    if s is None:  # a frame aggregated without tails: its stored P99, of unknown n
        p = _num(row.get("latency_p99_s"))
        return Tail(p if p is not None else float("nan"), "max" if p is not None else "", n)
    return Tail(s, kind, n)


def _median_of(col: pd.Series) -> float:
    v = pd.to_numeric(col, errors="coerce").dropna()
    return float(v.median()) if len(v) else float("nan")


def memo(samples: SamplesFn) -> SamplesFn:
    """``samples`` read once per result id: the CI and the percentiles of `frame.aggregate` both read them."""
    cache: dict[int, list[np.ndarray]] = {}

    def read(rid: int) -> list[np.ndarray]:
        if rid not in cache:
            cache[rid] = samples(rid)
        return cache[rid]

    return read


def set_percentiles(row: dict[str, Any], used: pd.DataFrame, samples: SamplesFn | None) -> Tail:
    """Set the median, p5 and p99 of a configuration from one distribution, and return its tail.

    Several measurements with their raw samples: all three (and the tail) from the pooled samples
    (`pooled`). Otherwise the same estimator for each: the median over measurements of the stored
    median, p5 and p99 (a worst p5 beside a median p50 let p5 exceed the median); the tail is then
    `tail_of`'s (the worst p99 where each supports one, else the max of all samples).
    """
    for c in ("latency_p5_s", "latency_p99_s"):
        row[c] = _median_of(used[c]) if c in used else float("nan")
    if samples is None or len(used) < 2 or "result_id" not in used:
        return tail_of(used)
    arrays = []
    for rid in used["result_id"]:
        mine = [a for a in samples(int(rid)) if len(a)]
        if not mine:
            return tail_of(used)  # one measurement without samples: nothing to pool
        arrays += mine
    pool = pooled(arrays)
    if pool is None:
        return tail_of(used)
    row["latency_median_s"], row["latency_p5_s"], row["latency_p99_s"] = (
        pool["median"],
        pool["p5"],
        pool["p99"],
    )
    if pool["n"] >= P99_MIN_N:
        return Tail(pool["p99"], "p99", pool["n"])
    return Tail(pool["max"], "max", pool["n"])
