"""The telemetry interface: one small backend protocol and the typed records that flow out of it.

Why this shape (after Zeus): every backend (NVML, CPU, the fake used by tests) answers the same
three questions — "what do the sensors say now" (`Backend.read`), "what does the energy counter say
now" (`Backend.read_energy_j`, the cheap call used to bracket an energy window) and "how is the
device set up" (`Backend.settings`, read only: deepgap never changes a GPU setting). A backend that
cannot be opened raises `TelemetryUnavailable` with an ``"unavailable: <reason>"`` message; a single
metric that cannot be read is ``None`` in the sample and its reason is kept in
`Backend.unavailable`, so a missing sensor never crashes a measurement.

Units are in every name: ``_w`` watts, ``_j`` joules, ``_c`` degrees Celsius, ``_mhz``, ``_pct``,
``_bytes``, ``_s`` seconds (``t_s`` is seconds since the epoch, comparable across processes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from deepgap.core.result_details import TelemetryKeys

# NVML clock-event ("throttle") reason bits. The values are NVML's ABI (nvml.h), copied here so the
# decoding works — and is tested — without the NVML library.
REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# Reasons that do not mean the measurement was slowed by heat or power.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"})
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown", "board_limit"})


def decode_reasons(mask: int | None) -> list[str]:
    """Names of the set bits of an NVML clock-event reason mask (unknown bits as ``unknown_0x…``).

    Args:
        mask: the bitmask from ``nvmlDeviceGetCurrentClocksEventReasons``; None when unavailable.

    Returns:
        The decoded names, lowest bit first; empty for 0 or None.
    """
    if not mask:
        return []
    out = []
    bit = 1
    m = int(mask)
    while bit <= m:
        if m & bit:
            out.append(REASON_BITS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return out


class TelemetryUnavailable(Exception):
    """A backend or metric cannot be used here; ``str(exc)`` is ``"unavailable: <reason>"``."""

    def __init__(self, reason: str) -> None:
        reason = str(reason)
        super().__init__(reason if reason.startswith("unavailable:") else f"unavailable: {reason}")


@dataclass(frozen=True)
class TelemetrySample:
    """One reading of the device's sensors; a field is None when the backend cannot read it."""

    t_s: float  # seconds since the epoch, taken when the reading was made
    power_w: float | None = None  # the driver's standard power reading (NVML: nvmlDeviceGetPowerUsage)
    power_instant_w: float | None = None  # instantaneous power, where the driver offers it
    power_avg_w: float | None = None  # the driver's averaged power field, where offered
    energy_j: float | None = None  # cumulative energy counter (NVML: mJ since driver load), raw
    temp_c: float | None = None  # GPU core (or CPU package) temperature
    mem_temp_c: float | None = None  # memory (HBM) temperature
    sm_clock_mhz: float | None = None  # GPU SM clock (CPU: mean core frequency)
    mem_clock_mhz: float | None = None
    util_pct: float | None = None  # GPU busy (CPU: all cores) utilization
    mem_util_pct: float | None = None  # memory-controller busy
    mem_used_bytes: int | None = None  # device-wide used memory (CPU: host RAM used)
    clocks_event_reasons: int | None = None  # NVML reason bitmask; decode with `decode_reasons`
    foreign_pids: tuple[int, ...] | None = None  # other processes with a context on the GPU
    foreign_procs: int | None = None  # how many (also known when their ids are not: PID namespaces)

    def to_dict(self) -> dict[str, Any]:
        """The reading as a JSON-able dict without its time and without the unreadable (None) fields."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "t_s" and v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, t_s: float, data: dict[str, Any]) -> TelemetrySample:
        """Inverse of `to_dict` (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names and k != "t_s"}
        if isinstance(kw.get("foreign_pids"), list):
            kw["foreign_pids"] = tuple(kw["foreign_pids"])
        return cls(t_s=float(t_s), **kw)


@dataclass
class TelemetryWindow(TelemetryKeys):
    """Telemetry of one configuration, aggregated over its energy windows (``extra["telemetry"]``).

    Energy comes from the device's counter bracketing each window (``energy_source="counter"``),
    else from sampled power × window time (``"power-integration"``). Power, temperature, clock and
    throttle statistics are over the samples taken inside the windows. A None field could not be
    measured; ``unavailable`` says why.
    """

    backend: str = field()  # required (TelemetryKeys' default is None)
    status: str = "ok"
    n_samples: int = 0
    n_window_samples: int = 0
    energy_windows: int = 0
    energy_source: str = ""
    energy_counter_notes: list[str] = field(default_factory=list)
    images: int = 0
    throttle_reasons: list[str] = field(default_factory=list)
    throttle_fraction: dict[str, float] = field(default_factory=dict)
    foreign_pids: list[int] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (what is stored in ``extra["telemetry"]``)."""
        return dataclasses.asdict(self)


class Backend(Protocol):
    """What every telemetry backend provides."""

    name: str  # "nvml", "cpu", "fake"
    has_energy_counter: bool  # True when `read_energy_j` returns numbers
    energy_counter_range_j: float | None  # where the counter wraps (None: it does not, it may only reset)
    unavailable: dict[str, str]  # metric name → "unavailable: <reason>" for everything it cannot read

    def read(self) -> TelemetrySample:
        """All sensors now; never raises for a single unreadable metric."""

    def read_energy_j(self) -> float | None:
        """The cumulative energy counter now (joules), or None."""

    def settings(self) -> dict[str, Any]:
        """Read-only device settings (power limit, persistence mode, clocks), JSON-able."""

    def close(self) -> None:
        """Release the driver handle."""


def counter_delta(e0_j: float | None, e1_j: float | None, range_j: float | None) -> tuple[float | None, str]:
    """Energy between two readings of a cumulative counter, wrap- and reset-aware.

    Args:
        e0_j: the earlier reading.
        e1_j: the later reading.
        range_j: the counter's wrap modulus (RAPL ``max_energy_range_uj``); None if it never wraps.

    Returns:
        (joules, note): note is ``""``, ``"wrap"`` (corrected by adding the range) or ``"reset"`` /
        ``"missing"``, in which case the joules are None: a counter that went backwards without a
        known range was reset (driver reload) and the interval cannot be known.
    """
    if e0_j is None or e1_j is None:
        return None, "missing"
    d = e1_j - e0_j
    if d >= 0:
        return d, ""
    if range_j:
        return d + range_j, "wrap"
    return None, "reset"
