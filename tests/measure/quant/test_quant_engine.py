"""The quant engine's registration, support reasons, CPU preparation flow and accuracy (CPU)."""

from __future__ import annotations

import pytest
import torch
from torchvision import models

from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec
from deepgap.measure import correctness
from deepgap.measure.engines import get_engine
from deepgap.measure.models.build import weights_fingerprint
from deepgap.measure.quant.calibrate import calibration_images, collect_amax
from deepgap.measure.quant.fold import resnet_graph
from deepgap.measure.quant.network import build
from deepgap.measure.quant.prepare import QuantOptions, prepare_quant, variant

H100 = DeviceCaps("cuda:0", "cuda", "NVIDIA H100 80GB HBM3", (9, 0), 80 << 30)
A100 = DeviceCaps("cuda:0", "cuda", "NVIDIA A100", (8, 0), 80 << 30)
T4 = DeviceCaps("cuda:0", "cuda", "Tesla T4", (7, 5), 16 << 30)
CPU = DeviceCaps("cpu", "cpu", "some cpu")


def _spec(model="resnet50", precision="int8", device="cuda"):
    return ConfigSpec(model, "quant", precision, 8, device)


def test_engine_is_registered_with_its_precisions():
    eng = get_engine("quant")
    assert eng.precisions == ("int8", "fp8") and eng.available() is None


@pytest.mark.parametrize(
    "spec,caps,expect",
    [
        (_spec(), H100, None),
        (_spec(precision="fp8"), H100, None),
        (_spec(), A100, None),
        (_spec(precision="fp8"), A100, "fp8 ≥ 8.9"),
        (_spec(), T4, "has 7.5"),
        (_spec(device="cpu"), CPU, "unavailable: quant engine needs a CUDA GPU"),
        (_spec(model="vit_b_16"), H100, None),  # its Linears (issue 50)
        (_spec(model="mobilenet_v3_large"), H100, "converts torchvision ResNets"),
        (_spec(precision="fp16"), H100, "does not run fp16"),
    ],
)
def test_supports_reasons(spec, caps, expect):
    why = get_engine("quant").supports(spec, caps)
    if expect is None:
        assert why is None
    else:
        assert expect in why
        assert why.startswith(("unavailable:", "engine quant"))


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return models.resnet18().eval()


@pytest.fixture(scope="module")
def calibrated(resnet18):
    """``(name, resolution, images) -> (model, graph, ranges)``: each calibrated graph made once per module.

    Why: int8 and fp8 (and the two stem tests) quantize the same folded graph with the same ranges, and
    `build` leaves both as they are; a ResNet-50 built, folded and calibrated costs ~2 CPU-s. ``resnet18``
    is the module's own; another name is built with seed 0.
    """
    made = {}

    def get(name: str, res_px: int, n_images: int):
        if (name, res_px, n_images) not in made:
            if name == "resnet18-module":
                model = resnet18
            else:
                torch.manual_seed(0)
                model = models.get_model(name, weights=None).eval()
            graph = resnet_graph(model)
            amax = collect_amax(graph, calibration_images(n_images, res_px, 0), method="max")
            made[name, res_px, n_images] = (model, graph, amax)
        return made[name, res_px, n_images]

    return get


