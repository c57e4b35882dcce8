"""Engines end to end on the CPU: the store, correctness, skips with reasons.

The handlers run in this process (`inprocess_runs`): the engines are the point, not the worker's isolation
(tests/drive/test_runner.py), and each worker process cost a fork server importing torch.
"""

import pytest

import deepgap
from deepgap.core.records import Status

CPU_ENGINES = ("eager", "compile", "onnxruntime")  # every engine family that runs on a CPU
GPU_ONLY = ("cudagraph", "tensorrt", "onnxruntime-trt")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("DEEPGAP_CACHE", str(path))  # the spawned worker inherits it
    return path


def _by(results):
    return {(r.spec.engine, r.spec.precision, r.spec.batch_size): r for r in results}


@pytest.mark.slow
def test_cpu_engines_run_tinycnn_at_two_batch_sizes(tmp_path, tiny_spec, cache, inprocess_runs):
    spec = tiny_spec.replace(engines=CPU_ENGINES + GPU_ONLY, precisions=("fp32", "int8"), batch_sizes=(1, 3))
    res = deepgap.run(spec, store=str(tmp_path / "s.sqlite"))
    by = _by(res.results)
    from deepgap.measure.pairing import (
        engine_precisions,  # each engine paired only with the precisions it runs
    )

    assert len(by) == 2 * sum(p in engine_precisions(e) for e in spec.engines for p in spec.precisions)
    for engine, precision in [(e, "fp32") for e in CPU_ENGINES] + [("onnxruntime", "int8")]:
        for bs in (1, 3):
            r = by[(engine, precision, bs)]
            assert r.status == Status.OK, (engine, precision, bs, r.reason)
            corr = r.details.correctness.to_json()
            assert corr["flagged"] is False and corr["n_images"] == bs
            assert corr["rel_l2"] < (1e-5 if precision == "fp32" else 0.25)
            assert r.latency.n == 6 and r.throughput_ips > 0
    # compile time is its own metric, outside the timed window
    info = by[("compile", "fp32", 3)].details.engine_info.to_json()
    assert info["compile_s"] > 0 and info["graph_breaks"] == 0 and info["mode"] == "default"
    assert by[("compile", "fp32", 3)].details.setup_s >= info["compile_s"]
    # one ONNX export serves both batch sizes; the int8 model is quantized once, from a stated calibration set
    assert by[("onnxruntime", "fp32", 1)].details.engine_info.onnx_cache == "miss"
    assert by[("onnxruntime", "fp32", 3)].details.engine_info.onnx_cache == "hit"
    q1, q3 = (by[("onnxruntime", "int8", b)].details.engine_info.to_json() for b in (1, 3))
    assert (q1["quant_cache"], q3["quant_cache"]) == ("miss", "hit")
    assert q1["calibration"]["source"] == "synthetic" and q1["quantization"]["format"] == "QDQ"
    assert list(cache.glob("ort-int8/*.onnx")) and list(cache.glob("onnx/*.onnx"))
    # the `prepare` request that builds these beside a GPU run's prelude (deepgap.drive.prepare) looks up
    # the very keys the measurement wrote
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import SweepRunner

    runner = SweepRunner(spec, "cpu", worker=InProcessWorker())
    info = runner.call("prepare", runner.request(by[("onnxruntime", "int8", 1)].spec), 120)
    assert (info["onnx_cache"], info["quant_cache"]) == ("hit", "hit"), info
    # what cannot run here is stored as skipped, with the reason
    for engine in GPU_ONLY:
        r = by[(engine, "fp32", 1)]
        assert r.status == Status.SKIPPED and ("CPU" in r.reason or "unavailable" in r.reason), r.reason
    assert ("eager", "int8", 1) not in by  # not a "does not run" row: not planned at all
    df = res.to_pandas()
    assert (df["status"] == "skipped").sum() == len(df) - 8 and df["reason"][
        df["status"] == "skipped"
    ].str.len().min() > 10


def test_tensorrt_absent_says_why():
    pytest.importorskip("onnxruntime")
    try:
        import tensorrt  # noqa: F401

        pytest.skip("tensorrt is installed here")
    except ImportError:
        pass
    from deepgap.measure.engines import get_engine

    why = get_engine("tensorrt").available()
    assert why.startswith("unavailable: tensorrt is not installed")


