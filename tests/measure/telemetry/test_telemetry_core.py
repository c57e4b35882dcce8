"""Telemetry arithmetic on scripted traces: reasons, counters, aggregation, flags, thermal steady state."""

import pytest

from deepgap.measure.telemetry.aggregate import summarize
from deepgap.measure.telemetry.base import TelemetrySample, TelemetryWindow, counter_delta, decode_reasons
from deepgap.measure.telemetry.flags import contamination_flags, energy_timing_flag
from deepgap.measure.telemetry.sampler import EnergyMark
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.telemetry.thermal import run_thermal, steady_state


def S(t, **kw):  # noqa: N802
    return TelemetrySample(t_s=t, **kw)


def test_decode_reasons():
    assert decode_reasons(None) == [] and decode_reasons(0) == []
    assert decode_reasons(0x1) == ["gpu_idle"]
    assert decode_reasons(0x4 | 0x20 | 0x40) == ["sw_power_cap", "sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert decode_reasons(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert decode_reasons(0x1000) == ["unknown_0x1000"]


def test_counter_delta_wrap_and_reset():
    assert counter_delta(100.0, 350.0, None) == (250.0, "")
    assert counter_delta(900.0, 100.0, 1000.0) == (200.0, "wrap")  # RAPL wraps at max_energy_range
    assert counter_delta(5000.0, 10.0, None) == (None, "reset")  # NVML restarts at 0 on driver reload
    assert counter_delta(None, 10.0, None) == (None, "missing")


def test_sample_dict_round_trip():
    s = S(12.5, power_w=100.0, foreign_pids=(7, 9), clocks_event_reasons=4)
    d = s.to_dict()
    assert d == {"power_w": 100.0, "foreign_pids": [7, 9], "clocks_event_reasons": 4}  # None fields dropped
    assert TelemetrySample.from_dict(12.5, {**d, "window": 1}) == s


def _trace():
    samples = [
        ("warmup", S(5.0, power_w=90.0, temp_c=55.0)),
        (
            "measure",
            S(
                10.5,
                power_w=200.0,
                power_instant_w=205.0,
                temp_c=60.0,
                sm_clock_mhz=1980.0,
                clocks_event_reasons=0,
                util_pct=90.0,
                mem_used_bytes=100,
            ),
        ),
        (
            "measure",
            S(
                11.0,
                power_w=220.0,
                power_instant_w=240.0,
                temp_c=61.0,
                sm_clock_mhz=1980.0,
                clocks_event_reasons=0x20,
                util_pct=100.0,
                mem_used_bytes=300,
            ),
        ),
        ("measure", S(15.0, power_w=120.0, temp_c=61.0, sm_clock_mhz=300.0, clocks_event_reasons=0x1)),
        ("measure", S(20.5, power_w=210.0, temp_c=62.0, sm_clock_mhz=1980.0, clocks_event_reasons=0)),
        ("measure", S(21.0, power_w=230.0, temp_c=63.0, sm_clock_mhz=1965.0, clocks_event_reasons=0)),
    ]
    marks = [
        EnergyMark(10.0, 11.1, 1.1, 0.1, 1000.0, 1220.0, 200),
        EnergyMark(20.0, 21.05, 1.05, 0.05, 2000.0, 2210.0, 200),
    ]
    return samples, marks


def test_aggregation_math():
    samples, marks = _trace()
    w = summarize(samples, marks, backend="fake", throughput_pipelined_ips=200.0, idle_power_w=50.0)
    assert w.energy_source == "counter" and w.energy_windows == 2 and w.images == 400
    assert w.energy_tail_s == pytest.approx(0.15) and w.energy_tail_j == pytest.approx(7.5)
    assert w.energy_j == pytest.approx(430.0 - 7.5)  # counter deltas minus the idle tail
    assert w.energy_window_s == pytest.approx(2.0)
    assert w.joules_per_image == pytest.approx(422.5 / 400)
    assert w.ips_per_watt_energy == pytest.approx(400 / 422.5)
    assert w.power_from_energy_w == pytest.approx(211.25)
    assert w.dynamic_energy_j == pytest.approx(422.5 - 50.0 * 2.0)
    assert w.dynamic_joules_per_image == pytest.approx(322.5 / 400)
    assert w.n_samples == 6 and w.n_window_samples == 4
    assert w.mean_power_w == pytest.approx(215.0) and w.max_power_w == 230.0
    assert w.mean_power_instant_w == pytest.approx(222.5) and w.max_power_instant_w == 240.0
    assert w.mean_power_latency_w == pytest.approx(120.0)  # the latency-pass sample at t=15
    assert w.ips_per_watt == pytest.approx(200.0 / 215.0)  # the paper's formula
    assert (w.max_temp_c, w.temp_start_c, w.temp_end_c) == (63.0, 60.0, 63.0)
    assert w.temp_slope_c_per_min > 0
    assert w.sm_clock_median_mhz == 1980.0 and w.sm_clock_min_mhz == 1965.0  # the idle sample is left out
    assert w.util_mean_pct == pytest.approx(95.0) and w.mem_used_max_bytes == 300
    assert w.throttle_reasons == ["sw_thermal_slowdown"] and w.throttle_fraction == {
        "sw_thermal_slowdown": 0.25
    }
    assert [m["e1_j"] for m in w.marks] == [1220.0, 2210.0]


def test_counter_wrap_and_reset_in_windows():
    samples, _ = _trace()
    marks = [
        EnergyMark(10.0, 11.0, 1.0, 0.0, 900.0, 100.0, 100),  # wrapped at 1000 J: 200 J
        EnergyMark(20.0, 21.0, 1.0, 0.0, 500.0, 800.0, 100),
    ]
    w = summarize(samples, marks, backend="cpu", range_j=1000.0)
    assert w.energy_j == pytest.approx(500.0) and w.energy_counter_notes == ["window 0: wrap"]
    marks[0] = EnergyMark(10.0, 11.0, 1.0, 0.0, 5000.0, 3.0, 100)  # reset: that window is left out
    w = summarize(samples, marks, backend="nvml")
    assert w.energy_j == pytest.approx(300.0) and w.energy_window_s == pytest.approx(1.0)
    assert w.joules_per_image == pytest.approx(3.0) and w.energy_counter_notes == ["window 0: reset"]


def test_power_integration_and_unavailable_energy():
    samples, _ = _trace()
    marks = [EnergyMark(10.0, 11.1, 1.1, 0.1, None, None, 100)]
    w = summarize(samples, marks, backend="x")
    assert w.energy_source == "power-integration" and w.energy_j == pytest.approx(210.0)  # mean 210 W × 1 s
    assert w.energy_counter_notes == []
    bare = [("measure", S(10.5, temp_c=50.0))]
    w = summarize(bare, marks, backend="x", unavailable={"energy_j": "unavailable: RAPL is root-only"})
    assert w.energy_j is None and w.energy_source == "unavailable: RAPL is root-only"
    assert w.joules_per_image is None and w.mean_power_w is None and w.ips_per_watt is None
    assert summarize(bare, [], backend="x").energy_source.startswith("unavailable: no energy window")


def _window(fn, n=10):
    """A 1 s window of n samples; fn(i) gives each sample's extra fields."""
    base = {"power_w": 100.0, "temp_c": 60.0, "sm_clock_mhz": 1500.0}
    samples = [("measure", S(10.0 + 0.1 * i, **{**base, **fn(i)})) for i in range(n)]
    return summarize(samples, [EnergyMark(9.95, 11.0, 1.05, 0.0, 0.0, 105.0, 100)], backend="fake")


def test_flags_on_a_throttling_trace():
    w = _window(lambda i: {"clocks_event_reasons": 0x20 | 0x4 if i >= 5 else 0, "foreign_procs": 0})
    assert contamination_flags(w) == ["thermal-throttle", "power-throttle"]
    w = _window(lambda i: {"clocks_event_reasons": 0x8 | (0x1 if i == 0 else 0)})
    assert contamination_flags(w) == ["hw-slowdown"]
    # benign reasons (idle, application clocks, sync boost) raise nothing; a blip under the share does not either
    assert contamination_flags(_window(lambda i: {"clocks_event_reasons": 0x2 | 0x10})) == []
    w = _window(lambda i: {"clocks_event_reasons": 0x4 if i == 0 else 0}, n=20)
    assert contamination_flags(w) == [] and contamination_flags(
        w, TelemetrySettings(throttle_min_fraction=0.01)
    ) == ["power-throttle"]
    assert contamination_flags(_window(lambda i: {"clocks_event_reasons": 0x400})) == ["throttle:reliability"]


def test_flags_on_a_foreign_process_trace():
    w = _window(lambda i: {"foreign_procs": 2 if i == 3 else 0, "foreign_pids": (41, 42) if i == 3 else ()})
    assert w.foreign_pids == [41, 42] and contamination_flags(w) == ["foreign-procs(2)"]
    assert contamination_flags(_window(lambda i: {"foreign_procs": 0})) == []


def test_flags_clocks_and_temperature():
    w = _window(lambda i: {"sm_clock_mhz": 1000.0 if i < 4 else 1980.0})  # ramping: 40% far below the p90
    assert w.sm_clock_low_fraction == pytest.approx(0.4) and contamination_flags(w) == ["clocks-low"]
    samples = [("measure", S(10.0 + 0.1 * i, sm_clock_mhz=1700.0)) for i in range(10)]
    ref = summarize(samples, [EnergyMark(9.9, 11.0, 1.1, 0.0, 0, 1, 1)], backend="f", ref_sm_clock_mhz=1980.0)
    assert ref.sm_clock_ref_mhz == 1980.0 and contamination_flags(ref) == [
        "clocks-low"
    ]  # below the warm-up's level
    hot = _window(lambda i: {"temp_c": 60.0 + i * 0.5})  # +4.5 °C in 0.9 s
    assert contamination_flags(hot) == ["temp-rising"]
    noisy = _window(lambda i: {"temp_c": 60.0 + (i % 2)})  # whole-degree flicker is not a rise
    assert contamination_flags(noisy) == []


def test_thermal_steady_state_rule():
    rising = [S(float(t), temp_c=40.0 + t) for t in range(30)]  # 60 °C/min
    assert steady_state(rising, 20.0, 1.0)[0] is False and steady_state(rising, 20.0, 1.0)[
        1
    ] == pytest.approx(60.0)
    flat = rising + [S(30.0 + t, temp_c=70.0) for t in range(25)]
    steady, slope = steady_state(flat, 20.0, 1.0)
    assert steady and abs(slope) < 1.0
    assert steady_state(flat[-5:], 20.0, 1.0)[0] is False  # not enough history for the window
    assert steady_state([S(0.0)], 20.0, 1.0) == (False, None)


class _ScriptedRun:
    """A fake clock whose work advances a fake time; temperatures settle after 20 s."""

    def __init__(self):
        self.t = 0.0
        self.samples = [S(0.0, temp_c=40.0, sm_clock_mhz=1900.0, power_w=300.0)]

    def time_iteration(self, step):
        return self.time_window(step, 1)

    def time_window(self, step, n):
        for _ in range(n):
            step()
            self.t += 0.01
        temp = 40.0 + min(self.t, 20.0)
        self.samples.append(S(self.t, temp_c=temp, sm_clock_mhz=1900.0 - temp, power_w=300.0))
        return n * 0.01


def test_run_thermal_until_steady_and_timeout():
    run = _ScriptedRun()
    out = run_thermal(
        lambda: None,
        run,
        lambda: list(run.samples),
        window_s=5.0,
        slope_c_per_min=1.0,
        timeout_s=1000.0,
        mono=lambda: run.t,
    )
    assert out["status"] == "ok" and out["steady"] and out["stopped_by"] == "steady"
    assert 24.0 <= out["duration_s"] <= 27.0 and out["temp_end_c"] == 60.0 and out["temp_start_c"] == 40.0
    assert out["steady_sm_clock_mhz"] == 1840.0 and out["steady_power_w"] == 300.0
    run = _ScriptedRun()
    out = run_thermal(
        lambda: None,
        run,
        lambda: list(run.samples),
        window_s=5.0,
        slope_c_per_min=1.0,
        timeout_s=3.0,
        mono=lambda: run.t,
    )
    assert (
        not out["steady"]
        and out["stopped_by"] == "timeout"
        and out["duration_s"] == pytest.approx(3.0, abs=0.6)
    )
    out = run_thermal(
        lambda: None, run, lambda: [S(0.0, power_w=1.0)], window_s=5.0, slope_c_per_min=1.0, timeout_s=3.0
    )
    assert out["status"].startswith("unavailable: no temperature")


def test_energy_windows_longer_than_their_timed_work_are_flagged():
    """1,000 items at 1,000/s are 1 s of timed work: a 1.1-s energy window is sync overhead, 2 s is untimed work."""
    w = TelemetryWindow("fake", energy_j=700.0, joules_per_image=0.7, energy_window_s=1.1)
    assert energy_timing_flag(w, 1000.0) is None
    w.energy_window_s = 2.0  # a decode window that also held its prefill (session 18)
    assert energy_timing_flag(w, 1000.0) == "energy-untimed-work"
    assert energy_timing_flag(w, None) is None  # no pipelined rate: nothing to compare with


def test_thermal_settings_are_one_test_for_every_request_kind():
    """A forward and a decode worker both ask `TelemetrySettings.thermal` whether a request is the warm-up."""
    assert TelemetrySettings(mode="thermal").thermal
    assert not TelemetrySettings().thermal
    assert not TelemetrySettings(mode="measure").thermal