def _emulate_cpu_scaled_mm(monkeypatch):
    """``torch._scaled_mm`` on a CPU is a naive loop (about 1 s per layer-4 GEMM of resnet18, ~60 s per test):
    swap in the same product in fp32 (fp8 values and fp32 sums: exact up to summation order), after
    checking it against the library on a layer-sized GEMM, so the preparation flow is what is timed."""
    real = torch._scaled_mm

    def emulated(a, b, scale_a, scale_b, out_dtype=None, **kw):
        assert not kw, kw
        return ((a.float() @ b.float()) * (scale_a * scale_b)).to(out_dtype or torch.float32)

    g = torch.Generator().manual_seed(1)
    a = (torch.randn(16, 576, generator=g) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(64, 576, generator=g) * 4).to(torch.float8_e4m3fn)
    one = torch.ones(())
    want = real(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    torch.testing.assert_close(emulated(a, w.t(), one, one, torch.float32), want, rtol=1e-5, atol=1e-3)
    monkeypatch.setattr(torch, "_scaled_mm", emulated)


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_prepare_on_cpu_torch_path(resnet18, precision, tmp_path, monkeypatch):
    """The whole preparation flow (calibrate, self-check, time both ways, choose, rebuild) on the CPU."""
    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    if precision == "fp8":
        _emulate_cpu_scaled_mm(monkeypatch)
    opts = QuantOptions(
        calib_images=4, calib_method="max", autotune=False, timing_reps=1, force_backend="torch"
    )
    res = prepare_quant(resnet18, precision, 1, 32, "resnet18", device="cpu", opts=opts)
    info = res.info
    assert info["precision"] == precision and not info["calibration"]["from_cache"]
    assert len(info["layers"]) == 19 and info["n_quantized"] + info["n_fp16"] == 19
    for t in info["layers"]:
        assert t["q_s"] is not None and t["fp16_s"] is not None and t["q_error"] is None, t
        assert t["mode"] == ("q" if t["q_s"] <= t["fp16_s"] * 1.02 else "fp16")
        assert res.net.convs[t["name"]].mode == t["mode"]
    assert info["stem"] == {"chosen": "cudnn", "reason": "not on a GPU"}
    stem, head = info["outside_layers"]  # the per-layer table's rows for what is not a quantized conv
    assert (stem["name"], head["name"]) == ("stem", "head")
    for row in (stem, head):
        assert row["fp16_s"] > 0 and row["macs"] > 0 and row["bytes"] > 0 and row["mode"] == "fp16"
    assert stem["gemm"] == [16 * 16, 64, 147]  # 32² input, stride 2: 16² output pixels, K = 3·7·7
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        agree = correctness.compare(res.run(x.half()), resnet18(x), precision)
        assert not agree.flagged, agree
        if precision == "int8":  # ablation runners rebuild the same calibrated network with other choices
            run_q, vinfo = variant(res, backend="torch", cuda_graph=False)
            assert vinfo == {"cuda_graph": False}
            assert all(c.mode == "q" for c in run_q.__self__.convs.values())
            assert not correctness.compare(run_q(x.half()), resnet18(x), precision).flagged
    from deepgap.measure.quant.calibrate import CalibrationKey, calibrate

    key = CalibrationKey("resnet18", 32, weights_fingerprint(resnet18), 4, 0, "max")
    assert calibrate(res.graph, key)[1]  # the second precision/batch reuses the cached ranges


@pytest.mark.parametrize("name,res_px", [("resnet18", 64), ("resnet50", 32)])
@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_quantized_network_is_within_the_correctness_bounds(name, res_px, precision, calibrated):
    """Exact emulation of the quantized network vs the fp32 model, with deepgap's bounds."""
    model, graph, amax = calibrated(name, res_px, 8)
    net = build(graph, precision, amax, {}, res_px)
    x = torch.randn(4, 3, res_px, res_px, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        agree = correctness.compare(net.forward(x), model(x), precision)
    assert not agree.flagged, agree
    assert agree.rel_l2 < (0.06 if precision == "int8" else 0.15)


def test_stem_padded_to_four_channels_gives_the_same_output(calibrated):
    """The stem's zero fourth channel (chosen on the GPU when faster) changes no number."""
    _, graph, amax = calibrated("resnet18-module", 32, 2)
    net = build(graph, "int8", amax, {}, 32)
    x = torch.randn(2, 3, 32, 32).half().contiguous(memory_format=torch.channels_last)
    plain = net.run_stem(x, "torch")
    net.stem.set_padding(4)
    assert net.stem.w_pad.shape == (64, 4, 7, 7) and not net.stem.w_pad[:, 3].any()
    assert torch.equal(net.run_stem(x, "torch"), plain)
    net.stem.set_padding(0)
    assert net.stem.w_pad is None and torch.equal(net.run_stem(x, "torch"), plain)


def test_fused_stem_inside_the_network_agrees_with_the_cudnn_path(calibrated):
    """The network's stem through the fused Triton kernel (interpreted here) agrees with its torch path."""
    pytest.importorskip("triton")
    from deepgap.measure.quant.stem_choice import STEM_AGREE_FRAC
    from deepgap.measure.quant.tuning import _agree

    _, graph, amax = calibrated("resnet18-module", 32, 2)
    net = build(graph, "int8", amax, {}, 32)
    x = torch.randn(2, 3, 32, 32).half().contiguous(memory_format=torch.channels_last)
    plain = net.run_stem(x, "torch")
    net.stem.configure("fused")
    assert net.stem.w_gemm.shape == (64, 160)
    assert _agree(net.run_stem(x, "torch"), plain, "int8", STEM_AGREE_FRAC) is None


def test_checked_time_times_only_what_passed_its_check():
    """The tuner's rule (`tuning.checked_time`): a check's complaint or a raise is returned, never a time."""
    from deepgap.measure.quant.tuning import checked_time

    ran = []
    assert checked_time(lambda: None, lambda: ran.append(1), 2, "cpu") >= 0 and ran
    ran.clear()
    assert (
        checked_time(lambda: "3% of elements differ", lambda: ran.append(1), 2, "cpu")
        == "3% of elements differ"
    )

    def boom():
        raise ValueError("tile does not fit\nsecond line")

    assert checked_time(boom, lambda: ran.append(1), 2, "cpu") == "ValueError: tile does not fit" and not ran
