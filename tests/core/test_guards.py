"""The guards of issue 34 on synthetic rows: events on another device, per-call vs pipelined, above peak.

Each guard is checked where it acts: the worker turns a device mismatch or a rate above the datasheet's
peak into an error status with its reason (never a number); reading a store flags a measurement whose
per-call and pipelined throughputs disagree, and `recommend` and the report's answer skip it, saying why.
"""

from __future__ import annotations

import pytest
from fixtures_store import build_store

from deepgap.analysis import aggregate, prepare
from deepgap.analysis.recommend import recommend
from deepgap.core import guards
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.measure.configuration import measure
from deepgap.measure.protocol import MeasureRequest
from deepgap.measure.timing import TimingProtocol
from deepgap.measure.worker import WorkerState
from deepgap.store import Store

H100 = "NVIDIA H100 80GB HBM3"
RESNET50_FLOPS = 8.178e9  # models/flops.py at 224² (the stored figure)


@pytest.fixture(scope="module")
def state():
    return WorkerState("cpu")


def _measure(state) -> Result:
    spec = ConfigSpec("tinycnn", "eager", "fp32", 2, "cpu", resolution=32)
    return measure(
        state, MeasureRequest(spec=spec, protocol=TimingProtocol(warmup=0, iterations=3, repeats=1))
    )


def test_device_mismatch_words():
    assert guards.device_mismatch("cuda:1", {"inputs": "cuda:1", "start event": "cuda:1", "x": None}) is None
    assert guards.device_mismatch("cuda", {"inputs": "cuda:1"}, current="cuda:1") is None
    why = guards.device_mismatch(
        "cuda:1", {"inputs": "cuda:1", "start event": "cuda:0", "timing stream": "cuda:0"}
    )
    assert (
        why.startswith("device mismatch")
        and "start event on cuda:0" in why
        and "timing stream on cuda:0" in why
    )
    assert guards.device_mismatch("cuda", {"inputs": "cuda:0"}) is None  # plain cuda with no current: index 0


def test_observed_devices_reads_a_graph_runner_and_a_clock():
    import torch

    from deepgap.measure.graph_runner import GraphRunner
    from deepgap.measure.timing import HostClock

    class Prepared:
        run = GraphRunner(None, torch.zeros(2), None, owns=None)

    class Clock(HostClock):
        def devices(self):
            return {"timing stream": "cuda:0", "start event": None}

    obs = guards.observed_devices(torch.zeros(2), Prepared, HostClock(), "cpu")
    assert obs == {"inputs": "cpu", "captured graph": "cpu"}
    why = guards.device_mismatch("cpu", guards.observed_devices(torch.zeros(2), Prepared, Clock(), "cpu"))
    assert "timing stream on cuda:0" in why and "start event" not in why


def test_events_on_another_device_is_an_error_not_a_number(state, monkeypatch):
    """The worker's guard: a clock whose events sit on another device than the model gives no number."""
    assert (
        _measure(state).status == Status.OK
    )  # the same configuration measures fine when all is on one device
    real = guards.observed_devices

    def fake(x, prepared, clock, kind):  # the bug of issue 34, faked on a CPU: events recorded on cuda:0
        return {**real(x, prepared, clock, kind), "start event": "cuda:0", "end event": "cuda:0"}

    monkeypatch.setattr(guards, "observed_devices", fake)
    res = _measure(state)
    assert res.status == Status.ERROR and res.throughput_ips is None and res.latency is None
    assert "device mismatch" in res.reason and "start event on cuda:0" in res.reason


def test_a_kernel_fault_flagged_after_the_runs_is_an_error_not_a_number(state, monkeypatch):
    """The worker asks the engine's `Prepared.faults` after timing (a split-K wait that gave up): an error."""
    from deepgap.measure.engines.eager import EagerEngine

    real = EagerEngine.prepare

    def flagged(self, model, spec, example):
        prepared = real(self, model, spec, example)
        prepared.faults = lambda: "a split-K wait gave up (49×512 output, split 12)"
        return prepared

    monkeypatch.setattr(EagerEngine, "prepare", flagged)
    res = _measure(state)
    assert res.status == Status.ERROR and res.throughput_ips is None and res.latency is None
    assert res.reason.startswith("a split-K wait gave up")


