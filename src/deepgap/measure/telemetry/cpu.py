"""The host CPU: RAPL package energy where readable, frequency/utilization/temperature via psutil.

Why RAPL through sysfs: ``/sys/class/powercap/intel-rapl:N/energy_uj`` (Intel, and AMD Zen on
recent kernels) is the CPU's own energy counter, updated about every millisecond. Since Linux 5.10
it is readable by root only (a side-channel fix), so on most machines it is "unavailable" and the
CPU backend reports frequency, utilization and temperature only — never a guessed power. Each
package counter wraps at its ``max_energy_range_uj``; the backend unwraps every package separately
and reports one monotonic total since it was opened (so ``energy_counter_range_j`` is None).

Thermal throttling on Intel shows up in ``…/cpuN/thermal_throttle/package_throttle_count``; an
increase between two readings sets the ``hw_thermal_slowdown`` reason bit, as NVML would.
"""

from __future__ import annotations

import glob
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from deepgap.measure.telemetry.base import TelemetrySample, counter_delta

_RAPL_DOMAIN = re.compile(r"^intel-rapl:\d+$")  # packages; sub-domains (core, dram) are inside them
_HW_THERMAL = 0x40
_TEMP_SENSORS = (("coretemp", "Package id 0"), ("k10temp", "Tctl"), ("zenpower", "Tdie"), ("cpu_thermal", ""))


def _read_number(path: str) -> float:
    with open(path) as fh:
        return float(fh.read().strip())


