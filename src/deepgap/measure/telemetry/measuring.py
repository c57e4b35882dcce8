"""Worker-side glue: open the device's backend once per worker, and measure with it.

Why here and not in the worker: `deepgap.measure.configuration._measure` only has to (1) let `MeasureTelemetry`
raise the timing protocol's minimum window, (2) wrap its clock, (3) run the protocol inside the sampler,
and (4) hand the `Result` to `finish`. The energy window is the protocol's *pipelined windows*:
they run back to back with no synchronization, so the device is busy the whole time and their
length is under our control (``min_time_s``); the synchronized latency pass is sampled too (at the
low rate) but not used for energy, since its idle gaps between iterations would dilute it.

The run-level requests (`measure_idle`, the thermal warm-up through `MeasureTelemetry.thermal`)
live here too. Every failure to open or read becomes ``"unavailable: <reason>"``, never an exception.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import TelemetryDetails
from deepgap.measure.telemetry.aggregate import in_marks, summarize
from deepgap.measure.telemetry.base import Backend, TelemetryUnavailable
from deepgap.measure.telemetry.flags import contamination_flags, energy_timing_flag
from deepgap.measure.telemetry.sampler import MarkingClock, Sampler
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.telemetry.thermal import run_thermal


def own_pids() -> set[int]:
    """This process and its children (e.g. compiler workers): never "foreign" on the GPU."""
    pids = {os.getpid()}
    try:
        import psutil

        pids |= {c.pid for c in psutil.Process().children(recursive=True)}
    except Exception:  # noqa: BLE001 - psutil missing or a child gone: the worker's own pid suffices
        pass
    return pids


def open_backend(device: str, backend: str = "auto") -> Backend:
    """The backend for ``device`` (``auto``: NVML for ``cuda[:N]``, the CPU backend for ``cpu``).

    Raises:
        TelemetryUnavailable: the backend cannot be used here.
    """
    from deepgap.measure.telemetry.fake import backend_names, scenario

    if backend not in backend_names():  # the option was checked before the run (`deepgap.drive.options`)
        raise TelemetryUnavailable(
            f"unknown telemetry backend {backend!r} (use one of {', '.join(backend_names())})"
        )
    if backend.startswith("fake:"):
        return scenario(backend[5:])
    if device.startswith("cuda"):
        from deepgap.core.nvml_access import cuda_uuid, module
        from deepgap.measure.telemetry.nvml import NvmlBackend

        pynvml, why = module()
        if pynvml is None:
            raise TelemetryUnavailable(why)

        index = int(device.split(":")[1]) if ":" in device else 0
        return NvmlBackend(pynvml, uuid=cuda_uuid(device), index=index, own_pids=own_pids())
    from deepgap.measure.telemetry.cpu import CpuBackend

    return CpuBackend()


def backend_for(
    cache: dict[str, Any], device: str, settings: TelemetrySettings
) -> tuple[Backend | None, str]:
    """The worker's backend (opened once, kept in ``cache``), or (None, "unavailable: <reason>")."""
    if settings.backend not in cache:
        try:
            cache[settings.backend] = (open_backend(device, settings.backend), "")
        except TelemetryUnavailable as exc:
            cache[settings.backend] = (None, str(exc))
        except Exception as exc:  # noqa: BLE001 - a driver problem must not fail the measurement
            cache[settings.backend] = (None, f"unavailable: {type(exc).__name__}: {exc}")
    backend, reason = cache[settings.backend]
    if backend is not None and hasattr(backend, "own_pids"):
        backend.own_pids = own_pids()
    return backend, reason


