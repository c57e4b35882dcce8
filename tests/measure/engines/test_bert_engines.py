"""tinybert through every engine that runs on a CPU, in process (issue 38).

Eager and ONNX Runtime (exported with int64 token inputs) measure and agree with the fp32 reference;
the quant engine, ORT int8 and the GPU-only engines are stored as skipped with their reason. torch.compile
and the ONNX export are marked slow: torch.onnx's dynamo export costs ~10 s of CPU even for tinybert.

The compile engines trace tinybert with Dynamo here, and hand the graph to AOTAutograd's eager backend
(`aot_eager`), not to Inductor. Why: Inductor's C++ codegen of even a two-layer encoder cost ~15 CPU-s per
engine from a clean clone's cold cache (the test was 30 CPU-s, the suite's heaviest). What this file checks is
deepgap's text path through the engines (int64 token inputs, no graph break in `bert_net`, the mode and
freezing each engine asks for, its stored info, correctness against fp32); Inductor's CPU codegen is
tests/measure/engines/test_engines.py's (tinycnn, every compile variant), Inductor on BERT
tests/measure/engines/test_bert_gpu.py's.
"""

import pytest

from deepgap.core.records import Status
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.inprocess import InProcessWorker
from deepgap.drive.plan import expand
from deepgap.drive.runner import SweepRunner

TINY = dict(
    models=("tinybert",),
    precisions=("fp32",),
    batch_sizes=(3,),
    seq_lens=(16,),
    device="cpu",
    warmup=1,
    iterations=3,
    repeats=2,
    threads=(1,),
    max_time_s=5.0,
    timeout_s=120.0,
    telemetry=False,
    idle_s=0.0,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("DEEPGAP_CACHE", str(path))
    return path


def _measure(**changes):
    spec = validate(SweepSpec(**{**TINY, **changes}))
    runner = SweepRunner(spec, "cpu", worker=InProcessWorker("cpu"))
    return {(r.spec.engine, r.spec.precision): r for r in runner.run(expand(spec, "cpu"))}


def _agrees(r, tol=1e-5):
    assert r.status == Status.OK, r.reason
    corr = r.details.correctness
    assert corr.flagged is False and corr.n_images == 3 and corr.rel_l2 < tol
    assert r.spec.seq_len == 16 and r.throughput_ips > 0
    layer = 2 * 16 * (4 * 32 * 32 + 2 * 32 * 64) + 4 * 16 * 16 * 32  # GEMMs, then QKᵀ and AV
    assert r.flops_per_image == pytest.approx(2 * layer + 2 * 32 * 32)  # two layers and the pooler


def test_eager_measures_tinybert_and_the_rest_say_why_not(cache):
    by = _measure(
        engines=("eager", "onnxruntime", "quant", "cudagraph", "tensorrt"),
        precisions=("fp32", "int8"),
        engine_axes={"onnxruntime": {"precisions": ("int8",)}},
    )  # ORT fp32 exports: the slow test
    _agrees(by.pop(("eager", "fp32")))
    quant = by.pop(("quant", "int8"))
    assert quant.status == Status.SKIPPED
    assert "needs a CUDA GPU" in quant.reason  # its transformer path (issue 50) runs on tensor cores
    ort8 = by.pop(("onnxruntime", "int8"))
    assert ort8.status == Status.SKIPPED and "token ids" in ort8.reason
    assert {k: r.status for k, r in by.items()} == {  # the GPU-only engines: skipped with a reason
        ("cudagraph", "fp32"): Status.SKIPPED,
        ("tensorrt", "fp32"): Status.SKIPPED,
        ("tensorrt", "int8"): Status.SKIPPED,
    }
    assert all(r.reason for r in by.values())


@pytest.mark.slow
def test_onnxruntime_runs_an_int64_token_export(cache):
    """Slow: torch.onnx's dynamo exporter costs ~10 s of CPU even for tinybert."""
    import onnx

    r = _measure(engines=("onnxruntime",))[("onnxruntime", "fp32")]
    _agrees(r)
    files = list(cache.glob("onnx/*.onnx"))
    assert len(files) == 1 and "-16-" in files[0].name  # one export per sequence length
    inp = onnx.load(str(files[0])).graph.input[0].type.tensor_type
    assert inp.elem_type == onnx.TensorProto.INT64 and inp.shape.dim[1].dim_value == 16
    assert inp.shape.dim[0].dim_param  # the batch axis is symbolic: one export serves every batch


@pytest.fixture
def aot_eager(monkeypatch):
    """``torch.compile`` with the ``aot_eager`` backend (see the module docstring); the modes asked are kept.

    A mode is Inductor's option, which another backend refuses, so it is recorded and dropped here.
    """
    import torch

    real, asked = torch.compile, []

    def compile_(model, *, mode=None, **kw):
        asked.append(mode)
        return real(model, backend="aot_eager", **kw)

    monkeypatch.setattr(torch, "compile", compile_)
    return asked


@pytest.mark.slow
def test_compile_and_compile_freeze_measure_tinybert(cache, aot_eager):
    by = _measure(engines=("compile", "compile-freeze"))
    assert aot_eager == [None, "reduce-overhead"]  # each engine's mode, in plan order
    for engine, freezing in (("compile", False), ("compile-freeze", True)):
        _agrees(by[(engine, "fp32")])
        info = by[(engine, "fp32")].details.engine_info.to_json()
        assert info["compile_s"] > 0 and info["graph_breaks"] == 0
        assert info["graphs"] == 1 and info["freezing"] is freezing and info["dynamic"] is False
