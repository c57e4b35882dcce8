"""Which conditions of a measurement are warnings and which are notes.

The rule: **a warning (the highlight) means the number can move beyond its CI.** Everything else is a
note: recorded and shown, but it says nothing against the number. When 35 of 36 configurations carried
a warning, none signalled anything; when a −0.3% drift inside a ±0.2% interval was highlighted on the
answer's headline rows while a 2× disagreement between sweeps was blamed on temperature, the highlight
pointed the wrong way. In detail:

- ``power-cap`` and ``clocks-low(power-cap)`` are **notes**: the GPU holding its own configured power
  limit at a large batch (708 W read on a 700 W card) is its steady behaviour under that load, and a
  deployment is capped the same way. (An external power brake or a thermal slowdown still disqualifies:
  `flags.row_flags`.)
- ``temp-rising`` is a **warning** only where the temperature could move the number beyond its CI. The
  number is the windows' average; a GPU still warming settles at its last window's rate (or lower), so
  the number can move by ``last / mean − 1`` (the *shift*). Where that fall is larger than the CI's
  half-width it is a warning, ``temp-rising(throughput −9.7% across windows: last window −5.1% vs their
  mean, CI ±0.4%)``; where it is not, a note, ``temp-rising(no drift beyond CI)``: the GPU was still
  warming after the warm-up had declared a steady state, but its throughput held within its interval.
  With fewer than two windows it cannot be told, and it warns. A configuration measured in several
  sweeps is judged again against its own (two-level) interval: a drift inside that interval is a note
  there (`judge_temperature`).
- ``degenerate-output(all-zero logits: …; pass --weights)`` is a **note**: the model's output does not
  depend on its input (random weights), so the correctness check had nothing to compare; the timing
  stands, and trained weights (``--weights``) give the check something to judge.
- ``ci-not-met`` (the adaptive CI target missed) is a **note**: the interval is wider than the target,
  and it is shown; it cannot put the number outside it.
- Sweeps that disagree (two processes' CIs disjoint: `analysis.sweeps`) are named as such, with how far
  apart they are: ``sweeps-disagree(fastest +103% over slowest)`` is a warning where the configuration's
  own interval leaves one of their throughputs out, and ``sweeps-disagree(fastest +103% over slowest,
  covered by the CI)`` a note where it covers them all (the disagreement is already in the interval).
  Never temperature: a drift inside one sweep does not explain two sweeps apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deepgap.core.result_details import ResultDetails
from deepgap.core.stats import finite_or_none as _num

TEMP = "temp-rising"
NOTES = frozenset({"power-cap", "clocks-low(power-cap)", "ci-not-met"})
STEADY = f"{TEMP}(no drift beyond CI)"
SWEEPS = "sweeps-disagree"
DEGENERATE = "degenerate-output"  # constant logits: a note on the check, not on the number (`flags`)
COVERED = "covered by the CI"


def _rates(extra: Any) -> list[float]:
    wins = ResultDetails.of(extra).windows or []
    rates = [(_num(w.iterations) or 0) / s for w in wins if (s := _num(w.seconds)) and s > 0]
    return [r for r in rates if r > 0]


def window_drift(extra: Any, batch_size: Any = None) -> float | None:
    """Relative change of throughput from the first pipelined window to the last (−0.03: 3% slower)."""
    rates = _rates(extra)
    del batch_size  # a ratio of rates: the batch cancels
    return rates[-1] / rates[0] - 1.0 if len(rates) >= 2 else None


def window_shift(extra: Any) -> float | None:
    """How far the number can move if the GPU settles at its last window: last window's rate / mean − 1."""
    rates = _rates(extra)
    return rates[-1] / (sum(rates) / len(rates)) - 1.0 if len(rates) >= 2 else None


def ci_halfwidth_rel(tp: Any, lo: Any, hi: Any) -> float | None:
    """Half the throughput CI's width over the throughput, or None where one is missing."""
    t, a, b = _num(tp), _num(lo), _num(hi)
    if t is None or a is None or b is None or t <= 0:
        return None
    return (b - a) / 2 / t


def _temp_warning(drift: float, shift: float, half: float | None) -> str:
    ci = f"CI ±{100 * (half or 0):.1f}%"
    return f"{TEMP}(throughput {100 * drift:+.1f}% across windows: last window {100 * shift:+.1f}% vs their mean, {ci})"