class MeasureTelemetry:
    """Telemetry around one configuration's timing protocol (or the thermal warm-up)."""

    def __init__(
        self, backend: Backend | None, reason: str, settings: TelemetrySettings, batch_size: int
    ) -> None:
        self.backend = backend
        self.reason = reason
        self.settings = settings
        self.batch_size = batch_size
        self.requested_min_s: float | None = None
        self.extended = False
        thermal = settings.thermal
        self.sampler = (
            None
            if backend is None
            else Sampler(
                backend,
                hz=settings.sample_hz,
                low_hz=settings.sample_hz if thermal else None,
                align_timeout_s=settings.align_timeout_s,
                phase="thermal" if thermal else "warmup",
            )
        )

    @classmethod
    def for_request(
        cls, cache: dict[str, Any], device: str, settings: TelemetrySettings | None, batch_size: int
    ) -> MeasureTelemetry | None:
        """None when telemetry is off for this request."""
        if settings is None:
            return None
        backend, reason = backend_for(cache, device, settings)
        return cls(backend, reason, settings, batch_size)

    @property
    def thermal_mode(self) -> bool:
        """Whether this request is the run-level thermal warm-up."""
        return self.settings.thermal

    def protocol(self, protocol: Any) -> Any:
        """The timing protocol with each pipelined window lasting at least ``energy_window_s``.

        Only with an energy counter: it needs a window several counter periods long to mean anything.
        """
        self.requested_min_s = protocol.min_time_s
        if (
            self.backend is not None
            and self.backend.has_energy_counter
            and self.settings.energy_window_s > protocol.min_time_s
        ):
            self.extended = True
            return dataclasses.replace(protocol, min_time_s=self.settings.energy_window_s)
        return protocol

    def clock(self, clock: Any) -> Any:
        """``clock`` wrapped so the sampler sees the phases and brackets every pipelined window."""
        return clock if self.sampler is None else MarkingClock(clock, self.sampler, self.batch_size)

    def __enter__(self) -> MeasureTelemetry:
        if self.sampler is not None:
            self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def finish(self, result: Result) -> None:
        """Store aggregates in ``details.telemetry``, flags in ``details.flags``, samples in ``telemetry``."""
        if self.backend is None or self.sampler is None:
            off = {"status": self.reason, "backend": self.settings.backend}
            result.details.telemetry = TelemetryDetails.from_json(off)
            return
        sm = self.sampler
        w = summarize(
            sm.samples,
            sm.marks,
            backend=self.backend.name,
            range_j=self.backend.energy_counter_range_j,
            throughput_pipelined_ips=result.throughput_pipelined_ips,
            idle_power_w=self.settings.idle_power_w,
            ref_sm_clock_mhz=self.settings.ref_sm_clock_mhz,
            clock_tolerance=self.settings.clock_tolerance,
            unavailable=self.backend.unavailable,
            settings=_safe_settings(self.backend),
        )
        if sm.error:
            w.status = sm.error
        d = w.to_dict()
        d.update(
            sample_hz=self.settings.sample_hz,
            energy_window_min_s=self.settings.energy_window_s if self.extended else self.requested_min_s,
            window_extended=self.extended,
            max_device_mem_used_bytes=max_mem_used(sm.samples),
        )
        result.details.telemetry = TelemetryDetails.from_json(d)
        flags = contamination_flags(w, self.settings)
        untimed = energy_timing_flag(w, result.throughput_pipelined_ips)
        flags += [untimed] if untimed else []
        if flags:
            result.details.flags = list(result.details.flags or []) + flags
        result.telemetry = [
            (phase, s.t_s, {**s.to_dict(), "window": int(in_marks(s.t_s, sm.marks))})
            for phase, s in sm.samples
        ]

    def thermal(self, step: Any, clock: Any, spec: ConfigSpec) -> Result:
        """Run the thermal warm-up on ``step``; the summary is in ``details.thermal``."""
        res = Result(spec=spec, status=Status.OK)
        if self.backend is None or self.sampler is None:
            res.details.thermal = {"status": self.reason, "steady": False}
            return res
        s = self.settings
        with self.sampler:
            summary = run_thermal(
                step,
                clock,
                lambda: [x for _, x in self.sampler.snapshot()],
                window_s=s.thermal_window_s,
                slope_c_per_min=s.thermal_slope_c_per_min,
                timeout_s=s.thermal_timeout_s,
            )
        if self.sampler.error:
            summary["status"] = self.sampler.error
        summary.update(
            config=spec.label(),
            config_key=spec.key,
            backend=self.backend.name,
            unavailable=dict(self.backend.unavailable),
        )
        res.details.thermal = summary
        res.telemetry = [(p, x.t_s, x.to_dict()) for p, x in self.sampler.samples]
        return res


