"""Thermal steady state: run load until the temperature stops moving, then measure.

Why: the paper reports measurements "after reaching steady-state thermal conditions" (its fig. 5)
without saying how steadiness was decided. Here it is a rule: the least-squares temperature slope
over the last ``window_s`` seconds stays below ``slope_c_per_min`` (in absolute value), or
``timeout_s`` passes — whichever comes first, recorded either way. The load is back-to-back
iterations of one configuration in chunks of about half a second; the sampler records the whole
timeline (phase ``thermal``), which is the data of the thermal-timeline figure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from deepgap.measure.telemetry.aggregate import busy, slope_per_min
from deepgap.measure.telemetry.base import TelemetrySample

CHUNK_S = 0.5  # seconds of back-to-back load between two steadiness checks


def steady_state(
    samples: Sequence[TelemetrySample],
    window_s: float,
    slope_c_per_min: float,
) -> tuple[bool, float | None]:
    """Whether the temperature is steady over the trailing window, and its slope (°C/min).

    Not steady until the samples with a temperature span at least 90% of ``window_s``.
    """
    temps = [(s.t_s, s.temp_c) for s in samples if s.temp_c is not None]
    if len(temps) < 2:
        return False, None
    t_end = temps[-1][0]
    tail = [(t, v) for t, v in temps if t >= t_end - window_s]
    slope = slope_per_min([t for t, _ in tail], [v for _, v in tail])
    if slope is None or tail[-1][0] - tail[0][0] < 0.9 * window_s:
        return False, slope
    return abs(slope) < slope_c_per_min, slope


def steady_summary(samples: Sequence[TelemetrySample], window_s: float) -> dict[str, Any]:
    """Temperatures, SM clock and power of the trailing window (the steady level later runs compare to)."""
    if not samples:
        return {}
    t_end = samples[-1].t_s
    tail = [s for s in samples if s.t_s >= t_end - window_s]
    temps = [s.temp_c for s in samples if s.temp_c is not None]
    clocks = [s.sm_clock_mhz for s in tail if s.sm_clock_mhz is not None and busy(s)]
    power = [s.power_w for s in tail if s.power_w is not None]
    return {
        "temp_start_c": temps[0] if temps else None,
        "temp_end_c": temps[-1] if temps else None,
        "max_temp_c": max(temps) if temps else None,
        "steady_sm_clock_mhz": float(np.median(clocks)) if clocks else None,
        "steady_power_w": float(np.mean(power)) if power else None,
    }


def run_thermal(
    step: Callable[[], object],
    clock: Any,
    snapshot: Callable[[], list[TelemetrySample]],
    *,
    window_s: float,
    slope_c_per_min: float,
    timeout_s: float,
    mono: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run ``step`` back to back until the temperature is steady or ``timeout_s`` passes.

    Args:
        step: one inference iteration.
        clock: a `deepgap.measure.timing.Clock` (synchronizes the device after every chunk).
        snapshot: returns the samples recorded so far (the sampler runs meanwhile).
        window_s: trailing window of the steadiness rule.
        slope_c_per_min: steady when the absolute slope over the window is below this.
        timeout_s: stop anyway after this long.
        mono: monotonic clock.

    Returns:
        The summary: ``status`` ("ok" or "unavailable: …"), ``steady``, ``stopped_by`` ("steady" /
        "timeout"), ``duration_s``, ``slope_c_per_min``, ``iterations`` and `steady_summary`'s keys.
    """
    first = snapshot()
    if not any(s.temp_c is not None for s in first):
        return {"status": "unavailable: no temperature reading on this device", "steady": False}
    t0 = mono()
    per_iter_s = clock.time_iteration(step)
    n = max(1, math.ceil(CHUNK_S / per_iter_s)) if per_iter_s > 0 else 1
    iterations, steady, slope = 1, False, None
    while True:
        clock.time_window(step, n)
        iterations += n
        steady, slope = steady_state(snapshot(), window_s, slope_c_per_min)
        if steady or mono() - t0 >= timeout_s:
            break
    return {
        "status": "ok",
        "steady": steady,
        "stopped_by": "steady" if steady else "timeout",
        "duration_s": mono() - t0,
        "slope_c_per_min": slope,
        "iterations": iterations,
        "window_s": window_s,
        "threshold_c_per_min": slope_c_per_min,
        "timeout_s": timeout_s,
        **steady_summary(snapshot(), window_s),
    }
