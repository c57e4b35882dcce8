"""Contamination flags: short strings saying why a measurement may not show the hardware's steady behaviour.

Why flags and not rejection: a flagged measurement keeps its numbers (they are what happened), but
`deepgap show`, the report and the recommendations mark it and leave it out where a clean repeat
exists. The paper only asserted "no sustained throttling"; these make the claim checkable per
configuration. Every flag is computed from the samples inside the configuration's energy windows:

- ``thermal-throttle``: a thermal slowdown reason (sw/hw) in at least ``throttle_min_fraction`` of them.
- ``power-throttle``: the software power cap, the hardware power brake or the board limit, likewise.
- ``hw-slowdown``: NVML's generic hardware slowdown (heat or power brake), likewise.
- ``throttle:<reason>``: any other non-benign reason (benign: idle, application clocks, sync boost, display).
- ``foreign-procs(N)``: N other processes held a context on the GPU during the windows.
- ``clocks-low``: more than ``clock_low_fraction`` of the busy samples ran more than
  ``clock_tolerance`` below the steady SM clock (the thermal warm-up's, else the windows' own 90th
  percentile: clocks that were still ramping).
- ``temp-rising``: the temperature climbed faster than ``temp_rising_c_per_min`` and by at least
  ``temp_rising_min_c`` over the windows (not yet at thermal steady state).
- ``energy-untimed-work``: the energy windows lasted more than `ENERGY_TIMING_SLACK` × the time the
  timer gave their work (items ÷ pipelined rate), so their energy holds work the timer did not count
  (session 18's decode windows held the prefill launched just before them): joules per item overstated.
"""

from __future__ import annotations

from deepgap.measure.telemetry.base import BENIGN_REASONS, POWER_REASONS, THERMAL_REASONS, TelemetryWindow
from deepgap.measure.telemetry.settings import TelemetrySettings

# host seconds of the energy windows over the timer's seconds for the same work: synchronisation and the
# counter's reads cost a few per cent; a quarter more is work outside the timed region
ENERGY_TIMING_SLACK = 1.25


def energy_timing_flag(w: TelemetryWindow, pipelined_ips: float | None) -> str | None:
    """``energy-untimed-work`` where the energy windows outlast their timed work (module doc), else None."""
    if not (pipelined_ips and w.energy_window_s and w.energy_j and w.joules_per_image):
        return None
    timed_s = w.energy_j / w.joules_per_image / pipelined_ips  # items ÷ items per second
    return "energy-untimed-work" if w.energy_window_s > ENERGY_TIMING_SLACK * timed_s else None


def contamination_flags(w: TelemetryWindow, s: TelemetrySettings | None = None) -> list[str]:
    """The flags of one aggregated configuration (empty when clean or when nothing could be read)."""
    s = s or TelemetrySettings()
    out: list[str] = []
    frac = w.throttle_fraction

    def hit(names: frozenset[str] | set[str]) -> bool:
        share = max((frac.get(n, 0.0) for n in names), default=0.0)
        return share > 0 and share >= s.throttle_min_fraction

    if hit(THERMAL_REASONS):
        out.append("thermal-throttle")
    if hit(POWER_REASONS):
        out.append("power-throttle")
    if hit({"hw_slowdown"}):
        out.append("hw-slowdown")
    known = BENIGN_REASONS | THERMAL_REASONS | POWER_REASONS | {"hw_slowdown"}
    out += [f"throttle:{name}" for name in sorted(set(frac) - known) if hit({name})]
    if w.foreign_procs_max:
        out.append(f"foreign-procs({w.foreign_procs_max})")
    if w.sm_clock_low_fraction is not None and w.sm_clock_low_fraction > s.clock_low_fraction:
        out.append("clocks-low")
    slope, t0, t1 = w.temp_slope_c_per_min, w.temp_start_c, w.temp_end_c
    if (
        slope is not None
        and t0 is not None
        and t1 is not None
        and slope > s.temp_rising_c_per_min
        and t1 - t0 >= s.temp_rising_min_c
    ):
        out.append("temp-rising")
    return out
