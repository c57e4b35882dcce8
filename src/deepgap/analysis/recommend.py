"""``deepgap recommend``: the best (platform, engine, precision, batch) per model under constraints.

The answer a user is after is rarely "the peak": it is "the most images per second whose P99
stays under 10 ms and fits in 8 GiB". Candidates are the aggregated configurations
(`deepgap.analysis.frame.aggregate`); flagged ones (wrong outputs, contaminated telemetry, accuracy
below the constraint: `deepgap.analysis.accuracy`) are never recommended. The tail checked against
``--slo-p99`` is the worst P99 over a configuration's measurements where each has the samples for a P99
(≥ 368), else the maximum of all their samples, and the answer says which (`deepgap.analysis.tails`:
20 synchronized calls give a maximum, not a serving p99). The memory
checked is NVML's device-wide figure where stored, else the process's reserved/allocated peak,
else the host RSS of a CPU run. When nothing meets the constraints the answer says so and names
the closest miss (smallest relative violation) with the numbers by which it misses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap.analysis import tails, tokens
from deepgap.analysis.accuracy import COLUMNS as ACCURACY_COLUMNS
from deepgap.analysis.frame import (
    ACCURACY_WORST,
    MEMORY_LABELS,
    accuracy_label,
    config_label,
    input_mode_cell,
    memory_metric,
)
from deepgap.core.errors import UsageError
from deepgap.core.guards import RATE_REASON, is_rate_flag
from deepgap.core.limits import MAX_DURATION_S
from deepgap.core.records import TEXT_INPUTS, input_kind

OBJECTIVES = {
    "throughput": "highest images/s",
    "latency": "lowest median latency",
    "joules": "fewest joules per image",
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([-+]?\d+))?\s*(s|ms|us|µs|ns)\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b?|b)\s*$", re.IGNORECASE)
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# Why a resident-input configuration (core.records.INPUT_MODES) is never the answer: its images were
# quantized and placed in GPU memory before timing (MLPerf's condition), which a deployment still pays.
RESIDENT_REASON = (
    "resident input (int8 images in GPU memory, MLPerf-like): shown beside the answer, not as it"
)
# short: it is repeated per input kind in the answer's "no candidate" cells (the row's own label says the rest)
TEXT_INPUT_REASON = "{kind} input (mixed lengths): another workload, beside the answer, not it"


def other_input_reason(mode: Any) -> str:
    """Why a row of another input mode is not a candidate: the resident input's reason, or a text input's."""
    kind = input_kind(mode)
    if kind in TEXT_INPUTS:
        return TEXT_INPUT_REASON.format(kind=kind)
    return RESIDENT_REASON


def parse_duration_s(text: str, flag: str = "--slo-p99") -> float:
    """``"10ms"`` → 0.01. A positive number with a unit (s, ms, us, ns); anything else is a `UsageError`."""
    m = _DURATION.match(str(text))
    value = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else "")) if m else 0.0
    if not m or not value > 0 or not math.isfinite(value):
        raise UsageError(f"{flag} {text!r} is not a positive duration with a unit", f"pass e.g. {flag} 10ms")
    seconds = value * _TIME_UNITS[m.group(3).lower()]
    if seconds > MAX_DURATION_S:
        raise UsageError(f"{flag} {text!r} is over a day", f"pass e.g. {flag} 10ms")
    return seconds


def parse_bytes(text: str, flag: str = "--max-memory") -> int:
    """``"8GiB"`` → 8·2³⁰. KB/MB/GB/TB are powers of 1000; KiB/MiB/GiB/TiB and bare K/M/G/T powers of 1024."""
    m = _SIZE.match(str(text))
    value = float(m.group(1)) if m else 0.0
    if not m or not value > 0:
        raise UsageError(f"{flag} {text!r} is not a positive size with a unit", f"pass e.g. {flag} 8GiB")
    unit = m.group(2).lower()
    power = "bkmgt".index(unit[0])
    base = 1000 if unit.endswith("b") and len(unit) == 2 else 1024
    return int(value * base**power)


def check_objective(text: str) -> str:
    """A known objective name, else a `UsageError` listing them."""
    if text not in OBJECTIVES:
        raise UsageError(f"--objective {text!r} is unknown", f"use one of {', '.join(OBJECTIVES)}")
    return text


@dataclass
class Recommendation:
    """The answer for one model: a choice with its evidence, or none and the closest miss."""

    model: str
    resolution: int
    objective: str
    choice: dict[str, Any] | None = None
    runner_up: dict[str, Any] | None = None
    closest_miss: dict[str, Any] | None = None
    misses: list[str] = field(default_factory=list)  # how the closest miss violates the constraints
    considered: int = 0
    excluded: dict[str, int] = field(default_factory=dict)  # reason → number of configurations
    reason: str = ""  # why there is no choice


def evidence(row: dict[str, Any]) -> dict[str, Any]:
    """The numbers behind a recommendation, with the configuration and the runs they come from."""
    metric, mem = memory_metric(row)
    ev = {
        "configuration": config_label(row),
        "platform": row["platform"],
        "device": row["device"],
        "engine": row["engine"],
        "precision": row["precision"],
        "batch_size": int(row["batch_size"]),
        "threads": int(row.get("threads") or 0),
        "memory_format": row["memory_format"],
        "throughput_ips": row["throughput_ips"],
        "throughput_ci_ips": [row.get("throughput_ci_low_ips"), row.get("throughput_ci_high_ips")],
        "throughput_pipelined_ips": row.get("throughput_pipelined_ips"),
        "latency_median_s": row.get("latency_median_s"),
        "latency_p99_s": row.get("latency_p99_s"),
        "latency_tail_s": tails.from_row(row).seconds,  # what --slo-p99 checks: a p99, or the max of n
        "latency_tail": tails.from_row(row).label(),
        "memory_metric": MEMORY_LABELS.get(metric or "", "unavailable: no memory figure stored"),
        "memory_bytes": mem,
        "joules_per_image": row.get("joules_per_image"),  # per sample: per sequence for a text model
        "seq_len": tokens.seq_len_of(row.get("seq_len")) or None,  # a text model's length (None: image)
        "tokens_per_s": row.get("tokens_per_s"),
        "joules_per_token": row.get("joules_per_token"),
        "ips_per_watt": row.get("ips_per_watt"),
        "n_measurements": int(row.get("n_measurements") or 0),
        "run_ids": list(row.get("run_ids") or []),
        "warnings": list(row.get("warnings") or []),
        "excluded_measurements": int(row.get("n_excluded") or 0),
        **{k: row.get(k) for k in ACCURACY_WORST},  # against fp32: what a quantized choice gives up
        "accuracy": accuracy_label(row),
        **{k: row.get(k) for k in ACCURACY_COLUMNS},  # dataset top-1/top-5 (NaN → None below) where measured
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in ev.items()}


def _objective_value(row: dict[str, Any], objective: str) -> float | None:
    col = {"throughput": "throughput_ips", "latency": "latency_median_s", "joules": "joules_per_image"}[
        objective
    ]
    v = row.get(col)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _sort_key(row: dict[str, Any], objective: str) -> tuple[float, float]:
    v = _objective_value(row, objective) or math.inf
    primary = -v if objective == "throughput" else v
    return primary, -float(row["throughput_ips"])


def _violations(
    row: dict[str, Any], slo_p99_s: float | None, max_memory_bytes: int | None
) -> tuple[list[str], float, str | None]:
    """(violation texts, worst relative excess, exclusion reason when a constraint cannot be checked)."""
    checks = []  # (the row's value, its bound, the text naming both)
    if slo_p99_s is not None:
        tail = tails.from_row(row)
        p99 = tail.seconds
        if not tail.kind or p99 != p99:
            return [], 0.0, "no latency tail stored"
        checks.append((p99, slo_p99_s, f"{tail.short()} {p99 * 1e3:.3g} ms > SLO {slo_p99_s * 1e3:.3g} ms"))
    if max_memory_bytes is not None:
        metric, mem = memory_metric(row)
        if mem is None:
            return [], 0.0, "no memory figure stored"
        gib = f"{mem / 2**30:.3g} GiB ({MEMORY_LABELS[metric]}) > {max_memory_bytes / 2**30:.3g} GiB"
        checks.append((mem, max_memory_bytes, f"memory {gib}"))
    over = [(value / bound - 1, text) for value, bound, text in checks if value > bound]
    return (
        [f"{text} (+{100 * excess:.0f}%)" for excess, text in over],
        max([0.0, *(e for e, _ in over)]),
        None,
    )


def recommend(
    agg: pd.DataFrame,
    objective: str = "throughput",
    slo_p99_s: float | None = None,
    max_memory_bytes: int | None = None,
) -> list[Recommendation]:
    """One `Recommendation` per model and resolution in ``agg`` (aggregated configurations)."""
    check_objective(objective)
    out: list[Recommendation] = []
    if agg.empty:
        return out
    for (model, res), grp in agg.groupby(["model", "resolution"], sort=True):
        rec = Recommendation(model=str(model), resolution=int(res), objective=objective)
        meets, misses = [], []
        for row in grp.to_dict("records"):
            if input_mode_cell(row.get("input_mode")):  # another kind of number: beside the answer, never it
                reason = other_input_reason(row.get("input_mode"))
            elif row["flagged"]:
                reason = "flagged: " + ", ".join(row["flags"])
            elif _objective_value(row, objective) is None:
                reason = "no energy telemetry" if objective == "joules" else f"no {objective} figure"
            else:
                texts, worst, reason = _violations(row, slo_p99_s, max_memory_bytes)
                if reason is None:
                    rec.considered += 1
                    (misses if texts else meets).append((worst, texts, row))
                    continue
            key = reason.split(":")[0] if reason.startswith("flagged") else reason
            if row["flagged"] and any(is_rate_flag(f) for f in row["flags"]):
                key = RATE_REASON  # a timing that cannot be true, said in words (guards.rate_flag)
            rec.excluded[key] = rec.excluded.get(key, 0) + 1
        meets.sort(key=lambda t: _sort_key(t[2], objective))
        if meets:
            rec.choice = evidence(meets[0][2])
            rec.runner_up = evidence(meets[1][2]) if len(meets) > 1 else None
        else:
            rec.reason = (
                "none meets the constraint"
                if misses
                else "no candidate: "
                + ("; ".join(f"{n} {r}" for r, n in rec.excluded.items()) or "no successful measurement")
            )
            if misses:
                misses.sort(key=lambda t: (t[0], _sort_key(t[2], objective)))
                rec.closest_miss = evidence(misses[0][2])
                rec.misses = misses[0][1]
        out.append(rec)
    return out
