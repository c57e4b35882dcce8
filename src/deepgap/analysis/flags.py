"""A measurement's flags: what disqualifies it (wrong outputs, contaminated telemetry), what only warns.

Why apart from the frame (`deepgap.analysis.frame`, which builds and aggregates the results table): the rule
of what counts against a number is its own concept — a GPU at its own power limit warns, a hardware brake
disqualifies — and every view that shows a flag reads it from here.
"""

from __future__ import annotations

from typing import Any

from deepgap.core.result_details import ResultDetails
from deepgap.core.stats import finite_or_none as _num
from deepgap.measure.telemetry.settings import TelemetrySettings

TELEMETRY_MEDIAN = ["mean_power_w", "energy_j", "joules_per_image", "ips_per_watt"]
TELEMETRY_MAX = ["max_temp_c"]


# Telemetry flags that warn without disqualifying: ``temp-rising`` says the GPU had not reached its
# thermal steady state, not that the measurement was slowed — a slowdown inside the windows raises
# ``clocks-low`` or a throttle flag. (Many rows of an ordinary sweep are still warming at steady clocks;
# disqualifying them would leave Table I and `recommend` answering from whatever happened to be warm.)
# ``energy-untimed-work`` says the joules per item are overstated, not that the timing is wrong: a warning.
WARNING_FLAGS = frozenset({"temp-rising", "energy-untimed-work"})

# The GPU holding its own configured power limit (NVML ``sw_power_cap`` and no external brake) is its
# steady behaviour under that load, not contamination: the fastest engines at large batches reach it, and
# a deployment would be capped the same way. Its ``power-throttle`` and the ``clocks-low``
# it causes become warnings (``power-cap``, ``clocks-low(power-cap)``); a thermal slowdown, the
# hardware power brake or the board limit still disqualify.
POWER_CAP_REASON = "sw_power_cap"

POWER_BRAKES = ("hw_power_brake_slowdown", "board_limit")

THROTTLE_MIN_FRACTION = TelemetrySettings().throttle_min_fraction  # the share that raised the flag

Details = ResultDetails | dict[str, Any] | None  # a measurement's details; a parsed JSON object is read


def telemetry_flags(extra: Details) -> list[str]:
    """The telemetry flags stored in a measurement's details (a string or a list)."""
    flags = ResultDetails.of(extra).flags or []
    return [str(f) for f in ([flags] if isinstance(flags, str) else flags) if str(f)]


def power_capped(extra: Details) -> bool:
    """Whether the measurement ran at the GPU's configured power limit, with no external power brake."""
    tel = ResultDetails.of(extra).telemetry
    frac = tel.throttle_fraction if tel is not None else None
    if not isinstance(frac, dict):
        return False
    cap = _num(frac.get(POWER_CAP_REASON)) or 0.0
    return cap >= THROTTLE_MIN_FRACTION and not any((_num(frac.get(r)) or 0.0) > 0 for r in POWER_BRAKES)


def _split_telemetry(extra: Details) -> tuple[list[str], list[str]]:
    """(disqualifying, warning) telemetry flags of one measurement."""
    capped = power_capped(extra)
    bad, warn = [], []
    for f in telemetry_flags(extra):
        if f in WARNING_FLAGS:
            warn.append(f)
        elif capped and f == "power-throttle":
            warn.append("power-cap")
        elif capped and f == "clocks-low":
            warn.append("clocks-low(power-cap)")
        else:
            bad.append(f)
    return bad, warn


DEGENERATE = "degenerate-output"


def degenerate(extra: Details) -> str:
    """Why the check's reference logits carry no information ("all-zero logits"), or "".

    Stored by the check since it was recorded (`correctness.degenerate`); before, an all-zero reference
    and an all-zero output left relL2 0 and cosine 0 exactly (the zero vectors' signature), and the row
    read ``WRONG(relL2=0)``: a random-weight ViT-B/16 (zero-initialised head) on every row.
    """
    corr = ResultDetails.of(extra).correctness
    if corr is None:
        return ""
    if corr.degenerate:
        return str(corr.degenerate)
    return "all-zero logits" if _num(corr.rel_l2) == 0.0 and _num(corr.cosine) == 0.0 else ""


def degenerate_note(reason: str) -> str:
    """The note a degenerate output carries: what, why nothing was checked, and the fix."""
    return f"{DEGENERATE}({reason}: the check cannot tell right from wrong; pass --weights)"


def row_flags(extra: Details) -> list[str]:
    """Disqualifying flags of one measurement: wrong outputs, telemetry contamination."""
    extra = ResultDetails.of(extra)
    out: list[str] = []
    corr = extra.correctness
    if corr is not None and corr.flagged and not degenerate(extra):
        rel = _num(corr.rel_l2)
        out.append(f"wrong-output(relL2={rel:.2g})" if rel is not None else "wrong-output")
    return out + _split_telemetry(extra)[0]


def row_warnings(ci_met: Any, extra: Details = None) -> list[str]:
    """Non-disqualifying warnings of one measurement.

    The adaptive CI target was missed, the temperature was still rising, the GPU ran at its own power limit,
    the model's output carried no information to check (`degenerate`).
    """
    v = _num(ci_met)
    out = ["ci-not-met"] if v is not None and v == 0 else []
    dead = degenerate(extra)
    return out + _split_telemetry(extra)[1] + ([degenerate_note(dead)] if dead else [])


def telemetry_of(extra: Details) -> dict[str, float]:
    """The numeric telemetry aggregates of one measurement (missing or malformed keys dropped).

    Energy figures come from one window: images/s/W is 1 / (J/image), both from the energy windows'
    images and joules (the device's energy counter where it has one, else sampled power × time), and
    mean power is those joules over the windows' work seconds. The stored ``mean_power_w`` (sampled
    driver power) and ``ips_per_watt`` (pipelined throughput / that power: the paper's formula) are a
    different window and a different sensor, and disagreed with the counter's joules by tens of percent
    on a real GPU (issue 19); they are used only where no energy was measured.
    """
    tel = ResultDetails.of(extra).telemetry
    if tel is None:
        return {}
    out = {}
    for k in TELEMETRY_MEDIAN + TELEMETRY_MAX:
        v = _num(tel.get(k))
        if v is not None:
            out[k] = v
    jpi = out.get("joules_per_image")
    if jpi is not None and jpi > 0:
        out["ips_per_watt"] = 1.0 / jpi
        power = _num(tel.get("power_from_energy_w"))
        if power is not None and power > 0:
            out["mean_power_w"] = power
    return out