def split(
    warnings: list[str], drift: float | None, half: float | None, shift: float | None = None
) -> tuple[list[str], list[str]]:
    """(warnings, notes) of one measurement from its raw warning list, its windows and CI half-width.

    ``shift`` (`window_shift`) is how far the number can move; without it, half the first-to-last drift
    (the windows' mean sits about midway on a steady trend).
    """
    if shift is None and drift is not None:
        shift = drift / 2
    warn, notes = [], []
    for w in warnings:
        if w in NOTES or w.startswith(DEGENERATE):
            notes.append(w)
        elif w == TEMP and shift is not None and half is not None and -shift <= half:
            notes.append(STEADY)
        elif w == TEMP and drift is not None and shift is not None:
            warn.append(_temp_warning(drift, shift, half))
        else:
            warn.append(w)
    return warn, notes


def row(r: dict[str, Any], raw: list[str]) -> tuple[list[str], list[str]]:
    """`split` for one results row (its extra, batch size and throughput CI)."""
    extra = r.get("extra")
    half = ci_halfwidth_rel(
        r.get("throughput_ips"), r.get("throughput_ci_low_ips"), r.get("throughput_ci_high_ips")
    )
    return split(raw, window_drift(extra), half, window_shift(extra))


def judge_temperature(
    warn: set[str], notes: set[str], extras: Iterable[Any], half: float | None
) -> tuple[set[str], set[str]]:
    """A configuration's temperature warnings judged against its own interval (several sweeps).

    Each measurement's ``temp-rising`` warning was judged against that measurement's CI. The
    configuration's number is their median, with a (two-level) interval of its own; a drift that stays
    inside it cannot move that number beyond it, and becomes the note ``temp-rising(no drift beyond CI)``.
    """
    temps = {w for w in warn if w.startswith(f"{TEMP}(throughput")}
    if not temps or half is None:
        return warn, notes
    moved = [
        (d, s)
        for e in extras
        if (s := window_shift(e)) is not None and (d := window_drift(e)) is not None and -s > half
    ]
    rest = warn - temps
    if not moved:
        return rest, notes | {STEADY}
    drift, shift = min(moved, key=lambda ds: ds[1])
    return rest | {_temp_warning(drift, shift, half)}, notes


def sweeps_disagree(values: list[float], covered: bool) -> str:
    """The name of a disagreement between sweeps: how far apart, and whether the interval covers it."""
    vals = [v for v in values if v and v > 0]
    gap = ""
    if len(vals) >= 2:  # a gap under 10% with a decimal: "+0%" beside 3,549.4 and 3,555.1 read as none
        pct = 100 * (max(vals) / min(vals) - 1)
        gap = f"fastest {pct:+.{1 if pct < 10 else 0}f}% over slowest"
    tail = ", ".join(p for p in (gap, COVERED if covered else "") if p)
    return f"{SWEEPS}({tail})" if tail else SWEEPS


def covers(lo: Any, hi: Any, values: list[float]) -> bool:
    """Whether the interval [lo, hi] holds every value (False where it is missing)."""
    a, b = _num(lo), _num(hi)
    return a is not None and b is not None and bool(values) and all(a <= v <= b for v in values)


def judge_row(row: dict[str, Any], grp: Any, used: Any, disagree: bool) -> None:
    """An aggregated row's counts, flags, warnings and notes (judged against its interval), and ids.

    ``grp`` is the configuration's rows, ``used`` those not flagged (all when every one is); both frames.
    `deepgap.analysis.frame.aggregate` calls it once the row's throughput and its interval are set.
    """
    row["n_measurements"] = len(used)
    row["n_runs"] = int(used["run_id"].nunique()) if "run_id" in used else 1
    row["n_excluded"] = len(grp) - len(used)
    row["flags"] = sorted({f for fl in used["flags"] for f in fl})
    row["excluded_flags"] = sorted({f for fl in grp["flags"] for f in fl} - set(row["flags"]))
    row["flagged"] = bool(used["flagged"].any())
    warn = {w for ws in used["warnings"] for w in ws}
    notes = {n for ns in used.get("notes", []) for n in ns}
    if len(used) >= 2:  # several sweeps: a drift is judged against their interval (analysis.signals)
        half = ci_halfwidth_rel(
            row["throughput_ips"], row["throughput_ci_low_ips"], row["throughput_ci_high_ips"]
        )
        warn, notes = judge_temperature(warn, notes, used.get("extra", []), half)
    if disagree:  # named as such; a warning only if the interval leaves a sweep out (analysis.signals)
        covered = covers(
            row["throughput_ci_low_ips"], row["throughput_ci_high_ips"], row["sweep_throughputs"]
        )
        (notes if covered else warn).add(sweeps_disagree(row["sweep_throughputs"], covered))
    row["warnings"] = sorted(warn)
    row["notes"] = sorted(notes)
    row["result_ids"] = [int(r) for r in used["result_id"]] if "result_id" in used else []
    row["run_ids"] = sorted({str(r) for r in used["run_id"]}) if "run_id" in used else []
