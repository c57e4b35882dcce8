"""Parent side of the run-level telemetry: the idle baseline and the thermal warm-up, at run start.

Why in the parent: both are requests to the one worker (which owns the device) made once per run
(and again on ``--resume``: the device has cooled down since). Their samples are stored as
run-level telemetry (``result_id`` NULL, phases ``idle`` / ``thermal``) and their summaries as one
row each with phase ``idle-summary`` / ``thermal-summary`` (read them back with `run_summaries`).
What they learn is handed to every later `MeasureRequest` through ``device.set_context``:
the idle power (dynamic energy, tail correction) and the steady SM clock (the ``clocks-low`` flag).

`PreludeSettings` is what a caller asked of the prelude (``--idle-time``, ``--thermal-warmup`` …), the same
fields for every kind of run; `HeldRows` keeps a device's rows when it is measured in a thread of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from deepgap.core.records import ConfigSpec, Status

if TYPE_CHECKING:
    from deepgap.drive.config import SweepSpec
    from deepgap.drive.launcher import Device
    from deepgap.store import Store

Samples = list[tuple[str, float, dict[str, Any]]]
# the settings that only mean something with telemetry on (a preset's own are dropped with it, silently)
SAMPLED = ("thermal_warmup", "idle_s", "thermal_window_s", "thermal_slope_c_per_min", "thermal_timeout_s",
           "sample_hz", "energy_window_s")  # fmt: skip


def asks_for_samples(settings: dict[str, Any]) -> list[str]:
    """Of ``settings`` (by spec field name), the ones set to something that needs telemetry (`SAMPLED`).

    Why one rule: ``--no-telemetry`` beside such a flag (`deepgap.commands.session_flags`) and ``telemetry =
    false`` beside such a key in a config file (`deepgap.drive.presets`) are the same contradiction. False, 0
    and unset ask for nothing (no warm-up, no idle baseline).
    """
    return [k for k in SAMPLED if settings.get(k) not in (None, False, 0, 0.0)]


@dataclass(frozen=True)
class PreludeSettings:
    """The run session's settings as a caller gave them; None keeps the kind's default (a preset's, a spec's).

    Why one record: ``run``, ``serve``, ``profile`` and ``peaks`` take the same flags for their prelude
    (`deepgap.commands.session_flags`), and a `SweepSpec` and a `deepgap.serving.run.spec.ServeSpec` name
    these fields alike, so `changes` overlays either.
    """

    telemetry: bool | None = None  # False: no telemetry, hence no idle baseline and no warm-up
    idle_s: float | None = None
    thermal_warmup: bool | None = None
    thermal_window_s: float | None = None
    thermal_slope_c_per_min: float | None = None
    thermal_timeout_s: float | None = None
    sample_hz: float | None = None

    def changes(self) -> dict[str, Any]:
        """The settings given, by spec field name (for ``spec.replace(**changes)``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def check(self) -> None:
        """A `UsageError` for a setting out of its range (`deepgap.core.limits`), before anything runs.

        For the kinds whose spec is not a validated `SweepSpec` (``profile``, ``peaks``); ``run`` and
        ``serve`` check these fields with the rest of their spec.
        """
        from deepgap.core.errors import UsageError
        from deepgap.core.limits import FLOAT_LIMITS, check_range

        if self.idle_s is not None and self.idle_s < 0:
            raise UsageError(f"--idle-time must be 0 or more, not {self.idle_s}", "pass e.g. --idle-time 2")
        given = self.changes()
        for name, flag, low, high, example, low_open in FLOAT_LIMITS:
            if name in given:
                check_range(name, given[name], low, high, flag, example, low_open=low_open)


def prelude_fields(spec: Any) -> dict[str, Any]:
    """The prelude's settings a spec holds, by field name (a `SweepSpec` and a `ServeSpec` name them alike)."""
    return {f.name: getattr(spec, f.name) for f in fields(PreludeSettings)}


class TelemetrySink(Protocol):
    """Where run-level rows go: the `deepgap.store.Store` itself, or `HeldRows` until its thread writes."""

    def record_run_telemetry(self, run_id: str, samples: Samples) -> None:  # noqa: D102
        ...


class HeldRows:
    """The run-level rows of a device's prelude measured in another thread, kept for the store's thread.

    Why not a store connection per thread: opening a second `Store` on the file while the driver's is open
    reads the file's header with a plain ``open``/``close``, and closing any file descriptor of a file drops
    every POSIX lock this process holds on it, SQLite's included — another process's reader then deletes
    the write-ahead log the driver is still writing to (its rows vanish from readers, and from the file if
    the driver is killed). The driver's one connection writes.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, Samples]] = []

    def record_run_telemetry(self, run_id: str, samples: Samples) -> None:
        """Keep ``samples`` for `write`."""
        self.rows.append((run_id, list(samples)))

    def write(self, store: TelemetrySink) -> None:
        """Store the kept rows through the driver's connection."""
        for run_id, samples in self.rows:
            store.record_run_telemetry(run_id, samples)
        self.rows = []


THERMAL_MAX_BATCH = 64  # the warm-up load: the largest planned batch up to this (a busy, not huge, load)


def thermal_config(configs: Sequence[ConfigSpec]) -> ConfigSpec:
    """The warm-up load: the first configuration's group at its largest planned batch ≤ 64."""
    first = configs[0]
    same = [c for c in configs if c.group == first.group]
    fitting = [c for c in same if c.batch_size <= THERMAL_MAX_BATCH] or [
        min(same, key=lambda c: c.batch_size)
    ]
    return max(fitting, key=lambda c: c.batch_size)


def run_level(
    device: Device,
    store: TelemetrySink,
    run_id: str,
    sweep: SweepSpec,
    configs: Sequence[ConfigSpec],
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Measure the idle baseline (and the thermal warm-up when asked); store both; update the device.

    Returns:
        ``{"idle": summary, "thermal": summary or None}``.
    """
    settings = device.telemetry_settings()
    if settings is None:
        return {"idle": None, "thermal": None}
    if settings.idle_s <= 0:  # --idle-time 0: no baseline at all (dynamic energy is then unavailable)
        idle = {"summary": {"status": "skipped: --idle-time 0"}, "samples": []}
    else:
        idle = device.idle_baseline(settings)
    summary = [("idle-summary", time.time(), idle["summary"])]
    store.record_run_telemetry(run_id, list(idle["samples"]) + summary)
    if idle["summary"].get("idle_power_w") is not None:
        device.set_context(idle_power_w=idle["summary"]["idle_power_w"])
        log(f"idle baseline: {idle['summary']['idle_power_w']:.1f} W")
    else:
        log(f"idle baseline {idle['summary'].get('status')}")
    thermal = None
    if getattr(sweep, "thermal_warmup", False) and configs:  # no configurations: nothing to warm up with
        cfg = thermal_config(configs)
        log(
            f"thermal warm-up on {cfg.label()}: until |dT/dt| < {settings.thermal_slope_c_per_min:g} °C/min "
            f"over {settings.thermal_window_s:g} s, at most {settings.thermal_timeout_s:g} s"
        )
        res = device.thermal_warmup(cfg, settings.thermal_timeout_s)
        if res.status == Status.OK:
            thermal, samples = res.details.thermal or {}, list(res.telemetry)
        elif res.status in (Status.TIMEOUT, Status.CRASH):
            thermal = {"status": f"unavailable: the worker was lost ({res.reason})", "steady": False}
            samples = []
        else:
            thermal, samples = (
                {
                    "status": f"unavailable: the warm-up load failed ({res.status.value}: {res.reason})",
                    "steady": False,
                },
                [],
            )
        store.record_run_telemetry(run_id, samples + [("thermal-summary", time.time(), thermal)])
        if thermal.get("steady_sm_clock_mhz"):
            device.set_context(ref_sm_clock_mhz=thermal["steady_sm_clock_mhz"])
        if thermal.get("status") == "ok":
            log(
                f"thermal warm-up: {thermal['stopped_by']} after {thermal['duration_s']:.0f} s, "
                f"{thermal.get('temp_start_c')} → {thermal.get('temp_end_c')} °C"
            )
        else:
            log(f"thermal warm-up {thermal.get('status')}")
    return {"idle": idle["summary"], "thermal": thermal}


def run_summaries(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The stored run-level summaries of a run: ``{"idle": [...], "thermal": [...]}``, oldest first."""
    out: dict[str, list[dict[str, Any]]] = {"idle": [], "thermal": []}
    for phase, _, data in store.run_telemetry(run_id):
        if phase.endswith("-summary"):
            out.setdefault(phase[: -len("-summary")], []).append(data)
    return out
