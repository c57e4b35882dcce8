"""Backends on scripted hardware: NVML through FakeNvml, RAPL through a temporary sysfs, the fake scenarios."""

import os
from types import SimpleNamespace

import pytest

from deepgap.core.nvml_access import nvml_uuid
from deepgap.measure.telemetry.base import TelemetryUnavailable
from deepgap.measure.telemetry.cpu import CpuBackend
from deepgap.measure.telemetry.fake import FakeBackend, FakeNvml, scenario
from deepgap.measure.telemetry.nvml import NvmlBackend


def test_nvml_reading_and_units():
    nv = FakeNvml({"reasons": 0x4 | 0x40, "pids": [os.getpid(), 777]})
    b = NvmlBackend(nv, uuid="GPU-abc", own_pids={os.getpid()}, clock=lambda: 123.0)
    s = b.read()
    assert s.t_s == 123.0 and s.power_w == 250.0 and s.power_instant_w == 260.0 and s.power_avg_w == 248.0
    assert s.energy_j == 5000.0 and s.temp_c == 61.0 and s.mem_temp_c == 50.0
    assert (s.sm_clock_mhz, s.mem_clock_mhz, s.util_pct, s.mem_util_pct) == (1980.0, 2619.0, 97.0, 45.0)
    assert s.mem_used_bytes == 3 << 30 and s.clocks_event_reasons == 0x44
    assert s.foreign_pids == (777,) and s.foreign_procs == 1  # this process is never foreign
    assert b.has_energy_counter and b.unavailable == {}
    st = b.settings()
    assert (
        st["power_limit_w"] == 700.0 and st["persistence_mode"] is True and st["sm_clock_max_mhz"] == 1980.0
    )
    assert st["uuid"] == "GPU-abc" and st["gpu_name"] == "Fake H100"
    assert not [f for f in nv.calls if "Set" in f or "Reset" in f]  # settings are only read, never changed
    b.close()
    assert nv.inited == 0


def test_nvml_unavailable_paths():
    with pytest.raises(TelemetryUnavailable, match=r"^unavailable: NVML cannot start .*Library Not Found"):
        NvmlBackend(FakeNvml(errors={"nvmlInit": 12}))
    nv = FakeNvml(errors={"nvmlDeviceGetHandleByUUID": 999})
    with pytest.raises(TelemetryUnavailable, match="cannot open GPU GPU-x"):
        NvmlBackend(nv, uuid="GPU-x")
    assert nv.inited == 0  # shut down again
    nv = FakeNvml(
        errors={
            "nvmlDeviceGetTotalEnergyConsumption": 3,
            "nvmlDeviceGetTemperature": 15,
            "field:power_instant_w": 3,
            "nvmlDeviceGetCurrentClocksEventReasons": 4,
        }
    )
    b = NvmlBackend(nv, index=0)
    s = b.read()
    assert (
        s.energy_j is None
        and s.temp_c is None
        and s.power_instant_w is None
        and s.clocks_event_reasons is None
    )
    assert s.power_w == 250.0 and s.power_avg_w == 248.0  # the rest still reads
    assert not b.has_energy_counter and b.read_energy_j() is None
    assert b.unavailable["energy_j"] == "unavailable: NVML error 3: Not Supported"
    assert b.unavailable["temp_c"] == "unavailable: NVML error 15: GPU is lost"
    assert b.unavailable["power_instant_w"].startswith("unavailable: NVML error 3")
    assert b.unavailable["clocks_event_reasons"].endswith("Insufficient Permissions")
    n_energy, n_temp = nv.calls["nvmlDeviceGetTotalEnergyConsumption"], nv.calls["nvmlDeviceGetTemperature"]
    b.read()
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == n_energy  # not supported: never asked again
    assert nv.calls["nvmlDeviceGetTemperature"] == n_temp + 1  # a transient error is retried


def test_nvml_older_bindings_and_pid_namespace():
    nv = FakeNvml({"pids": [10, 11, 12]})
    del FakeNvml.nvmlDeviceGetCurrentClocksEventReasons  # an old nvidia-ml-py: only ...ThrottleReasons
    try:
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x20
        b = NvmlBackend(nv, own_pids={99999})  # our pid is not listed: NVML shows another PID namespace
        s = b.read()
        assert s.clocks_event_reasons == 0x20
        assert (
            s.foreign_pids is None
            and s.foreign_procs == 2
            and "PID namespace" in b.unavailable["foreign_pids"]
        )
    finally:
        FakeNvml.nvmlDeviceGetCurrentClocksEventReasons = _reasons
    s = NvmlBackend(
        FakeNvml({"pids": [10]}), self_on_device=False
    ).read()  # a monitor: every process is other
    assert s.foreign_procs == 1 and s.foreign_pids == (10,)
    assert (
        nvml_uuid("1b2c") == "GPU-1b2c"
        and nvml_uuid("GPU-1b2c") == "GPU-1b2c"
        and nvml_uuid("MIG-x") == "MIG-x"
    )


