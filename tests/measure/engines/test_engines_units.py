"""Engine building blocks without a GPU: caches, calibration data, ORT INT8 quantization, TensorRT plans."""

import subprocess
import sys

import pytest

from deepgap.core.errors import UsageError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("DEEPGAP_CACHE", str(path))
    return path


# --- the artifact cache -------------------------------------------------------------------------------------


def test_cache_dir_env_and_option_and_atomic_writes(tmp_path, cache):
    from deepgap.measure.engines import artifacts

    assert artifacts.cache_dir() == cache and cache.is_dir()
    assert artifacts.cache_dir({"cache_dir": str(tmp_path / "o")}) == tmp_path / "o"
    parts = {"model": "m", "precision": "int8"}
    a = artifacts.artifact_path("kind", "m/int8", parts, ".bin")
    assert a.parent == cache / "kind" and "/" not in a.name
    assert a == artifacts.artifact_path("kind", "m/int8", dict(reversed(parts.items())), ".bin")  # order-free
    assert a != artifacts.artifact_path("kind", "m/int8", {**parts, "precision": "fp16"}, ".bin")
    with pytest.raises(RuntimeError), artifacts.atomic_path(a, parts) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert not a.exists() and list(a.parent.iterdir()) == []  # nothing half-written is left
    artifacts.write_bytes(a, b"engine", parts)
    assert a.read_bytes() == b"engine" and a.with_name(a.name + ".json").exists()


# --- calibration data ----------------------------------------------------------------------------------------


def test_synthetic_calibration_is_seeded_and_stated():
    from deepgap.measure import calibration_data

    a = calibration_data.calibration_set(16, {"calibration_images": 5})
    b = calibration_data.calibration_set(16, {"calibration_images": 5})
    assert tuple(a.images.shape) == (5, 3, 16, 16) and (a.images == b.images).all()
    assert a.source == "synthetic" and a.info["images"] == 5 and "N(0,1)" in a.info["distribution"]
    assert (
        a.fingerprint
        == b.fingerprint
        != calibration_data.calibration_set(16, {"calibration_images": 6}).fingerprint
    )
    assert (
        calibration_data.calibration_set(16, {"calibration_images": 5}, seed=1).fingerprint != a.fingerprint
    )
    assert [tuple(x.shape) for x in a.batches(2)] == [(2, 3, 16, 16), (2, 3, 16, 16), (1, 3, 16, 16)]
    with pytest.raises(UsageError, match="calibration_images"):
        calibration_data.calibration_set(16, {"calibration_images": 0})