class CpuBackend:
    """Telemetry of the host CPU package(s)."""

    name = "cpu"
    energy_counter_range_j: float | None = None  # unwrapped per package inside the backend

    def __init__(
        self,
        powercap_root: str = "/sys/class/powercap",
        cpu_root: str = "/sys/devices/system/cpu",
        psutil_module: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Find the RAPL packages and psutil.

        Args:
            powercap_root: the powercap sysfs folder (a temporary folder in tests).
            cpu_root: the cpu sysfs folder (thermal-throttle counters).
            psutil_module: psutil or a stand-in; imported when None.
            clock: epoch-seconds clock for sample times.
        """
        self.clock = clock
        self.unavailable: dict[str, str] = {}
        self._lock = threading.Lock()
        self._domains: list[tuple[str, float | None]] = []  # (energy_uj path, wrap range in J)
        self._last_raw: dict[str, float] = {}
        self._total_j = 0.0
        self._prev: tuple[float, float] | None = None  # (monotonic s, total J) at the previous read()
        self._throttle_paths = sorted(
            glob.glob(os.path.join(cpu_root, "cpu*", "thermal_throttle", "package_throttle_count"))
        )
        self._throttle_prev: float | None = None
        self._find_rapl(powercap_root)
        self.has_energy_counter = bool(self._domains) and self.read_energy_j() is not None
        if psutil_module is None:
            try:
                import psutil as psutil_module
            except ImportError:
                psutil_module = None
                for m in ("sm_clock_mhz", "util_pct", "temp_c", "mem_used_bytes"):
                    self.unavailable[m] = "unavailable: psutil is not installed"
        self.ps = psutil_module
        if self.ps is not None:
            self.ps.cpu_percent(interval=None)  # the first call only primes the counter
        self.unavailable.setdefault("foreign_pids", "unavailable: other processes are not tracked on a CPU")

    def _find_rapl(self, root: str) -> None:
        if not os.path.isdir(root):
            self.unavailable["energy_j"] = f"unavailable: no {root} (no RAPL powercap driver here)"
            return
        for d in sorted(os.listdir(root)):
            path = os.path.join(root, d)
            if not _RAPL_DOMAIN.match(d):
                continue
            try:
                with open(os.path.join(path, "name")) as fh:
                    if fh.read().strip() == "psys":  # the platform domain overlaps the packages
                        continue
            except OSError:
                pass
            try:
                rng: float | None = _read_number(os.path.join(path, "max_energy_range_uj")) * 1e-6
            except (OSError, ValueError):
                rng = None
            self._domains.append((os.path.join(path, "energy_uj"), rng))
        if not self._domains:
            self.unavailable["energy_j"] = f"unavailable: no RAPL package domain under {root}"

    def read_energy_j(self) -> float | None:
        """Joules used by the CPU packages since this backend opened (wraps corrected), or None."""
        with self._lock:
            raws = {}
            for path, _ in self._domains:
                try:
                    raws[path] = _read_number(path) * 1e-6
                except PermissionError:
                    self.unavailable["energy_j"] = (
                        f"unavailable: {path} is not readable (RAPL is root-only since Linux 5.10)"
                    )
                    return None
                except (OSError, ValueError) as exc:
                    self.unavailable["energy_j"] = f"unavailable: cannot read {path} ({exc})"
                    return None
            if not raws:
                return None
            for path, rng in self._domains:
                if path in self._last_raw:
                    d, _ = counter_delta(self._last_raw[path], raws[path], rng)
                    self._total_j += d or 0.0
                self._last_raw[path] = raws[path]
            return self._total_j

    def _temperature(self) -> float | None:
        fn = getattr(self.ps, "sensors_temperatures", None)
        temps = fn() if fn else {}
        if not temps:
            self.unavailable["temp_c"] = "unavailable: no CPU temperature sensor visible to psutil"
            return None
        for chip, label in _TEMP_SENSORS:
            for entry in temps.get(chip, []):
                if not label or entry.label == label:
                    return float(entry.current)
        first = next(iter(temps.values()), [])
        return float(first[0].current) if first else None

    def _throttle_reasons(self) -> int | None:
        if not self._throttle_paths:
            self.unavailable["clocks_event_reasons"] = "unavailable: no thermal_throttle counters in sysfs"
            return None
        try:
            total = sum(_read_number(p) for p in self._throttle_paths)
        except (OSError, ValueError) as exc:
            self.unavailable["clocks_event_reasons"] = f"unavailable: {exc}"
            return None
        prev, self._throttle_prev = self._throttle_prev, total
        return _HW_THERMAL if prev is not None and total > prev else 0

    def read(self) -> TelemetrySample:
        """Every sensor now; RAPL power is the average since the previous `read`."""
        t = self.clock()
        mono = time.monotonic()
        energy = self.read_energy_j() if self._domains else None
        power = None
        if energy is not None:
            if self._prev is not None and mono > self._prev[0]:
                power = (energy - self._prev[1]) / (mono - self._prev[0])
            self._prev = (mono, energy)
        freq = util = temp = used = None
        if self.ps is not None:
            f = self.ps.cpu_freq()
            if f is None or not f.current:
                self.unavailable["sm_clock_mhz"] = "unavailable: psutil reports no CPU frequency"
            else:
                freq = float(f.current)
            util = float(self.ps.cpu_percent(interval=None))
            temp = self._temperature()
            used = int(self.ps.virtual_memory().used)
        return TelemetrySample(
            t_s=t,
            power_w=power,
            energy_j=energy,
            temp_c=temp,
            sm_clock_mhz=freq,
            util_pct=util,
            mem_used_bytes=used,
            clocks_event_reasons=self._throttle_reasons(),
        )

    def settings(self) -> dict[str, Any]:
        """Read-only: CPU model, logical cores, frequency limits, RAPL packages found."""
        from deepgap.core.envinfo import cpu_model

        out: dict[str, Any] = {
            "cpu_name": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "rapl_packages": len(self._domains),
        }
        if self.ps is not None:
            f = self.ps.cpu_freq()
            if f is not None:
                out.update(cpu_freq_min_mhz=f.min or None, cpu_freq_max_mhz=f.max or None)
        return out

    def close(self) -> None:
        """Nothing to release."""
