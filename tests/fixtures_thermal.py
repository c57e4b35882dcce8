"""A thermal warm-up request's telemetry, and a guard that what a warm-up must not compute is never called."""

from __future__ import annotations

from deepgap.measure.telemetry.settings import TelemetrySettings

# a fake device that heats and settles: the warm-up stops "steady" within a second on a CPU
THERMAL = TelemetrySettings(
    backend="fake:heating", sample_hz=50.0, mode="thermal", thermal_window_s=0.3, thermal_timeout_s=5.0
)


def refuse(monkeypatch, owner, *names: str) -> None:
    """Make each of ``owner``'s ``names`` fail the test if called (a warm-up stores no figure)."""

    def refused(*args, **kwargs):
        raise AssertionError("computed for a thermal warm-up")

    for name in names:
        monkeypatch.setattr(owner, name, refused)