def test_calibration_from_a_folder_of_images(tmp_path):
    import torch
    from PIL import Image

    from deepgap.measure import calibration_data, images
    from deepgap.measure.accuracy import evaluate

    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for i in range(5):  # non-square sizes, one in a subfolder, one grey-scale
        c = 1 if i == 4 else 3
        img = torch.randint(0, 256, (40 + 4 * i, 56, c), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(img[..., 0] if c == 1 else img).save(
            folder / ("sub" if i == 2 else "") / f"im{i}.png"
        )
    (folder / "notes.txt").write_text("not an image")
    cs = calibration_data.calibration_set(24, {"calibration_dir": str(folder), "calibration_images": 3})
    assert cs.source == "folder" and tuple(cs.images.shape) == (3, 3, 24, 24) and cs.info["images"] == 3
    assert cs.info["directory"] == str(folder.resolve())
    again = calibration_data.calibration_set(24, {"calibration_dir": str(folder), "calibration_images": 3})
    assert (cs.images == again.images).all() and cs.fingerprint == again.fingerprint  # a seeded sample
    every = calibration_data.calibration_set(24, {"calibration_dir": str(folder), "calibration_images": 9})
    assert every.images.shape[0] == 5 and "has 5" in every.info["note"]
    # ImageNet normalization: a mid-grey image maps to (0.5 - mean) / std
    grey = evaluate.preprocess(torch.full((3, 30, 30), 128, dtype=torch.uint8), 8)
    expect = (128 / 255 - torch.tensor(images.IMAGENET_MEAN)) / torch.tensor(images.IMAGENET_STD)
    assert torch.allclose(grey[:, 4, 4], expect, atol=1e-5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no images"):
        calibration_data.calibration_set(24, {"calibration_dir": str(tmp_path / "empty")})
    with pytest.raises(UsageError, match="not a folder"):
        calibration_data.calibration_set(24, {"calibration_dir": str(tmp_path / "missing")})


# --- ONNX Runtime static INT8 -------------------------------------------------------------------------------


def test_ort_int8_static_quantization_is_qdq_per_channel_accurate_and_cached(tmp_path, cache):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import numpy as np
    import torch

    from deepgap.measure import calibration_data
    from deepgap.measure.correctness import compare
    from deepgap.measure.engines.onnx_export import export_onnx
    from deepgap.measure.engines.ort_quant import quant_settings, quantize
    from deepgap.measure.models.build import build_model, weights_fingerprint

    model = build_model("tinycnn", 32)
    sha = weights_fingerprint(model)
    fp32, info = export_onnx(model, "tinycnn", 32, sha)
    assert info["onnx_cache"] == "miss" and export_onnx(model, "tinycnn", 32, sha)[1]["onnx_cache"] == "hit"
    calib = calibration_data.calibration_set(32, {"calibration_images": 16})
    settings = quant_settings({})
    q, qinfo = quantize(fp32, calib, settings, "tinycnn-32")
    assert qinfo["quant_cache"] == "miss" and qinfo["calibration"]["source"] == "synthetic"
    q2, qinfo2 = quantize(fp32, calib, settings, "tinycnn-32")
    assert q2 == q and qinfo2["quant_cache"] == "hit" and q.exists()
    other = calibration_data.calibration_set(32, {"calibration_images": 8})
    assert quantize(fp32, other, settings, "tinycnn-32")[0] != q  # another calibration set, another artifact
    assert len(list((cache / "ort-int8").glob("*.onnx"))) == 2
    _calibration_threads_change_no_byte(fp32, calib, settings, q, cache)
    graph = onnx.load(str(q)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") >= 3 and ops.count("DequantizeLinear") >= 6  # QDQ around each conv
    inits = {i.name: i for i in graph.initializer}
    per_channel = [
        n
        for n in graph.node
        if n.op_type == "DequantizeLinear"
        and n.input[0] in inits
        and len(inits[n.input[1]].dims) == 1
        and inits[n.input[1]].dims[0] == 16
    ]
    assert per_channel, "conv weights should carry one scale per output channel"
    # accurate against the fp32 model on other images than it was calibrated on
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(x)
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    agree = compare(torch.from_numpy(np.asarray(out)), ref, "int8")
    assert not agree.flagged and 0 < agree.rel_l2 < 0.2
    with pytest.raises(UsageError, match="ort_calibration_method"):
        quant_settings({"ort_calibration_method": "magic"})


def _calibration_threads_change_no_byte(fp32, calib, settings, q, cache):
    """A build beside the prelude calibrates on its share of the cores (`ort_quant.calibration_threads`):
    the session has that many threads, ORT's own method is back afterwards, and the QDQ model is the same file."""
    from onnxruntime.quantization.calibrate import CalibraterBase, create_calibrator

    from deepgap.measure.engines.ort_quant import calibration_threads, quantize

    own = CalibraterBase.create_inference_session
    with calibration_threads(1):
        cal = create_calibrator(fp32, augmented_model_path=str(cache / "augmented.onnx"))
        so = cal.infer_session.get_session_options()
        assert (
            so.intra_op_num_threads == 1
            and so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        )
    assert CalibraterBase.create_inference_session is own
    one, info = quantize(fp32, calib, settings, "tinycnn-32", {"cache_dir": str(cache / "one")}, threads=1)
    assert info["calibration_threads"] == 1 and one.read_bytes() == q.read_bytes()


# --- TensorRT plans (no TensorRT needed) --------------------------------------------------------------------


def test_tensorrt_profile_covers_the_batch():
    from deepgap.measure.engines.tensorrt_build import profile_shapes

    assert (
        profile_shapes(1) == (1, 32, 512) == profile_shapes(256)
    )  # the paper's profile: one engine per sweep
    assert profile_shapes(600) == (1, 32, 1024)  # widened to cover a larger batch
    assert profile_shapes(4, {"trt_profile_batches": [8, 16, 64]}) == (4, 16, 64)
    assert profile_shapes(64, {"trt_profile": "static"}) == (64, 64, 64)
    for b in (1, 3, 32, 100, 512, 513, 2048):
        lo, opt, hi = profile_shapes(b)
        assert lo <= opt <= hi and lo <= b <= hi
    with pytest.raises(UsageError):
        profile_shapes(1, {"trt_profile": "dynamic"})
    for bad in ([32, 1, 512], [1, 256, 128], [0, 1, 2], [1, 32]):
        with pytest.raises(UsageError):
            profile_shapes(1, {"trt_profile_batches": bad})


def test_tensorrt_cache_keys_separate_what_changes_the_engine():
    from deepgap.measure.engines.artifacts import artifact_key
    from deepgap.measure.engines.tensorrt_build import calibration_cache_parts, engine_parts, workspace_bytes

    base = dict(
        model="resnet50",
        resolution=224,
        weights_sha="abc",
        precision="int8",
        profile=(1, 32, 512),
        gpu_name="NVIDIA H100 80GB HBM3",
        compute_capability=(9, 0),
        trt_version="10.3.0",
        calibration="cal1",
        workspace=workspace_bytes(),
    )
    key = artifact_key(engine_parts(**base))
    for change in (
        dict(precision="fp16"),
        dict(gpu_name="NVIDIA L4"),
        dict(compute_capability=(8, 9)),
        dict(trt_version="10.4.0"),
        dict(calibration="cal2"),
        dict(profile=(1, 32, 1024)),
        dict(weights_sha="abd"),
        dict(resolution=256),
        dict(model="resnet18"),
    ):
        assert artifact_key(engine_parts(**{**base, **change})) != key, change
    fp16 = {**base, "precision": "fp16"}
    assert artifact_key(engine_parts(**fp16)) == artifact_key(
        engine_parts(**{**fp16, "calibration": "other"})
    )
    c = calibration_cache_parts("resnet50", 224, "abc", "cal1", "10.3.0", 32)
    assert "gpu" not in c and c["tensorrt"] == "10.3.0" and c["algorithm"] == "entropy2"
    assert workspace_bytes() == 2 << 30 and workspace_bytes({"trt_workspace_gib": 0.5}) == 1 << 29
    with pytest.raises(UsageError):
        workspace_bytes({"trt_workspace_gib": -1})


def test_tensorrt_calibration_batches_are_full():
    from deepgap.measure import calibration_data
    from deepgap.measure.engines.tensorrt_build import calibration_batches

    cs = calibration_data.calibration_set(8, {"calibration_images": 70})
    batches = calibration_batches(cs, 32)
    assert [tuple(b.shape) for b in batches] == [(32, 3, 8, 8)] * 2
    assert all(b.is_contiguous() for b in batches)
    assert (batches[1] == cs.images[32:64]).all()
    with pytest.raises(UsageError, match="at least 32"):
        calibration_batches(calibration_data.calibration_set(8, {"calibration_images": 8}), 32)


def test_engine_options_reach_the_engine():
    from deepgap.measure.engines import get_engine

    assert get_engine("onnxruntime", {"calibration_images": 3}).options == {"calibration_images": 3}
    assert get_engine("eager").options == {}


def test_gpu_engines_say_why_not_on_a_cpu():
    from deepgap.core.precision import DeviceCaps
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine

    caps = DeviceCaps("cpu", "cpu", "some CPU")

    def why(engine, precision="fp32", mf="nchw"):
        spec = ConfigSpec(
            model="tinycnn",
            engine=engine,
            precision=precision,
            batch_size=1,
            device="cpu",
            memory_format=mf,
            resolution=32,
        )
        e = get_engine(engine)
        return e.available() or e.supports(spec, caps)

    assert "CUDA GPU" in why("cudagraph")
    assert why("compile") is None or "C++ compiler" in why("compile")
    assert "tf32" in why("compile", "tf32")
    if why("onnxruntime") is None:  # onnxruntime installed
        assert "channels_last" in why("onnxruntime", mf="channels_last")
        assert "fp16" in why("onnxruntime", "fp16")
        assert why("onnxruntime", "int8") is None
        assert "bf16" in why("onnxruntime", "bf16")


def test_the_parents_engine_catalogue_matches_the_registry():
    """Every registered engine has its line in `catalog.CATALOG`: the same module, precisions, text, inputs."""
    from deepgap.measure.engines import ENGINES, load_engines
    from deepgap.measure.engines.catalog import CATALOG

    load_engines()
    registered = {
        n: (
            ENGINES.get(n).__module__,
            tuple(ENGINES.get(n).precisions),
            ENGINES.get(n).description,
            tuple(ENGINES.get(n).inputs),
        )
        for n in ENGINES.names()
    }
    listed = {
        e.name: (f"deepgap.measure.engines.{e.module}", e.precisions, e.description, e.inputs)
        for e in CATALOG
    }
    assert listed == registered
    assert {e.name for e in CATALOG if "int8-resident" in e.inputs} == {"quant"}


def test_validating_a_sweep_and_a_serve_leaves_torch_unloaded():
    """The parent checks engine names and precisions from the catalogue: no engine module, no torch."""
    code = """
import sys
from deepgap.drive.config import SweepSpec, validate
from deepgap.measure.pairing import check_pairs
from deepgap.core.errors import UsageError
spec = validate(SweepSpec(models=("resnet50", "tinycnn"), engines=("eager", "quant", "onnxruntime"),
                          precisions=("fp16", "int8", "fp8"), batch_sizes=(1, 256), device="cpu",
                          inputs=("default", "int8-resident"), engine_axes={"quant": {"batch_sizes": [1]}}))
check_pairs(spec)
try:
    validate(SweepSpec(models=("tinycnn",), engines=("nope",), precisions=("fp32",), batch_sizes=(1,)))
except UsageError as e:
    assert "unknown engine 'nope'" in str(e) and "quant" in str(e), e
else:
    raise AssertionError("an unknown engine passed")
assert "torch" not in sys.modules, "torch imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
