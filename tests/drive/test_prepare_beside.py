"""The host CPU's ONNX Runtime artifacts built beside the prelude (`deepgap.drive.prepare`).

The default GPU run spent 51 of its 612 s exporting and quantizing the three ResNets for the host-CPU part,
after the GPU part (results/h200/session14). These tests hold what makes the overlap safe: one build per
artifact, a request identical to the measurement's (so the cache key matches), every build finished
before the first step, killed when the prelude is interrupted, and a build that fails changing nothing.
That the worker's `prepare` request finds the very cache keys a measurement wrote is checked where
tinycnn is exported anyway (tests/measure/engines/test_engines.py::test_cpu_engines_run_tinycnn_at_two_batch_sizes).
"""

from __future__ import annotations

import re
import threading

import pytest

from deepgap.core.records import ConfigSpec
from deepgap.drive import loop
from deepgap.drive.config import SweepSpec
from deepgap.drive.inprocess import InProcessWorker
from deepgap.drive.prepare import artifact_configs, build_threads, prepare_beside
from deepgap.drive.presets import cpu_baseline_spec
from deepgap.drive.runner import SweepRunner


def _cfg(model: str, engine: str = "onnxruntime", precision: str = "int8", bs: int = 1) -> ConfigSpec:
    return ConfigSpec(model, engine, precision, bs, "cpu", threads=16)


def test_one_build_per_artifact_and_none_for_engines_without_a_cache():
    host = [
        _cfg("resnet18", bs=1),
        _cfg("resnet18", bs=8),
        _cfg("resnet50"),
        _cfg("resnet50", "eager", "fp32"),
    ]
    assert [(c.model, c.batch_size) for c in artifact_configs(host)] == [("resnet18", 1), ("resnet50", 1)]
    assert prepare_beside([_cfg("resnet50", "eager", "fp32")], make_runner=pytest.fail) is None


class _FakeRunner:
    """A runner whose `call` records the request, or raises, or blocks until released."""

    def __init__(self, calls, fail=(), gate=None):
        self.spec = cpu_baseline_spec(SweepSpec(device="cuda"), 16)
        self.calls, self.fail, self.gate, self.closed = calls, fail, gate, False

    def request(self, cfg):
        return SweepRunner(self.spec, "cpu", worker=InProcessWorker()).request(cfg)

    def call(self, kind, req, timeout_s):
        if self.gate is not None:
            self.gate.wait(5)
        if req.spec.model in self.fail:
            raise RuntimeError("export broke")
        self.calls.append((kind, req.spec.model, req.spec.threads))
        return {"onnx_cache": "miss", "export_s": 1.5, "quantize_s": 2.5}

    def close(self, wait=True):
        self.closed = True


def test_builds_spread_over_a_process_per_four_cores_and_finish_logs_failures():
    calls, runners, logs = [], [], []

    def make():
        runners.append(_FakeRunner(calls, fail=("resnet50",)))
        return runners[-1]

    host = [_cfg(m) for m in ("resnet18", "resnet50", "resnet101")]
    bg = prepare_beside(host, make, logs.append, cores=8)
    bg.finish()
    assert len(runners) == 2 and all(r.closed for r in runners)  # 8 cores: two build processes
    assert sorted(calls) == [("prepare", "resnet101", 4), ("prepare", "resnet18", 4)]  # 4 threads each
    assert "2 artifact build(s) (onnxruntime, 4 threads each)" in logs[-1]
    assert re.search(r"resnet18 \d+\.\d s \(export 1\.5, quantize 2\.5\)", logs[-1])  # each build's seconds
    assert "failed for resnet50: measured as before" in logs[-1]


def test_the_builds_share_the_cores_and_never_oversubscribe_them():
    assert [build_threads(16, n) for n in (1, 3, 4)] == [16, 5, 4]
    assert build_threads(2, 3) == 1 and build_threads(0, 0) == 1


def test_a_build_past_its_time_is_killed_and_measured_as_before():
    gate, logs, runners = threading.Event(), [], []

    def make():
        runners.append(_FakeRunner([], gate=gate))
        return runners[-1]

    bg = prepare_beside([_cfg("resnet18")], make, logs.append, timeout_s=0.0, cores=4)
    bg.finish()
    gate.set()
    assert runners[0].closed and "not done in 0 s: measured as before" in logs[-1]


class _Session:
    def __init__(self, order, fail=False):
        self.order, self.fail = order, fail

    def prelude(self, launcher, sweep, warmup, log):
        self.order.append("prelude")
        if self.fail:
            raise KeyboardInterrupt


class _Beside:
    def __init__(self, order):
        self.order = order
        order.append("started")

    def finish(self):
        self.order.append("finished")

    def cancel(self):
        self.order.append("cancelled")


def test_the_work_starts_before_the_prelude_and_ends_before_any_step_or_is_cancelled():
    order: list[str] = []
    plan = loop.Plan(None, {}, SweepSpec(), steps=lambda _: iter(()), beside_prelude=lambda: _Beside(order))
    loop._prelude(_Session(order), None, plan, print)
    assert order == ["started", "prelude", "finished"]
    order.clear()
    with pytest.raises(KeyboardInterrupt):
        loop._prelude(_Session(order, fail=True), None, plan, print)
    assert order == ["started", "prelude", "cancelled"]
