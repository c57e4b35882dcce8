"""The sampler thread, energy windows, and the worker-side glue, in this process on scripted telemetry."""

import time

import pytest

from deepgap.core.records import ConfigSpec, Status
from deepgap.measure.telemetry.fake import FakeBackend, scenario
from deepgap.measure.telemetry.measuring import MeasureTelemetry, measure_idle
from deepgap.measure.telemetry.sampler import MarkingClock, Sampler
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.timing import HostClock, TimingProtocol, run_protocol


def test_sampler_start_stop_and_phases():
    sm = Sampler(scenario("steady"), hz=200.0, low_hz=200.0, phase="warmup")
    with sm:
        time.sleep(0.05)
        sm.phase = "measure"
        time.sleep(0.05)
    n = len(sm.samples)
    assert n >= 4 and sm.error is None
    assert {p for p, _ in sm.samples} == {"warmup", "measure"}
    ts = [s.t_s for _, s in sm.samples]
    assert ts == sorted(ts)
    time.sleep(0.03)
    assert len(sm.samples) == n  # stopped: no more samples
    with pytest.raises(ValueError):
        Sampler(scenario("steady"), hz=0)


def test_sampler_survives_a_failing_backend():
    sm = Sampler(FakeBackend([{"power_w": 1.0, "energy_j": 1.0}], fail_after=3), hz=500.0, low_hz=500.0)
    with sm:
        time.sleep(0.05)
    assert len(sm.samples) == 3
    assert sm.error == "unavailable: telemetry read failed (RuntimeError: scripted telemetry failure)"
    sm.begin_window()  # energy reads fail too: recorded, not raised
    sm.end_window(4)
    assert sm.marks[0].e0_j is None and sm.marks[0].images == 4


def test_energy_window_waits_for_a_counter_tick():
    # the counter reads 10, 10, 10, 12 (a tick) at the start and 20, 20, 25 at the end
    trace = [{"energy_j": e} for e in (10, 10, 10, 12, 20, 20, 20, 25)]
    t = [0.0]

    def sleep(dt):
        t[0] += dt

    sm = Sampler(FakeBackend(trace), hz=10.0, align_timeout_s=0.25, mono=lambda: t[0], sleep=sleep)
    sm.sample_once = lambda: None  # no sensor samples in this test: only the counter
    sm.begin_window()
    t[0] += 1.0  # the window
    sm.end_window(images=32)
    (m,) = sm.marks
    assert (m.e0_j, m.e1_j, m.images) == (12.0, 25.0, 32)  # fresh readings on both edges
    assert m.tail_s == pytest.approx(0.003) and m.duration_s == pytest.approx(1.003)  # 1 ms polls
    sm2 = Sampler(
        FakeBackend([{"energy_j": 5.0}]), hz=10.0, align_timeout_s=0.01, mono=lambda: t[0], sleep=sleep
    )
    sm2.begin_window()
    sm2.end_window(1)
    assert sm2.marks[0].e1_j == 5.0  # a counter that does not move: the timeout, not a hang


def test_marking_clock_phases_and_windows():
    sm = Sampler(scenario("steady"), hz=50.0, phase="warmup", align_timeout_s=0.0)
    clock = MarkingClock(HostClock(), sm, batch_size=4)
    protocol = TimingProtocol(warmup=2, iterations=3, repeats=2)
    with sm:
        out = run_protocol(lambda: time.sleep(0.001), clock, protocol)
    assert len(sm.marks) == 2 == len(out.windows)
    assert [m.images for m in sm.marks] == [n * 4 for n, _ in out.windows]
    assert sm.samples[0][0] == "warmup" and sm.samples[-1][0] == "measure"
    assert all(m.e1_j > m.e0_j for m in sm.marks)


def _result(spec):
    from deepgap.core.records import Result

    return Result(spec=spec, status=Status.OK, throughput_pipelined_ips=1000.0)


SPEC = ConfigSpec("tinycnn", "eager", "fp32", 4, "cpu", resolution=32, threads=1)