def _measure_broken_engines(store_path: str) -> dict:
    """Two plausible broken engines beside eager, through the worker's public API in this process."""
    import torch

    from deepgap.core.records import ConfigSpec
    from deepgap.measure.configuration import measure
    from deepgap.measure.engines import ENGINES, Engine, Prepared, load_engines
    from deepgap.measure.engines.eager import to_device
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.timing import TimingProtocol
    from deepgap.measure.worker import WorkerState
    from deepgap.store import Store

    class ChannelOrderBug(Engine):  # a plausible layout bug: RGB fed as BGR
        name = "bgr-bug"

        def prepare(self, model, spec, example):
            model = to_device(model, spec)
            return Prepared(run=lambda x: model(x.flip(1)), input_dtype=torch.float32)

    class FastGarbage(Engine):  # the fastest engine there is: it computes nothing
        name = "fast-garbage"

        def prepare(self, model, spec, example):
            out = torch.zeros(spec.batch_size, 10)
            return Prepared(run=lambda x: out, input_dtype=torch.float32)

    load_engines()
    ENGINES.add("bgr-bug", ChannelOrderBug)
    ENGINES.add("fast-garbage", FastGarbage)
    state = WorkerState("cpu")
    store = Store(store_path)
    run_id = store.begin_run({}, "test", {"device_name": "cpu"}, "0")
    protocol = TimingProtocol(warmup=1, iterations=3, repeats=2)
    out = {}
    for engine, transfer in (("eager", False), ("bgr-bug", False), ("fast-garbage", False), ("eager", True)):
        spec = ConfigSpec(
            model="tinycnn",
            engine=engine,
            precision="fp32",
            batch_size=4,
            device="cpu",
            resolution=32,
            threads=1,
            include_transfer=transfer,
        )
        res = measure(state, MeasureRequest(spec=spec, protocol=protocol))
        store.record(run_id, res)
        out[engine + ("+transfer" if transfer else "")] = {
            "status": res.status.value,
            "reason": res.reason,
            "correctness": res.details.correctness,
            "transfer": res.details.transfer,
        }
    store.finish_run(run_id)
    store.close()
    return out


def test_correctness_flags_a_broken_engine_and_recommend_never_picks_it(tmp_path):
    import torch

    from deepgap.analysis.frame import aggregate, prepare
    from deepgap.analysis.recommend import recommend
    from deepgap.measure.engines import ENGINES, load_engines
    from deepgap.store import Store

    load_engines()  # before the snapshot: loading happens once per process
    store_path = str(tmp_path / "broken.sqlite")
    threads = torch.get_num_threads()  # measure() sets the spec's thread count in this process
    registered = dict(ENGINES._entries)  # the two broken engines must not outlive this test
    try:
        out = _measure_broken_engines(store_path)
    finally:
        torch.set_num_threads(threads)
        ENGINES._entries.clear()
        ENGINES._entries.update(registered)
    assert all(v["status"] == "ok" for v in out.values()), out
    assert out["eager"]["correctness"].flagged is False
    for broken in ("bgr-bug", "fast-garbage"):
        c = out[broken]["correctness"]
        assert c.flagged is True and not c.rel_l2 <= c.bound_rel_l2, c
    # --include-transfer on a CPU: nothing to copy, and the result says so rather than pretending
    assert out["eager+transfer"]["transfer"].startswith("none") and out["eager"]["transfer"] is None
    store = Store(store_path, readonly=True)
    try:
        agg = aggregate(prepare(store.results_frame()))
    finally:
        store.close()
    fastest = agg.sort_values("throughput_ips", ascending=False).iloc[0]
    assert (
        fastest["engine"] == "fast-garbage" and fastest["flagged"]
    )  # it would win an honest-looking table …
    (rec,) = recommend(agg)
    assert rec.choice is not None and rec.choice["engine"] == "eager"  # … and is never recommended


def test_compile_failure_is_an_error_with_the_compilers_message():
    import torch
    import torch._inductor.config as inductor_config

    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine
    from deepgap.measure.engines.torch_compile import CompileFailed
    from deepgap.measure.models.build import build_model

    spec = ConfigSpec(
        model="tinycnn", engine="compile", precision="fp32", batch_size=2, device="cpu", resolution=32
    )
    with (
        inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}),
        pytest.raises(
            CompileFailed, match=r"torch.compile\(mode=default, freezing=False\) failed: .*compiler"
        ),
    ):
        get_engine("compile").prepare(build_model("tinycnn", 32), spec, torch.randn(2, 3, 32, 32))
    assert inductor_config.freezing is False


@pytest.mark.slow
def test_every_compile_variant_on_cpu(tmp_path, tiny_spec, cache, inprocess_runs):
    """Each torch.compile variant measures end to end (one batch size: compile time).

    Batch 1, the batch that test_cpu_engines_run_tinycnn_at_two_batch_sizes compiles the default mode at:
    Inductor's kernel cache then serves the C++ kernels a variant shares with the default mode (on tinycnn,
    all of max-autotune's), ~10 s of CPU less than at batch 2.
    """
    engines = ("compile-max-autotune", "compile-reduce-overhead", "compile-freeze")
    res = deepgap.run(tiny_spec.replace(engines=engines, batch_sizes=(1,)), store=str(tmp_path / "s.sqlite"))
    assert len(res.results) == 3
    for r in res.results:
        assert r.status == Status.OK, (r.spec.engine, r.reason)
        assert r.details.correctness.rel_l2 < 1e-5
    freeze = [r for r in res.results if r.spec.engine == "compile-freeze"][0].details.engine_info.to_json()
    assert freeze["freezing"] is True and freeze["mode"] == "reduce-overhead"
