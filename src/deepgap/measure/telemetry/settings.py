"""What the worker needs to know about telemetry for one request, built from the sweep's spec.

Why a separate frozen record: the parent builds it (from `SweepSpec` plus run-level facts it learnt
at run start — the idle power, the steady SM clock) and ships it to the worker inside
`MeasureRequest`; the worker never reads the sweep. Light to import (no hardware libraries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class SweepSpec(Protocol):
    """What `settings_for` reads of a sweep (`deepgap.drive.config.SweepSpec` has it; this layer sits below)."""

    options: dict[str, Any]


@dataclass(frozen=True)
class TelemetrySettings:
    """Telemetry of one measurement (or of the run-level idle / thermal requests)."""

    backend: str = "auto"  # auto (NVML on cuda, CPU backend on cpu) | fake:<scenario> (tests)
    sample_hz: float = 10.0  # inside energy windows (and during thermal warm-up / idle)
    energy_window_s: float = 1.0  # each pipelined window lasts at least this when an energy counter exists
    align_timeout_s: float = 0.25  # a window edge waits at most this for the energy counter to tick
    idle_s: float = 2.0  # run-level idle baseline duration
    idle_power_w: float | None = None  # the run's idle baseline (filled in after it is measured)
    ref_sm_clock_mhz: float | None = None  # steady SM clock from the thermal warm-up, if one ran
    thermal_window_s: float = 30.0  # steady = |temperature slope| below the threshold over this window
    thermal_slope_c_per_min: float = 1.0
    thermal_timeout_s: float = 300.0
    mode: str = "measure"  # measure | thermal
    # contamination thresholds (see deepgap.measure.telemetry.flags)
    throttle_min_fraction: float = 0.1  # a throttle reason in at least this share of window samples
    clock_tolerance: float = 0.1  # clocks more than this fraction below their steady level …
    clock_low_fraction: float = 0.2  # … in more than this share of window samples
    temp_rising_c_per_min: float = 3.0  # temperature slope over the windows above this …
    temp_rising_min_c: float = 2.0  # … and a rise of at least this many °C (sensors read whole degrees)

    @property
    def thermal(self) -> bool:
        """Whether these settings are the run-level thermal warm-up's (one test for every request kind)."""
        return self.mode == "thermal"


def settings_for(spec: SweepSpec, context: dict[str, Any] | None = None) -> TelemetrySettings | None:
    """The settings of a sweep, or None when telemetry is off.

    Args:
        spec: the sweep (fields ``telemetry``, ``sample_hz``, ``energy_window_s``, ``idle_s``,
            ``thermal_*``; ``options["telemetry_backend"]`` selects a fake backend in tests).
        context: run-level facts (``idle_power_w``, ``ref_sm_clock_mhz``) measured at run start.
    """
    if not getattr(spec, "telemetry", True):
        return None
    ctx = context or {}
    return TelemetrySettings(
        backend=str(spec.options.get("telemetry_backend", "auto")),
        sample_hz=float(getattr(spec, "sample_hz", 10.0)),
        energy_window_s=float(getattr(spec, "energy_window_s", 1.0)),
        idle_s=float(getattr(spec, "idle_s", 2.0)),
        idle_power_w=ctx.get("idle_power_w"),
        ref_sm_clock_mhz=ctx.get("ref_sm_clock_mhz"),
        thermal_window_s=float(getattr(spec, "thermal_window_s", 30.0)),
        thermal_slope_c_per_min=float(getattr(spec, "thermal_slope_c_per_min", 1.0)),
        thermal_timeout_s=float(getattr(spec, "thermal_timeout_s", 300.0)),
    )
