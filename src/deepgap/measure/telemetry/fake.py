"""Deterministic stand-ins for hardware telemetry, shipped with the package (as Zeus ships a replay).

- `FakeBackend`: a `Backend` whose readings come from a scripted trace (a list consumed one reading
  per call) or from a function of elapsed time. `scenario` builds the named traces the end-to-end
  tests select with ``options={"telemetry_backend": "fake:<scenario>"}``: ``steady``, ``throttle``
  (thermal + power-cap reasons, low clocks), ``foreign`` (another process on the GPU), ``heating``
  (temperature settling within ~2 s), ``nopower`` (no power or energy readings) and
  ``unavailable`` (the backend cannot be opened).
- `FakeNvml`: an object with the NVML functions `deepgap.measure.telemetry.nvml.NvmlBackend` calls, scripted
  values (a list is consumed one value per call) and injected NVML error codes, so the NVML
  decoding and its "unavailable" paths are tested without a GPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from deepgap.measure.telemetry.base import TelemetrySample, TelemetryUnavailable


class FakeBackend:
    """A scripted `Backend`."""

    def __init__(
        self,
        trace: Sequence[dict[str, Any]] | Callable[[float], dict[str, Any]],
        *,
        energy_counter_range_j: float | None = None,
        fail_after: int | None = None,
        settings: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        unavailable: dict[str, str] | None = None,
    ) -> None:
        """Build it.

        Args:
            trace: a list of readings (dicts of `TelemetrySample` fields, optionally with ``t_s``),
                consumed one per `read`/`read_energy_j` call and holding the last; or a function
                of the seconds since the backend opened returning such a dict.
            energy_counter_range_j: the counter's wrap modulus, if it wraps.
            fail_after: raise RuntimeError on the call after this many (tests the sampler's error path).
            settings: what `settings` returns.
            clock: epoch-seconds clock (sample times, and the elapsed time a function trace sees).
            unavailable: metric → reason, as a real backend would report.
        """
        self.trace = trace
        self.energy_counter_range_j = energy_counter_range_j
        self.fail_after = fail_after
        self._settings = dict(settings or {"gpu_name": "FakeGPU", "uuid": "GPU-fake", "power_limit_w": 300.0})
        self.clock = clock
        self.t_open = clock()
        self.calls = 0
        self.closed = False
        self.unavailable = dict(unavailable or {})
        self.has_energy_counter = self._peek().get("energy_j") is not None

    name = "fake"

    def _peek(self) -> dict[str, Any]:
        if callable(self.trace):
            return dict(self.trace(self.clock() - self.t_open))
        return dict(self.trace[0]) if self.trace else {}

    def _next(self) -> dict[str, Any]:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("scripted telemetry failure")
        if callable(self.trace):
            return dict(self.trace(self.clock() - self.t_open))
        return dict(self.trace[min(self.calls - 1, len(self.trace) - 1)])

    def read(self) -> TelemetrySample:
        """The next scripted reading."""
        d = self._next()
        t = d.pop("t_s", None)
        return TelemetrySample.from_dict(self.clock() if t is None else t, d)

    def read_energy_j(self) -> float | None:
        """The next scripted reading's energy counter."""
        v = self._next().get("energy_j")
        return None if v is None else float(v)

    def settings(self) -> dict[str, Any]:
        """The scripted settings."""
        return dict(self._settings)

    def close(self) -> None:
        """Mark closed."""
        self.closed = True


def _steady(t: float) -> dict[str, Any]:
    return {
        "power_w": 100.0,
        "power_instant_w": 100.0,
        "energy_j": 1000.0 + 100.0 * t,
        "temp_c": 60.0,
        "mem_temp_c": 55.0,
        "sm_clock_mhz": 1500.0,
        "mem_clock_mhz": 1200.0,
        "util_pct": 95.0,
        "mem_util_pct": 40.0,
        "mem_used_bytes": 2 << 30,
        "clocks_event_reasons": 0,
        "foreign_pids": (),
        "foreign_procs": 0,
    }


SCENARIOS: dict[str, Callable[[float], dict[str, Any]]] = {
    "steady": _steady,
    "throttle": lambda t: {**_steady(t), "clocks_event_reasons": 0x20 | 0x4, "sm_clock_mhz": 1100.0},
    "foreign": lambda t: {**_steady(t), "foreign_pids": (4242,), "foreign_procs": 1},
    "heating": lambda t: {**_steady(t), "temp_c": round(60.0 - 20.0 * math.exp(-t / 0.3), 1)},
    "nopower": lambda t: {k: v for k, v in _steady(t).items() if not k.startswith(("power", "energy"))},
}


def backend_names() -> list[str]:
    """Every telemetry backend a run may name: ``auto`` and ``fake:<scenario>`` (the option's and the opener's list).

    ``fake:unavailable`` plays a backend that cannot open (`scenario`).
    """
    return ["auto", *(f"fake:{s}" for s in (*SCENARIOS, "unavailable"))]


def scenario(name: str, clock: Callable[[], float] = time.time) -> FakeBackend:
    """A fake backend playing a named scenario (see the module docstring).

    Raises:
        TelemetryUnavailable: for ``unavailable`` and unknown names.
    """
    if name == "unavailable":
        raise TelemetryUnavailable("fake backend scripted as unavailable")
    if name not in SCENARIOS:
        raise TelemetryUnavailable(f"no fake telemetry scenario {name!r} (known: {', '.join(SCENARIOS)})")
    unavailable = (
        {"power_w": "unavailable: scripted", "energy_j": "unavailable: scripted"} if name == "nopower" else {}
    )
    return FakeBackend(SCENARIOS[name], clock=clock, unavailable=unavailable)


class FakeNvmlError(Exception):
    """Stands for ``pynvml.NVMLError``: carries the NVML return code in ``value``."""

    _names = {
        3: "Not Supported",
        4: "Insufficient Permissions",
        9: "Driver Not Loaded",
        12: "NVML Shared Library Not Found",
        15: "GPU is lost",
        999: "Unknown Error",
    }

    def __init__(self, value: int) -> None:
        super().__init__(self._names.get(value, f"error {value}"))
        self.value = value


class FakeNvml:
    """The subset of ``pynvml`` deepgap uses, with scripted values and errors.

    ``values`` keys: power_mw, instant_mw, average_mw, mem_temp_c, energy_mj, temp_c, sm_mhz, mem_mhz,
    util_gpu, util_mem, mem_used, reasons, pids, and settings (limit_mw, default_limit_mw,
    persistence, max_sm_mhz, max_mem_mhz, app_sm_mhz, app_mem_mhz, slowdown_c). A list value is
    consumed one element per call (holding the last). ``errors`` maps an NVML function name (or a
    field name ``field:power_instant_w``) to the NVML error code it returns.
    """

    NVMLError = FakeNvmlError
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1

    def __init__(self, values: dict[str, Any] | None = None, errors: dict[str, int] | None = None) -> None:
        self.values = {
            "power_mw": 250_000,
            "instant_mw": 260_000,
            "average_mw": 248_000,
            "mem_temp_c": 50,
            "energy_mj": 5_000_000,
            "temp_c": 61,
            "sm_mhz": 1980,
            "mem_mhz": 2619,
            "util_gpu": 97,
            "util_mem": 45,
            "mem_used": 3 << 30,
            "reasons": 0,
            "pids": [],
            "limit_mw": 700_000,
            "default_limit_mw": 700_000,
            "persistence": 1,
            "max_sm_mhz": 1980,
            "max_mem_mhz": 2619,
            "app_sm_mhz": 1755,
            "app_mem_mhz": 2619,
            "slowdown_c": 90,
            **(values or {}),
        }
        self.errors = dict(errors or {})
        self.calls: dict[str, int] = {}
        self.inited = 0

    def _v(self, fn: str, key: str) -> Any:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if fn in self.errors:
            raise FakeNvmlError(self.errors[fn])
        v = self.values[key]
        if isinstance(v, list) and key != "pids":
            return v.pop(0) if len(v) > 1 else v[0]
        return v

    def nvmlInit(self) -> None:  # noqa: N802, D102
        self._v("nvmlInit", "persistence")
        self.inited += 1

    def nvmlShutdown(self) -> None:  # noqa: N802, D102
        self.inited -= 1

    def nvmlErrorString(self, code: int) -> str:  # noqa: N802, D102
        return FakeNvmlError._names.get(code, f"error {code}")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802, D102
        self._v("nvmlDeviceGetHandleByUUID", "persistence")
        return f"handle:{uuid}"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802, D102
        self._v("nvmlDeviceGetHandleByIndex", "persistence")
        return f"handle:{index}"

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetPowerUsage", "power_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetTotalEnergyConsumption", "energy_mj")

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[Any]:  # noqa: N802, D102
        self._v("nvmlDeviceGetFieldValues", "persistence")
        names = {
            186: ("power_instant_w", "instant_mw"),
            185: ("power_avg_w", "average_mw"),
            82: ("mem_temp_c", "mem_temp_c"),
        }
        out = []
        for i in ids:
            name, key = names[i]
            ret = self.errors.get(f"field:{name}", 0)
            out.append(
                SimpleNamespace(
                    fieldId=i,
                    nvmlReturn=ret,
                    valueType=1,
                    value=SimpleNamespace(uiVal=0 if ret else self._v(f"field:{name}", key)),
                )
            )
        return out

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetTemperature", "temp_c")

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetClockInfo", "sm_mhz" if kind == 1 else "mem_mhz")

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:  # noqa: N802, D102
        return SimpleNamespace(
            gpu=self._v("nvmlDeviceGetUtilizationRates", "util_gpu"), memory=self.values["util_mem"]
        )

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:  # noqa: N802, D102
        return SimpleNamespace(used=self._v("nvmlDeviceGetMemoryInfo", "mem_used"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetCurrentClocksEventReasons", "reasons")

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:  # noqa: N802, D102
        return [
            SimpleNamespace(pid=p, usedGpuMemory=1 << 20)
            for p in self._v("nvmlDeviceGetComputeRunningProcesses", "pids")
        ]

    def nvmlDeviceGetName(self, h: Any) -> str:  # noqa: N802, D102
        return "Fake H100"

    def nvmlDeviceGetUUID(self, h: Any) -> str:  # noqa: N802, D102
        return "GPU-fake"

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802, D102
        return "999.99"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetEnforcedPowerLimit", "limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetPowerManagementDefaultLimit", "default_limit_mw")

    def nvmlDeviceGetPersistenceMode(self, h: Any) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetPersistenceMode", "persistence")

    def nvmlDeviceGetMaxClockInfo(self, h: Any, kind: int) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetMaxClockInfo", "max_sm_mhz" if kind == 1 else "max_mem_mhz")

    def nvmlDeviceGetApplicationsClock(self, h: Any, kind: int) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetApplicationsClock", "app_sm_mhz" if kind == 1 else "app_mem_mhz")

    def nvmlDeviceGetTemperatureThreshold(self, h: Any, kind: int) -> int:  # noqa: N802, D102
        return self._v("nvmlDeviceGetTemperatureThreshold", "slowdown_c")
