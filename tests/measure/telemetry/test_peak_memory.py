"""True peak memory: the sampler's maximum device memory over the protocol, not one reading after it."""

from __future__ import annotations

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.measure.telemetry.fake import FakeNvml
from deepgap.measure.telemetry.measuring import MeasureTelemetry, max_mem_used
from deepgap.measure.telemetry.nvml import NvmlBackend
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.worker import true_peak

GIB = 1 << 30


def _telemetry(mem_used: list[int]) -> MeasureTelemetry:
    backend = NvmlBackend(FakeNvml({"mem_used": list(mem_used)}), uuid="GPU-0", index=0, own_pids=set())
    return MeasureTelemetry(backend, "", TelemetrySettings(sample_hz=1000.0), batch_size=1)


def test_the_sampled_maximum_is_stored_even_when_memory_drops_before_the_last_reading():
    tel = _telemetry([2 * GIB, 7 * GIB, 3 * GIB])  # a transient workspace, freed before the end
    for _ in range(3):
        tel.sampler.sample_once()
    spec = ConfigSpec(model="tinycnn", engine="eager", precision="fp32", batch_size=1, device="cpu")
    res = Result(spec=spec, status=Status.OK, throughput_pipelined_ips=1.0)
    tel.finish(res)
    assert res.details.telemetry.max_device_mem_used_bytes == 7 * GIB
    assert tel.sampler.samples[-1][1].mem_used_bytes == 3 * GIB  # what a reading after timing would see


def test_max_mem_used_skips_missing_readings_and_true_peak_takes_the_larger_figure():
    tel = _telemetry([GIB])
    tel.sampler.sample_once()
    assert max_mem_used([]) is None and max_mem_used(tel.sampler.samples) == GIB
    assert true_peak(3 * GIB, 5 * GIB) == 5 * GIB and true_peak(6 * GIB, 5 * GIB) == 6 * GIB
    assert true_peak(None, 5 * GIB) == 5 * GIB and true_peak(4, None) == 4 and true_peak(None, None) is None