def test_measure_telemetry_plan_flags_and_samples():
    cache = {}
    s = TelemetrySettings(backend="fake:throttle", sample_hz=100.0, energy_window_s=0.05, idle_power_w=50.0)
    tel = MeasureTelemetry.for_request(cache, "cpu", s, 4)
    protocol = tel.protocol(TimingProtocol(warmup=1, iterations=2, repeats=2, min_time_s=0.0))
    assert protocol.min_time_s == 0.05 and tel.extended  # an energy counter: windows last ≥ energy_window_s
    with tel:
        run_protocol(lambda: time.sleep(0.002), tel.clock(HostClock()), protocol)
    res = _result(SPEC)
    tel.finish(res)
    t = res.details.telemetry.to_json()
    assert t["status"] == "ok" and t["backend"] == "fake" and t["energy_source"] == "counter"
    assert t["window_extended"] and t["energy_window_min_s"] == 0.05 and t["idle_power_w"] == 50.0
    assert t["mean_power_w"] == 100.0 and t["ips_per_watt"] == pytest.approx(10.0)
    assert t["energy_window_s"] > 0.05 and t["joules_per_image"] > 0
    assert t["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert res.details.flags == ["thermal-throttle", "power-throttle"]
    assert res.telemetry and {p for p, _, _ in res.telemetry} <= {"warmup", "measure"}
    assert any(d["window"] == 1 for _, _, d in res.telemetry) and "sm_clock_mhz" in res.telemetry[0][2]
    # the backend is opened once per worker
    assert MeasureTelemetry.for_request(cache, "cpu", s, 4).backend is tel.backend


def test_measure_telemetry_unavailable_and_off():
    s = TelemetrySettings(backend="fake:unavailable")
    tel = MeasureTelemetry.for_request({}, "cpu", s, 1)
    protocol = TimingProtocol(min_time_s=0.0)
    assert tel.protocol(protocol) is protocol and not tel.extended
    with tel:
        pass
    res = _result(SPEC)
    tel.finish(res)
    assert res.details.telemetry.status == "unavailable: fake backend scripted as unavailable"
    assert res.details.flags is None and res.telemetry == []
    assert MeasureTelemetry.for_request({}, "cpu", None, 1) is None
    bad = MeasureTelemetry.for_request({}, "cpu", TelemetrySettings(backend="nvidia-smi"), 1)
    assert bad.backend is None and bad.reason.startswith("unavailable: unknown telemetry backend")


def test_idle_baseline():
    out = measure_idle({}, "cpu", TelemetrySettings(backend="fake:steady", idle_s=0.1, sample_hz=100.0))
    sm = out["summary"]
    assert sm["status"] == "ok" and sm["idle_power_source"] == "counter"
    assert sm["idle_power_w"] == pytest.approx(100.0, rel=0.05) and sm["idle_power_sampled_w"] == 100.0
    assert out["samples"] and {p for p, _, _ in out["samples"]} == {"idle"}
    nop = measure_idle({}, "cpu", TelemetrySettings(backend="fake:nopower", idle_s=5.0))
    assert (
        nop["summary"]["status"].startswith("unavailable: no power or energy reading") and not nop["samples"]
    )
    gone = measure_idle({}, "cpu", TelemetrySettings(backend="fake:unavailable"))
    assert gone["summary"]["status"].startswith("unavailable:")


def test_worker_measure_in_process():
    """The real worker code path (no spawn): telemetry on with a throttling trace, and off."""
    from deepgap.measure.configuration import measure
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.worker import WorkerState

    state = WorkerState("cpu")
    protocol = TimingProtocol(warmup=1, iterations=3, repeats=2)
    s = TelemetrySettings(backend="fake:foreign", sample_hz=50.0, energy_window_s=0.05)
    res = measure(state, MeasureRequest(spec=SPEC, protocol=protocol, telemetry=s))
    assert res.status == Status.OK, res.reason
    # energy-untimed-work compares the energy windows' host seconds with the timer's; windows of a few ms on
    # a loaded CI host can pass its 1.25x slack (a clean clone failed so, session 22), so it is left out
    # here and tested on injected values (tests/measure/telemetry/test_telemetry_core.py)
    flags = [f for f in res.details.flags or [] if f != "energy-untimed-work"]
    assert flags == ["foreign-procs(1)"] and res.details.telemetry.foreign_pids == [4242]
    assert all(w.iterations > 3 for w in res.details.windows)  # extended for the energy counter
    off = measure(state, MeasureRequest(spec=SPEC, protocol=protocol))
    assert off.status == Status.OK and off.details.telemetry is None and off.telemetry == []
    import dataclasses

    th = measure(
        state,
        MeasureRequest(
            spec=SPEC,
            protocol=protocol,
            telemetry=dataclasses.replace(
                s, backend="fake:heating", mode="thermal", thermal_window_s=0.3, thermal_timeout_s=5.0
            ),
        ),
    )
    assert th.status == Status.OK and th.latency is None
    assert th.details.thermal["status"] == "ok" and th.details.thermal["stopped_by"] == "steady"
    assert {p for p, _, _ in th.telemetry} == {"thermal"}


def test_thermal_warmup_computes_no_reference_and_no_facts(monkeypatch):
    """The warm-up stores no figure: no FLOP count, fingerprint or fp32 logits (minutes for serve's 8B decoder)."""
    from fixtures_thermal import THERMAL, refuse

    from deepgap.measure.configuration import measure
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.worker import WorkerState

    state = WorkerState("cpu")
    refuse(monkeypatch, state, "model_facts", "reference")
    th = measure(
        state, MeasureRequest(spec=SPEC, protocol=TimingProtocol(warmup=1, iterations=3), telemetry=THERMAL)
    )
    assert th.status == Status.OK, th.reason
    assert th.details.thermal["stopped_by"] == "steady" and {p for p, _, _ in th.telemetry} == {"thermal"}