def max_mem_used(samples: list[tuple[str, Any]]) -> int | None:
    """The highest device memory used in any sample of the protocol (warm-up, latency pass, windows).

    The sampler runs through the whole timed protocol, so this is the device-wide peak at the
    sampling rate; a single reading after timing can miss transient workspace that was freed.
    """
    used = [s.mem_used_bytes for _, s in samples if s.mem_used_bytes is not None]
    return int(max(used)) if used else None


def _safe_settings(backend: Backend) -> dict[str, Any]:
    try:
        return backend.settings()
    except Exception as exc:  # noqa: BLE001
        return {"status": f"unavailable: {type(exc).__name__}: {exc}"}


def measure_idle(
    cache: dict[str, Any], device: str, settings: TelemetrySettings, sleep: Any = time.sleep
) -> dict[str, Any]:
    """The idle baseline: the device with this worker's context loaded and nothing running.

    Returns:
        ``{"summary": {...}, "samples": [(phase, t_s, dict), ...]}``; the summary's ``idle_power_w``
        is counter energy / time when a counter exists, else the mean sampled power.
    """
    try:
        return _measure_idle(cache, device, settings, sleep)
    except Exception as exc:  # noqa: BLE001 - never take the worker down for a baseline
        return {
            "summary": {"status": f"unavailable: idle baseline failed ({type(exc).__name__}: {exc})"},
            "samples": [],
        }


def _measure_idle(
    cache: dict[str, Any], device: str, settings: TelemetrySettings, sleep: Any
) -> dict[str, Any]:
    backend, reason = backend_for(cache, device, settings)
    if backend is None:
        return {"summary": {"status": reason, "backend": settings.backend}, "samples": []}
    try:
        probe = backend.read()
    except Exception as exc:  # noqa: BLE001
        return {"summary": {"status": f"unavailable: telemetry read failed ({exc})"}, "samples": []}
    base = {
        "backend": backend.name,
        "settings": _safe_settings(backend),
        "unavailable": dict(backend.unavailable),
    }
    if not backend.has_energy_counter and probe.power_w is None:
        why = backend.unavailable.get("power_w") or backend.unavailable.get("energy_j") or "no reading"
        return {
            "summary": {**base, "status": f"unavailable: no power or energy reading ({why})"},
            "samples": [],
        }
    sm = Sampler(
        backend,
        hz=settings.sample_hz,
        low_hz=settings.sample_hz,
        align_timeout_s=settings.align_timeout_s,
        phase="idle",
    )
    with sm:
        sm.begin_window()
        sleep(settings.idle_s)
        sm.end_window(0)
    samples = [s for _, s in sm.samples]
    powers = [s.power_w for s in samples if s.power_w is not None]
    sampled = sum(powers) / len(powers) if powers else None
    counter = None
    if (
        sm.marks
        and sm.marks[0].e0_j is not None
        and sm.marks[0].e1_j is not None
        and sm.marks[0].duration_s > 0
    ):
        d = sm.marks[0].e1_j - sm.marks[0].e0_j
        counter = d / sm.marks[0].duration_s if d >= 0 else None
    temps = [s.temp_c for s in samples if s.temp_c is not None]
    summary = {
        **base,
        "status": sm.error or "ok",
        "idle_s": sm.marks[0].duration_s if sm.marks else None,
        "idle_power_w": counter if counter is not None else sampled,
        "idle_power_sampled_w": sampled,
        "idle_power_source": "counter" if counter is not None else ("sampled" if sampled is not None else ""),
        "idle_temp_c": temps[-1] if temps else None,
        "n_samples": len(samples),
    }
    return {"summary": summary, "samples": [(p, s.t_s, s.to_dict()) for p, s in sm.samples]}