_reasons = FakeNvml.nvmlDeviceGetCurrentClocksEventReasons


class _Psutil:
    """A deterministic psutil stand-in."""

    def cpu_percent(self, interval=None):
        return 50.0

    def cpu_freq(self):
        return SimpleNamespace(current=2400.0, min=800.0, max=3600.0)

    def sensors_temperatures(self):
        return {
            "coretemp": [
                SimpleNamespace(label="Core 0", current=50.0),
                SimpleNamespace(label="Package id 0", current=55.0),
            ]
        }

    def virtual_memory(self):
        return SimpleNamespace(used=1 << 30)


def _rapl(root, domains):
    for name, (kind, energy_uj, range_uj) in domains.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "name").write_text(kind)
        (d / "energy_uj").write_text(str(energy_uj))
        (d / "max_energy_range_uj").write_text(str(range_uj))


def test_cpu_rapl_wrap_per_package(tmp_path):
    root = tmp_path / "powercap"
    _rapl(
        root,
        {
            "intel-rapl:0": ("package-0", 999_000_000, 1_000_000_000),
            "intel-rapl:1": ("package-1", 5_000_000, 1_000_000_000),
            "intel-rapl:1:0": ("core", 1, 10),  # a sub-domain: inside the package, not added
            "intel-rapl:2": ("psys", 7, 10),
        },
    )  # the platform domain overlaps the packages
    cpu = tmp_path / "cpu"
    (cpu / "cpu0" / "thermal_throttle").mkdir(parents=True)
    (cpu / "cpu0" / "thermal_throttle" / "package_throttle_count").write_text("3")
    b = CpuBackend(str(root), str(cpu), psutil_module=_Psutil(), clock=lambda: 1.0)
    assert b.has_energy_counter and b.energy_counter_range_j is None
    first = b.read()
    assert first.power_w is None and first.energy_j == 0.0 and first.clocks_event_reasons == 0
    assert (first.sm_clock_mhz, first.util_pct, first.temp_c, first.mem_used_bytes) == (
        2400.0,
        50.0,
        55.0,
        1 << 30,
    )
    (root / "intel-rapl:0" / "energy_uj").write_text("2000000")  # wrapped: +3 J
    (root / "intel-rapl:1" / "energy_uj").write_text("6000000")  # +1 J
    (cpu / "cpu0" / "thermal_throttle" / "package_throttle_count").write_text("4")
    s = b.read()
    assert s.energy_j == pytest.approx(4.0) and s.power_w is not None and s.power_w > 0
    assert s.clocks_event_reasons == 0x40  # a new throttle event: hw_thermal_slowdown
    assert b.settings()["rapl_packages"] == 2


def test_cpu_unavailable_paths(tmp_path):
    b = CpuBackend(str(tmp_path / "absent"), str(tmp_path), psutil_module=_Psutil())
    s = b.read()
    assert not b.has_energy_counter and s.energy_j is None and s.power_w is None
    assert b.unavailable["energy_j"].startswith("unavailable: no ")
    assert b.unavailable["clocks_event_reasons"].startswith("unavailable:")
    root = tmp_path / "pc"
    _rapl(root, {"intel-rapl:0": ("package-0", 1, 10)})
    (root / "intel-rapl:0" / "energy_uj").unlink()
    (root / "intel-rapl:0" / "energy_uj").mkdir()  # unreadable as a number (as root, chmod would not stop us)
    b = CpuBackend(str(root), str(tmp_path), psutil_module=_Psutil())
    assert not b.has_energy_counter and b.read().energy_j is None
    assert b.unavailable["energy_j"].startswith("unavailable: cannot read")


def test_fake_backends():
    clock = iter([100.0, 100.0, 101.0, 102.0, 103.0])
    b = scenario("steady", clock=lambda: next(clock))
    assert b.has_energy_counter and b.read().energy_j == pytest.approx(1100.0)
    assert scenario("throttle").read().clocks_event_reasons == 0x24
    assert scenario("foreign").read().foreign_procs == 1
    nop = scenario("nopower")
    assert not nop.has_energy_counter and nop.read().power_w is None and "power_w" in nop.unavailable
    with pytest.raises(TelemetryUnavailable, match="^unavailable: fake backend"):
        scenario("unavailable")
    with pytest.raises(TelemetryUnavailable, match="no fake telemetry scenario"):
        scenario("nope")
    tr = FakeBackend([{"t_s": 1.0, "energy_j": 5.0}, {"t_s": 2.0, "energy_j": 7.0}], fail_after=3)
    assert [tr.read().t_s, tr.read_energy_j(), tr.read().energy_j] == [1.0, 7.0, 7.0]  # holds the last
    with pytest.raises(RuntimeError, match="scripted"):
        tr.read()
