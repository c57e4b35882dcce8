"""Weight scales, activation rounding, epilogue coefficients and the calibration cache (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from deepgap.measure.quant import layers
from deepgap.measure.quant.calibrate import CalibrationKey, calibrate, calibration_images, collect_amax
from deepgap.measure.quant.fold import ConvNode, Graph, HeadNode, PoolNode


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_per_channel_weight_quantization(fmt):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 4, 3, 3, generator=g) * torch.logspace(-3, 1, 6).view(-1, 1, 1, 1)
    wq, s = layers.quantize_weight(w, fmt)
    assert wq.shape == (6, 36) and wq.dtype == layers.DTYPES[fmt] and s.shape == (6,)
    assert torch.allclose(s.double(), w.abs().amax((1, 2, 3)).double() / layers.QMAX[fmt], rtol=1e-6)
    back = layers.weight_as_conv(wq, 4, 3).double() * s.double().view(-1, 1, 1, 1)
    # every channel uses its full range, and the reconstruction error is a rounding error of its own scale
    assert torch.equal(wq.float().abs().amax(1), torch.full((6,), layers.QMAX[fmt]))
    err = (back - w.double()).abs().amax((1, 2, 3))
    bound = 0.5 * s.double() if fmt == "int8" else w.abs().amax((1, 2, 3)).double() * 2**-4
    assert (err <= bound * 1.0001).all()


def test_weight_layout_is_kh_kw_c():
    w = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2) - 10
    wq, s = layers.quantize_weight(w, "int8")
    back = layers.weight_as_conv(wq, 3, 2).float() * s.view(-1, 1, 1, 1)
    assert torch.allclose(back, w, atol=float(s.max()))
    # column index = (kh·k + kw)·C + c
    for c, kh, kw in [(1, 0, 0), (0, 0, 1), (2, 1, 1)]:
        assert wq[1, (kh * 2 + kw) * 3 + c].item() == round(float(w[1, c, kh, kw] / s[1]))


def test_activation_rounding_matches_the_kernels_definition():
    y = torch.tensor([-200.0, -1.5, -0.5, 0.49, 0.5, 1.5, 2.5, 126.6, 300.0])
    q = layers.quantize_act(y, "int8")
    assert q.tolist() == [-127, -2, 0, 0, 0, 2, 2, 127, 127]  # clamped to ±127, ties to even
    f = layers.quantize_act(torch.tensor([500.0, -1000.0, 17.0]), "fp8").float()
    assert f.tolist() == [448.0, -448.0, 16.0]  # saturates; 17 is a tie → even mantissa (16)
    with pytest.raises(ValueError, match="unknown activation format"):
        layers.quantize_act(y, "int4")


def _node(residual=None):
    g = torch.Generator().manual_seed(2)
    return ConvNode(
        "c", "a", "b", torch.randn(8, 4, 1, 1, generator=g), torch.randn(8, generator=g), 1, 0, True, residual
    )


def test_epilogue_coefficients():
    node = _node("r")
    fmts = {"a": "int8", "b": "int8", "r": "int8"}
    scales = {"a": 0.1, "b": 0.4, "r": 0.2}
    lay = layers.make_qconv(node, "int8", "q", fmts, scales)
    assert torch.allclose(lay.alpha.double(), lay.w_scale.double() * 0.1 / 0.4, rtol=1e-6)
    assert torch.allclose(lay.beta, node.bias / 0.4, rtol=1e-6)
    assert lay.gamma == pytest.approx(0.5)
    # fp16 output: no division by an output scale
    lay16 = layers.make_qconv(node, "int8", "q", {**fmts, "b": "fp16"}, scales)
    assert torch.allclose(lay16.beta, node.bias) and lay16.gamma == pytest.approx(0.2)
    # fp16 mode: real-valued conv output, only the output scale remains
    lay_h = layers.make_qconv(node, "int8", "fp16", {**fmts, "a": "fp16"}, scales)
    assert torch.allclose(lay_h.alpha, torch.full((8,), 2.5))
    with pytest.raises(ValueError, match="needs a int8 input"):
        layers.make_qconv(node, "int8", "q", {**fmts, "a": "fp16"}, scales)
    with pytest.raises(ValueError, match="mode must be"):
        layers.make_qconv(node, "int8", "int4", fmts, scales)


def test_quantized_layer_reference_approximates_the_float_layer():
    g = torch.Generator().manual_seed(4)
    node = ConvNode(
        "c", "a", "b", torch.randn(16, 8, 3, 3, generator=g) * 0.2, torch.randn(16, generator=g), 1, 1, True
    )
    x = torch.randn(2, 8, 6, 6, generator=g).relu()
    y = torch.nn.functional.conv2d(x, node.weight, node.bias, 1, 1).relu()
    scales = {"a": float(x.abs().max()) / 127, "b": float(y.abs().max()) / 127}
    lay = layers.make_qconv(node, "int8", "q", {"a": "int8", "b": "int8"}, scales)
    xq = layers.quantize_act(x.permute(0, 2, 3, 1).reshape(-1, 8) / scales["a"], "int8")
    out = layers.conv_reference(lay, xq, (2, 6, 6)).float() * scales["b"]
    ref = y.permute(0, 2, 3, 1).reshape(-1, 16)
    assert float((out - ref).norm() / ref.norm()) < 0.02
    # the torch path (im2col + _int_mm) computes exactly the same integers
    assert torch.equal(layers.conv_torch(lay, xq, (2, 6, 6)), layers.conv_reference(lay, xq, (2, 6, 6)))


def _tiny_graph() -> Graph:
    g = torch.Generator().manual_seed(5)
    return Graph(
        [
            ConvNode("conv1", "x", "stem", torch.randn(4, 3, 3, 3, generator=g), torch.zeros(4), 1, 1, True),
            PoolNode("maxpool", "stem", "pool"),
            HeadNode("fc", "pool", "logits", torch.randn(5, 4, generator=g), torch.zeros(5)),
        ]
    )


def test_collect_amax_max_and_percentile():
    graph = _tiny_graph()
    images = calibration_images(4, 8, seed=0)
    amax = collect_amax(graph, images, method="max", batch_size=2)
    stem = torch.nn.functional.conv2d(images, graph.nodes[0].weight, None, 1, 1).relu()
    assert amax["stem"] == pytest.approx(float(stem.abs().max()), rel=1e-5)
    p = collect_amax(graph, images, method="p50", batch_size=4)
    assert 0 < p["stem"] < amax["stem"]
    with pytest.raises(ValueError, match="calibration method"):
        collect_amax(graph, images, method="mean")


def test_calibration_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    graph = _tiny_graph()
    key = CalibrationKey("tiny", 8, "abc", n_images=4, seed=0, method="max")
    assert key.path().parent == tmp_path / "quant"
    amax, cached = calibrate(graph, key)
    assert not cached and key.path().is_file()
    again, cached = calibrate(graph, key)
    assert cached and again == amax
    # a different N, seed, resolution or weights is a different entry
    assert (
        len(
            {
                key.digest(),
                CalibrationKey("tiny", 8, "abc", 8, 0, "max").digest(),
                CalibrationKey("tiny", 8, "abd", 4, 0, "max").digest(),
                CalibrationKey("tiny", 8, "abc", 4, 1, "max").digest(),
            }
        )
        == 4
    )
    # a corrupt file is ignored and rewritten
    key.path().write_text("{not json")
    fresh, cached = calibrate(graph, key)
    assert not cached and fresh == amax and json.loads(key.path().read_text())["amax"] == amax
