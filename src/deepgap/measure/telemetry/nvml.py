"""NVIDIA GPUs through NVML, with the NVML module injected (``NvmlBackend(pynvml, uuid=...)``).

Why injected: tests drive this exact code with `deepgap.measure.telemetry.fake.FakeNvml` (scripted values,
injected errors) on a machine without a GPU, with no patching of import paths. Everything here only
*reads*: no NVML setter is ever called, so deepgap never changes a power limit, clock or mode.

Readings and what they mean (see docs/telemetry.md):

- ``power_w``: ``nvmlDeviceGetPowerUsage``, what nvidia-smi shows. On Ampere (except GA100) and
  newer it is an average over about one second, on older GPUs an instantaneous value.
- ``power_instant_w`` / ``power_avg_w``: the ``NVML_FI_DEV_POWER_INSTANT`` / ``_AVERAGE`` field
  values (newer drivers), read in the same ``nvmlDeviceGetFieldValues`` call as memory temperature.
- ``energy_j``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver was loaded; Volta and
  newer). It never wraps in practice but restarts at 0 when the driver reloads.
- Clock-event (throttle) reasons from ``nvmlDeviceGetCurrentClocksEventReasons`` (or the older
  ``…ThrottleReasons``); other processes from ``nvmlDeviceGetComputeRunningProcesses``.

An NVML error becomes ``"unavailable: <NVML's message>"`` for that metric; "not supported" and
"no permission" are remembered so the metric is not asked for again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from deepgap.measure.telemetry.base import TelemetrySample, TelemetryUnavailable

_PERMANENT = {3, 4, 13}  # NVML_ERROR_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND
_FIELDS = (
    ("power_instant_w", "NVML_FI_DEV_POWER_INSTANT", 186, 1e-3),
    ("power_avg_w", "NVML_FI_DEV_POWER_AVERAGE", 185, 1e-3),
    ("mem_temp_c", "NVML_FI_DEV_MEMORY_TEMP", 82, 1.0),
)
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class NvmlBackend:
    """Telemetry of one GPU through an injected NVML module (``pynvml`` from nvidia-ml-py)."""

    name = "nvml"
    energy_counter_range_j: float | None = None  # uint64 mJ: resets on driver reload, never wraps

    def __init__(
        self,
        nvml: Any,
        uuid: str | None = None,
        index: int = 0,
        own_pids: Iterable[int] = (),
        self_on_device: bool = True,
        procs_period_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Open the device.

        Args:
            nvml: the NVML module (``import pynvml``) or a fake with the same functions.
            uuid: the device's NVML UUID (preferred); else ``index`` is used.
            index: NVML index, when no UUID is known.
            own_pids: process ids that are this benchmark, never "foreign".
            self_on_device: whether this process holds a context on the device (so NVML should list it).
            procs_period_s: the process list is re-read at most this often (it is the costliest call).
            clock: epoch-seconds clock for sample times.

        Raises:
            TelemetryUnavailable: NVML or the device cannot be opened.
        """
        self.nv = nvml
        self.own_pids = {int(p) for p in own_pids}
        self.self_on_device = self_on_device
        self.procs_period_s = procs_period_s
        self.clock = clock
        self.unavailable: dict[str, str] = {}
        self._skip: set[str] = set()
        self._errors: tuple[type[BaseException], ...] = (
            getattr(nvml, "NVMLError", RuntimeError),
            AttributeError,
        )
        self._procs: tuple[float, tuple[int, ...] | None, int | None] = (-1e18, None, None)
        try:
            nvml.nvmlInit()
        except self._errors as exc:
            raise TelemetryUnavailable(f"NVML cannot start ({self._why(exc)})") from None
        try:
            self.handle = (
                nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
            )
        except self._errors as exc:
            nvml.nvmlShutdown()
            raise TelemetryUnavailable(f"NVML cannot open GPU {uuid or index} ({self._why(exc)})") from None
        self.uuid = uuid
        self._fields = [
            (name, getattr(nvml, const, default), scale) for name, const, default, scale in _FIELDS
        ]
        self.has_energy_counter = self.read_energy_j() is not None

    # --- helpers ------------------------------------------------------------------------------
    def _why(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        return f"NVML error {value}: {exc}" if value is not None else f"{type(exc).__name__}: {exc}"

    def _get(self, metric: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None with the reason recorded (and remembered when permanent)."""
        if metric in self._skip:
            return None
        try:
            return fn()
        except self._errors as exc:
            self.unavailable[metric] = f"unavailable: {self._why(exc)}"
            if isinstance(exc, AttributeError) or getattr(exc, "value", None) in _PERMANENT:
                self._skip.add(metric)
            return None

    def _field_values(self) -> dict[str, float]:
        """Instant/average power and memory temperature in one ``nvmlDeviceGetFieldValues`` call."""
        fields = [f for f in self._fields if f[0] not in self._skip]
        if not fields:
            return {}
        vals = self._get(
            "field_values", lambda: self.nv.nvmlDeviceGetFieldValues(self.handle, [f[1] for f in fields])
        )
        if vals is None:
            return {}
        out = {}
        for (name, _, scale), v in zip(fields, vals, strict=False):
            ret = int(getattr(v, "nvmlReturn", 0))
            if ret != 0:
                try:
                    msg = self.nv.nvmlErrorString(ret)
                except self._errors:
                    msg = "error"
                self.unavailable[name] = f"unavailable: NVML error {ret}: {msg}"
                if ret in _PERMANENT:
                    self._skip.add(name)
                continue
            member = _VALUE_MEMBER.get(int(getattr(v, "valueType", 1)), "uiVal")
            out[name] = float(getattr(v.value, member)) * scale
        return out

    def _processes(self) -> tuple[tuple[int, ...] | None, int | None]:
        """(foreign pids, foreign count), re-read every ``procs_period_s``."""
        now = time.monotonic()
        if now - self._procs[0] < self.procs_period_s:
            return self._procs[1], self._procs[2]
        fn = getattr(self.nv, "nvmlDeviceGetComputeRunningProcesses", None)
        procs = self._get("foreign_pids", lambda: fn(self.handle)) if fn else None
        if procs is None:
            pids, count = None, None
        else:
            listed = [int(p.pid) for p in procs]
            if not self.self_on_device or self.own_pids & set(listed):
                pids = tuple(sorted(p for p in listed if p not in self.own_pids))
                count = len(pids)
            elif listed:  # a PID namespace (container): NVML lists host ids; one of them is this process
                pids, count = None, len(listed) - 1
                self.unavailable["foreign_pids"] = (
                    "unavailable: NVML lists process ids of another PID namespace; foreign processes are counted"
                )
            else:
                pids, count = None, None
                self.unavailable["foreign_pids"] = (
                    "unavailable: NVML lists no process although this one uses the GPU (PID namespace)"
                )
        self._procs = (now, pids, count)
        return pids, count

    # --- Backend ------------------------------------------------------------------------------
    def read_energy_j(self) -> float | None:
        """Total energy counter in joules (NVML counts mJ since the driver loaded), or None."""
        mj = self._get("energy_j", lambda: self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        return None if mj is None else float(mj) * 1e-3

    def read(self) -> TelemetrySample:
        """Every sensor now; unreadable ones are None (reasons in `unavailable`)."""
        nv, h = self.nv, self.handle
        t = self.clock()
        power_mw = self._get("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h))
        fields = self._field_values()
        energy = self.read_energy_j()
        temp = self._get(
            "temp_c", lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        )
        sm = self._get("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_SM", 1)))
        mem = self._get(
            "mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_MEM", 2))
        )
        util = self._get("util_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        meminfo = self._get("mem_used_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        reasons = self._get("clocks_event_reasons", lambda: reasons_fn(h)) if reasons_fn else None
        pids, count = self._processes()
        return TelemetrySample(
            t_s=t,
            power_w=None if power_mw is None else float(power_mw) * 1e-3,
            power_instant_w=fields.get("power_instant_w"),
            power_avg_w=fields.get("power_avg_w"),
            energy_j=energy,
            temp_c=None if temp is None else float(temp),
            mem_temp_c=fields.get("mem_temp_c"),
            sm_clock_mhz=None if sm is None else float(sm),
            mem_clock_mhz=None if mem is None else float(mem),
            util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_bytes=None if meminfo is None else int(meminfo.used),
            clocks_event_reasons=None if reasons is None else int(reasons),
            foreign_pids=pids,
            foreign_procs=count,
        )

    def settings(self) -> dict[str, Any]:
        """Read-only settings: name, driver, power limits, persistence mode, clocks, temperature limits."""
        nv, h = self.nv, self.handle

        def mw(fn_name: str) -> float | None:
            fn = getattr(nv, fn_name, None)
            v = self._get(f"setting:{fn_name}", lambda: fn(h)) if fn else None
            return None if v is None else float(v) * 1e-3

        def clock(fn_name: str, kind: str, default: int) -> float | None:
            fn = getattr(nv, fn_name, None)
            v = (
                self._get(f"setting:{fn_name}:{kind}", lambda: fn(h, getattr(nv, kind, default)))
                if fn
                else None
            )
            return None if v is None else float(v)

        def text(v: Any) -> str | None:
            return v.decode() if isinstance(v, bytes) else (None if v is None else str(v))

        return {
            "gpu_name": text(self._get("setting:name", lambda: nv.nvmlDeviceGetName(h))),
            "uuid": self.uuid or text(self._get("setting:uuid", lambda: nv.nvmlDeviceGetUUID(h))),
            "driver": text(self._get("setting:driver", lambda: nv.nvmlSystemGetDriverVersion())),
            "power_limit_w": mw("nvmlDeviceGetEnforcedPowerLimit"),
            "power_default_limit_w": mw("nvmlDeviceGetPowerManagementDefaultLimit"),
            "persistence_mode": self._get(
                "setting:persistence", lambda: bool(nv.nvmlDeviceGetPersistenceMode(h))
            ),
            "sm_clock_max_mhz": clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM", 1),
            "mem_clock_max_mhz": clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM", 2),
            "sm_clock_app_mhz": clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_SM", 1),
            "mem_clock_app_mhz": clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_MEM", 2),
            "temp_slowdown_c": clock(
                "nvmlDeviceGetTemperatureThreshold", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1
            ),
        }

    def close(self) -> None:
        """Shut NVML down (it is reference-counted, so other users in this process are unaffected)."""
        with contextlib.suppress(self._errors):
            self.nv.nvmlShutdown()
