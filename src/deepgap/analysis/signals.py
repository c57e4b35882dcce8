"""Which conditions of a measurement are warnings and which are notes.

A warning must be able to move the number beyond its CI.

When 35 of 36 configurations carried a warning, none signalled anything. The rules:

- ``power-cap`` and ``clocks-low(power-cap)`` are **notes**: the GPU holding its own configured power
  limit at a large batch (708 W read on a 700 W card) is its steady behaviour under that load, and a
  deployment is capped the same way. (An external power brake or a thermal slowdown still disqualifies:
  `flags.row_flags`.)
- ``temp-rising`` is a **warning** only where the temperature could have moved the number: the
  pipelined windows' throughput fell from the first to the last by more than the measurement's CI
  half-width, or there are fewer than two windows to tell. Otherwise it is a note,
  ``temp-rising(no drift beyond CI)``: the GPU was still warming after the warm-up had declared a
  steady state, but its throughput held within its interval. (Temperature acts on throughput through
  the clocks; the windows see that directly.)
- ``ci-not-met`` (the adaptive CI target missed) is a **note**: the interval is wider than the target,
  and it is shown; it cannot put the number outside it.
- ``spread`` (two processes' CIs disjoint: `analysis.sweeps`) is a warning only where the
  configuration's own interval (the two-level bootstrap over its processes) leaves one of their
  throughputs out; where it covers them all the disagreement is already in the interval, and it is a
  note, ``spread(covered by the CI)``.
"""

from __future__ import annotations

from typing import Any

from deepgap.core.result_details import ResultDetails
from deepgap.core.stats import finite_or_none as _num

TEMP = "temp-rising"
NOTES = frozenset({"power-cap", "clocks-low(power-cap)", "ci-not-met"})
STEADY = f"{TEMP}(no drift beyond CI)"
SPREAD_COVERED = "spread(covered by the CI)"


def window_drift(extra: Any, batch_size: Any) -> float | None:
    """Relative change of throughput from the first pipelined window to the last (−0.03: 3% slower)."""
    wins = ResultDetails.of(extra).windows or []
    rates = [(_num(w.iterations) or 0) / s for w in wins if (s := _num(w.seconds)) and s > 0]
    rates = [r for r in rates if r > 0]
    if len(rates) < 2:
        return None
    del batch_size  # a ratio of rates: the batch cancels
    return rates[-1] / rates[0] - 1.0


def ci_halfwidth_rel(tp: Any, lo: Any, hi: Any) -> float | None:
    """Half the throughput CI's width over the throughput, or None where one is missing."""
    t, a, b = _num(tp), _num(lo), _num(hi)
    if t is None or a is None or b is None or t <= 0:
        return None
    return (b - a) / 2 / t


def split(warnings: list[str], drift: float | None, half: float | None) -> tuple[list[str], list[str]]:
    """(warnings, notes) of one measurement from its raw warning list, its window drift and CI half-width."""
    warn, notes = [], []
    for w in warnings:
        if w in NOTES:
            notes.append(w)
        elif w == TEMP and drift is not None and half is not None and -drift <= half:
            notes.append(STEADY)
        elif w == TEMP and drift is not None:
            ci = f"CI ±{100 * (half or 0):.1f}%"
            warn.append(f"{TEMP}(throughput {100 * drift:+.1f}% across windows, {ci})")
        else:
            warn.append(w)
    return warn, notes


def row(r: dict[str, Any], raw: list[str]) -> tuple[list[str], list[str]]:
    """`split` for one results row (its extra, batch size and throughput CI)."""
    drift = window_drift(r.get("extra"), r.get("batch_size"))
    half = ci_halfwidth_rel(
        r.get("throughput_ips"), r.get("throughput_ci_low_ips"), r.get("throughput_ci_high_ips")
    )
    return split(raw, drift, half)


def covers(lo: Any, hi: Any, values: list[float]) -> bool:
    """Whether the interval [lo, hi] holds every value (False where it is missing)."""
    a, b = _num(lo), _num(hi)
    return a is not None and b is not None and bool(values) and all(a <= v <= b for v in values)