def test_above_peak_words_and_result():
    why = guards.above_peak(H100, "fp32", RESNET50_FLOPS, 45521)  # issue 34's lane cuda:1
    assert why is not None and "above datasheet peak" in why and "fp32 peak" in why and "372 TFLOP/s" in why
    assert guards.above_peak(H100, "fp32", RESNET50_FLOPS, 3929) is None  # its pipelined figure is possible
    assert guards.above_peak("AMD EPYC 9554", "fp32", RESNET50_FLOPS, 1e9) is None  # no sheet row: no claim
    assert guards.datasheet_peak(H100, "tf32")[1] == "tf32"
    assert guards.datasheet_peak("Tesla T4", "tf32")[1] == "fp32"  # no TF32 on Turing: its fallback's column
    spec = ConfigSpec("resnet50", "eager", "fp32", 256, "cuda")
    ok = Result(
        spec=spec,
        status=Status.OK,
        throughput_ips=3900.0,
        throughput_pipelined_ips=3929.0,
        flops_per_image=RESNET50_FLOPS,
    )
    assert guards.rate_checked(ok, H100) is ok
    bad = Result(
        spec=spec,
        status=Status.OK,
        throughput_ips=45521.0,
        throughput_pipelined_ips=3929.0,
        flops_per_image=RESNET50_FLOPS,
    )
    out = guards.rate_checked(bad, H100)
    assert out.status == Status.ERROR and out.throughput_ips is None and "cannot be true" in out.reason


def test_worker_stores_above_peak_as_error(state, monkeypatch):
    """Wired into the worker: a datasheet peak below the measured rate turns the row into an error."""
    monkeypatch.setattr(guards, "datasheet_peak", lambda name, prec: (1.0, "fp32", "Fake GPU"))
    res = _measure(state)
    assert (
        res.status == Status.ERROR
        and res.reason.startswith("above datasheet peak")
        and res.throughput_ips is None
    )


def test_rate_mismatch_flagged_and_never_recommended(tmp_path):
    assert guards.rate_flag(45521, 3929).startswith("rate-mismatch(per-call 4.552e+04 vs pipelined 3929")
    assert guards.rate_flag(8416, 2919) is not None  # 2.9×: the bs32 row
    assert guards.rate_flag(247.0, 152.9) is None  # 1.62×: the widest gap of the committed H100/H200 stores
    assert guards.rate_flag(None, 100.0) is None
    assert guards.rate_flag(2465, 470, device="cpu") is None  # a busy host's CPU row: noise, not impossible
    path = str(tmp_path / "fx.sqlite")
    build_store(path)
    s = Store(path, readonly=True)
    df = s.results_frame()
    s.close()
    best = df[(df["model"] == "resnet50") & (df["precision"] == "fp16") & (df["batch_size"] == 128)].index
    df.loc[best, "throughput_pipelined_ips"] = df.loc[best, "throughput_ips"] / 11  # per-call 11× pipelined
    frame = prepare(df)
    assert all(any(f.startswith("rate-mismatch") for f in fl) for fl in frame.loc[best, "flags"])
    rec = next(r for r in recommend(aggregate(frame), "throughput") if r.model == "resnet50")
    assert rec.choice["batch_size"] == 32  # fp16 bs128 was the fastest; now skipped
    assert rec.excluded == {guards.RATE_REASON: 1} and "disagree by more than 2x" in guards.RATE_REASON
    from deepgap.report.answer import answers

    agg = aggregate(frame)
    table, sure = answers(agg, frame)
    gpu = table[(table["platform"] == "Fixture GPU A") & (table["model"] == "resnet50")]
    assert not any("bs128" in str(c) for c in gpu["configuration"])
    flags = sure[(sure["platform"] == "Fixture GPU A") & (sure["model"] == "resnet50")]["flags"].iloc[0]
    assert any("rate-mismatch" in f for f in flags)
