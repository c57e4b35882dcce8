"""Telemetry: power, energy, temperature, clocks, utilization and throttle reasons during measurements.

Layout (hardware libraries are imported only inside the backends' functions):

- `base`: the `Backend` protocol, `TelemetrySample` (one reading) and `TelemetryWindow` (one
  configuration's aggregate), throttle-reason decoding, counter wrap/reset arithmetic.
- `nvml` (NVIDIA GPUs, NVML module injected), `cpu` (RAPL + psutil), `fake` (scripted, for tests).
- `sampler`: the sampling thread and the energy windows it brackets.
- `aggregate` / `flags`: per-configuration numbers and contamination flags (pure functions).
- `thermal`: the thermal steady-state rule and warm-up loop.
- `settings` / `session` / `runlevel`: what the worker and the parent do with all of the above.

See docs/telemetry.md for what each energy figure means and its limits.
"""

from deepgap.measure.telemetry.base import (
    Backend,
    TelemetrySample,
    TelemetryUnavailable,
    TelemetryWindow,
    counter_delta,
    decode_reasons,
)
from deepgap.measure.telemetry.settings import TelemetrySettings, settings_for

__all__ = [
    "Backend",
    "TelemetrySample",
    "TelemetrySettings",
    "TelemetryUnavailable",
    "TelemetryWindow",
    "counter_delta",
    "decode_reasons",
    "settings_for",
]
