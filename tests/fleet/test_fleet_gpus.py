"""Each lane's events, streams, graph and model on the same physical GPU (issue 34; two or more GPUs).

Skipped unless CUDA sees two or more GPUs. Run on a multi-GPU device machine with
``python -m pytest -q tests/fleet/test_fleet_gpus.py -rA``. Two checks:

- in this process, with ``cuda:0`` current, a clock and a graph capture for the last GPU put their events,
  stream and graph there, and the time they measure is that GPU's work (events on an idle ``cuda:0``
  timed ~0 ms: issue 34's 45,521 img/s);
- one real worker per lane (as ``--devices all`` starts them): its fingerprint's GPU UUID is the lane's
  physical GPU (what NVML telemetry reads), and a CUDA-graph measurement passes the worker's device guard.
"""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two or more CUDA GPUs"
    ),
]


def test_clock_and_capture_name_their_device_while_another_is_current():
    from deepgap.measure import graph_runner
    from deepgap.measure.device import CudaEventClock

    last = f"cuda:{torch.cuda.device_count() - 1}"
    torch.cuda.set_device(0)
    a = torch.randn(4096, 4096, device=last)
    clock = CudaEventClock(last)

    def step():
        return a @ a

    step()
    torch.cuda.synchronize(last)
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize(last)
    host_s = (time.perf_counter() - t0) / 10
    event_s = clock.time_window(step, 10) / 10
    assert set(clock.devices().values()) == {last} and torch.cuda.current_device() == 0
    assert event_s > 0.5 * host_s, (event_s, host_s)  # events on an idle GPU would read ~0
    graph, out = graph_runner.capture(lambda x: x @ x, a, last)
    runner = graph_runner.GraphRunner(graph, a, out, owns=None)
    assert str(runner.capture_device) == last and torch.allclose(runner(a), a @ a, rtol=1e-2, atol=1e-1)
    assert torch.cuda.current_device() == 0


def test_each_lane_worker_measures_on_its_own_physical_gpu():
    from deepgap.core.nvml_access import nvml_uuid
    from deepgap.core.records import ConfigSpec, Status
    from deepgap.drive.handle import WorkerHandle
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.timing import TimingProtocol

    uuids = []
    for i in range(torch.cuda.device_count()):
        lane = f"cuda:{i}"
        w = WorkerHandle(lane)
        try:
            w.start()
            env = w.call("env", None, 300)
            want = nvml_uuid(str(torch.cuda.get_device_properties(i).uuid))
            assert env.get("gpu_uuid") in (want, None) or str(env.get("gpu_uuid")).startswith("unavailable")
            uuids.append(want)
            for engine, precision in (("cudagraph", "fp16"), ("eager", "fp32")):
                spec = ConfigSpec("resnet18", engine, precision, 8, lane)
                res = w.call(
                    "measure",
                    MeasureRequest(spec=spec, protocol=TimingProtocol(warmup=3, iterations=20, repeats=2)),
                    600,
                )
                assert res.status == Status.OK, res.reason  # the device guard passed: all on `lane`
                ratio = res.throughput_ips / res.throughput_pipelined_ips
                assert 0.5 < ratio < 2.0, ratio
        finally:
            w.stop()
    assert len(set(uuids)) == len(uuids)  # one physical GPU per lane
