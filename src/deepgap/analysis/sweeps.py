"""Uncertainty across sweeps: a configuration measured in several worker processes (sweeps or runs).

One measurement's CI is a bootstrap inside one process. Fresh processes of the same configuration can
disagree by more than those intervals (clocks, memory placement, a compiler's choices), so where a
configuration has two or more measurements its interval comes from a two-level bootstrap over them
(`stats.hierarchical_bootstrap_ci`: measurements, then the samples of each), and the measurements'
own disagreement is reported: the coefficient of variation of their throughputs and, when two of their
own 95% CIs do not overlap, ``sweeps-disagree`` (a warning or a note: `analysis.signals`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from deepgap.core.stats import hierarchical_bootstrap_ci

SamplesFn = Callable[[int], list[np.ndarray]]  # result id → its raw per-iteration latencies, per repeat
SPREAD = "sweeps-disagree"  # the warning's name (analysis.signals.sweeps_disagree adds how far apart)


def throughput_ci(used: pd.DataFrame, samples: SamplesFn) -> tuple[float, float, str] | None:
    """Throughput CI of a configuration's measurements by the two-level bootstrap, or None without samples."""
    groups = process_samples(used["result_id"], samples)
    if len(groups) < 2:
        return None
    how = f"hierarchical bootstrap over {len(groups)} processes, then their samples"
    return rate_ci(used, *hierarchical_bootstrap_ci(groups), how)


def process_samples(result_ids, samples: SamplesFn) -> list[np.ndarray]:
    """One array per measurement (a process) that has samples: its repeats' latencies, concatenated."""
    arrays = ([a for a in samples(int(rid)) if len(a)] for rid in result_ids)
    return [np.concatenate(arrs) for arrs in arrays if arrs]


def rate_ci(used: pd.DataFrame, lo: float, hi: float, how: str) -> tuple[float, float, str] | None:
    """A latency CI as the configuration's throughput CI (batch / latency), or None unless both are > 0."""
    if not (lo > 0 and hi > 0):
        return None
    bs = float(used["batch_size"].iloc[0])
    return bs / hi, bs / lo, how


def spread(used: pd.DataFrame) -> tuple[float, list[float], bool]:
    """(between-measurement CV of throughput, the per-measurement throughputs, whether their CIs disagree)."""
    tp = pd.to_numeric(used["throughput_ips"], errors="coerce").to_numpy(dtype=float)
    lo = pd.to_numeric(used.get("throughput_ci_low_ips"), errors="coerce").to_numpy(dtype=float)
    hi = pd.to_numeric(used.get("throughput_ci_high_ips"), errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(tp)
    values = [float(v) for v in tp[ok]]
    if len(values) < 2:
        return float("nan"), values, False
    cv = float(np.std(values, ddof=1) / np.mean(values))
    both = np.isfinite(lo) & np.isfinite(hi)
    disagree = bool(both.sum() >= 2 and np.nanmax(lo[both]) > np.nanmin(hi[both]))
    return cv, values, disagree
