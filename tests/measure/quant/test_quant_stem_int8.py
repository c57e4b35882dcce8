"""The int8-pixel stem (`quant.stem_int8`) on the CPU through the Triton interpreter vs its exact reference.

int8 operands and int32 sums are exact, and the epilogue is the same fp32 arithmetic in kernel and
reference, so int8 outputs must match bit for bit. The interpreter misrounds fp32 → e4m3 near binade
edges (test_quant_kernels), so fp8 outputs are checked loosely here and exactly on the GPU.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

triton = pytest.importorskip("triton")

from conftest import case_id, stem_case, with_sizes_in_turn  # noqa: E402

from deepgap.measure.quant import layers, stem_int8  # noqa: E402


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_quantize_image_kernel_equals_torch_and_pads_a_zero_channel(memory_format):
    x = (torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(1)) * 3).half()
    x = x.contiguous(memory_format=memory_format)
    scale = 0.03
    got = stem_int8.quantize_image(x, scale)
    ref = stem_int8.quantize_image(x, scale, backend="torch")
    assert got.dtype == torch.int8 and got.shape == (2, 4, 9, 11)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, ref)
    assert not got[:, 3].any()
    assert int(got.abs().max()) == 127  # 3σ / 0.03 clamps
    exact = layers.quantize_act(x.float() * torch.tensor(1 / scale, dtype=torch.float32), "int8")
    assert torch.equal(got[:, :3], exact)


def test_pack_weights_puts_a_kernel_row_in_each_k_step():
    w = torch.arange(2 * 3 * 7 * 7, dtype=torch.float64).reshape(2, 3, 7, 7) - 100
    packed, scale = stem_int8.pack_weights(w)
    assert packed.shape == (2, 7 * 32) and packed.dtype == torch.int8
    assert torch.allclose(scale.double(), w.abs().flatten(1).amax(1) / 127)
    rows = packed.reshape(2, 7, 8, 4)
    assert not rows[:, :, 7].any() and not rows[:, :, :, 3].any()  # the eighth tap and the fourth channel
    back = stem_int8.unpack_weights(packed, 7, 7)[:, :3] * scale.double()[:, None, None, None]
    assert float((back - w).abs().max()) <= float(scale.max()) / 2 + 1e-9


# fp16: when the next layer runs in fp16; walk 0 and 3 in the ids
@pytest.mark.parametrize(
    "out_fmt,walk,hw", with_sizes_in_turn(["int8", "fp8", "fp16"], [0, 3], ((32, 32), (29, 35))), ids=case_id
)
def test_int8_stem_kernel_matches_its_exact_reference(out_fmt, walk, hw):
    """Both convolutions: a program per tile, and the persistent walk (3 programs over 8 or 9 tiles, a tail)."""
    x, weight, alpha, beta = stem_case(*hw)
    xq = stem_int8.quantize_image(x, 0.03)
    w_i8, _ = stem_int8.pack_weights(weight)
    ref = stem_int8.reference(xq, w_i8, 7, 2, 3, alpha, beta, out_fmt)
    out = stem_int8.stem(
        xq, w_i8, 7, 2, 3, alpha, beta, out_fmt, block_m=64, persistent=walk, num_programs=walk
    )
    assert out.shape == ref.shape == (2 * ((hw[0] + 3) // 4) * ((hw[1] + 3) // 4), 64)
    o, r = out.float(), ref.float()
    if out_fmt != "fp8":
        assert torch.equal(o, r)
    else:  # the interpreter's e4m3 rounding (see the module docstring)
        close = (o - r).abs() <= r.abs() / 2 + 2**-8
        assert bool(close.all()) and float((o == r).float().mean()) > 0.9


def test_the_int8_stem_approximates_the_float_stem():
    """Quantized pixels and weights: the stem's pre-activation stays within a few % of the float one."""
    x, weight, _, _ = stem_case(24, 24, seed=3)
    in_scale = float(x.abs().max()) / 127
    xq = stem_int8.quantize_image(x, in_scale, backend="torch")
    w_i8, s_w = stem_int8.pack_weights(weight)
    acc = F.conv2d(xq.double(), stem_int8.unpack_weights(w_i8, 7, 7), None, 2, 3) * in_scale
    acc = acc * s_w.double()[None, :, None, None]
    exact = F.conv2d(x.double(), weight, None, 2, 3)
    rel = float((acc - exact).norm() / exact.norm())
    assert rel < 0.02, rel


def test_bad_inputs_are_refused():
    w_i8 = torch.zeros(64, 7 * 32, dtype=torch.int8)
    one, zero = torch.ones(64), torch.zeros(64)
    with pytest.raises(ValueError, match="int8"):
        stem_int8.stem(torch.zeros(1, 3, 8, 8), w_i8, 7, 2, 3, one, zero, "int8")
    with pytest.raises(ValueError, match="int8, fp8 or fp16"):
        stem_int8.stem(torch.zeros(1, 4, 8, 8, dtype=torch.int8), w_i8, 7, 2, 3, one, zero, "fp32")
    with pytest.raises(ValueError, match="positive"):
        stem_int8.quantize_image(torch.zeros(1, 3, 4, 4), 0.0)
    with pytest.raises(ValueError, match="floating point"):
        stem_int8.quantize_image(torch.zeros(1, 3, 4, 4, dtype=torch.int8), 1.0)


@pytest.fixture(scope="module")
def resnet18():
    from torchvision import models

    torch.manual_seed(0)
    return models.resnet18().eval()


def _net(model, precision="int8"):
    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    graph = resnet_graph(model)
    return build(graph, precision, collect_amax(graph, calibration_images(2, 32, 0), method="max"), {}, 32)


def test_calibration_keeps_the_image_range_and_the_stem_its_scale(resnet18):
    net = _net(resnet18)
    assert 1.0 < net.stem.in_scale * 127 < 6.0  # the range of standard-normal pixels, not a layer's
    net.stem.in_scale = 0.0
    with pytest.raises(ValueError, match="calibrated range"):
        net.stem.configure("int8")


def test_the_int8_stem_inside_the_network(resnet18):
    """Interpreted kernels, unfused and with the max-pool inside (`int8pool`), equal the torch reference bit
    for bit; a float batch equals its resident pixels; the output agrees with the cuDNN path within the stem
    choice's bound."""
    from deepgap.measure.quant.stem_choice import STEM_INT8_REL, _agree_stem

    net = _net(resnet18)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)).half()
    x = x.contiguous(memory_format=torch.channels_last)
    cudnn = net.run_stem(x, "torch")
    net.stem.configure("int8", 0, (64, 4))
    assert net.stem.variant == "int8+64x4w" and net.stem.w_i8.shape == (64, 7 * 32)
    ref = net.run_stem(x, "torch")
    assert torch.equal(net.run_stem(x, "triton"), ref)
    pixels = stem_int8.quantize_image(x, net.stem.in_scale)
    assert torch.equal(net.run_stem(pixels, "triton"), ref)
    assert _agree_stem(ref, cudnn, "int8", "int8") is None
    rel = float((ref.float() - cudnn.float()).norm() / cudnn.float().norm())
    assert 0 < rel < STEM_INT8_REL / 2, rel
    net.stem.configure("int8", 0, (64, 4, 2))  # the persistent walk, 2 programs an SM (`stem_tile_args`)
    assert net.stem.variant == "int8+64x4wp2"
    assert torch.equal(net.run_stem(x, "triton"), ref)
    net.stem.configure("int8pool", 0, (4, 4, 4, 3))  # the max-pool in the kernel (`quant.stem_pool`)
    assert net.stem.variant == "int8+pool4x4+4w3s" and net.stem.kernel == "int8"
    assert net.to("cpu").stem.pool_cfg == (4, 4, 4, 3)  # moving the network keeps it
    assert torch.equal(net.run_stem(x, "triton"), ref)  # pixel input: test_quant_stem_pool.py
    net.stem.configure("cudnn")
    assert net.stem.pool_cfg is None
    with pytest.raises(ValueError, match="int8 pixels need the int8 stem"):
        net.run_stem(pixels, "torch")


def test_an_int8_resident_preparation_on_the_cpu(resnet18, tmp_path, monkeypatch):
    """The engine's resident mode end to end: make_input's int8 pixels in, logits within the bounds.

    int8 only: fp8 GEMMs are a naive loop on a CPU (test_quant_engine emulates them); the fp8 stem output
    is checked in the kernel test above and on the GPU.
    """
    precision = "int8"
    from types import SimpleNamespace

    from deepgap.measure import correctness
    from deepgap.measure.engines.quant import QuantEngine

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    from deepgap.measure.quant import prepare

    fast = functools.partial(  # the engine's options, with the CPU-affordable choices of test_quant_engine
        prepare.QuantOptions,
        calib_images=4,
        calib_method="max",
        autotune=False,
        timing_reps=1,
        force_backend="torch",
    )
    monkeypatch.setattr(prepare, "QuantOptions", fast)
    spec = SimpleNamespace(
        precision=precision,
        batch_size=2,
        resolution=32,
        model="resnet18",
        device="cpu",
        input_mode="int8-resident",
    )
    prepared = QuantEngine().prepare(resnet18, spec, torch.zeros(2, 3, 32, 32))
    info = prepared.info
    assert prepared.input_dtype == torch.int8
    assert info["input"]["mode"] == "int8-resident" and info["input"]["scale"] > 0
    assert info["stem"]["chosen"].startswith("int8+")
    stem_row = info["outside_layers"][0]
    assert stem_row["mode"] == "q" and stem_row["q_s"] > 0 and stem_row["kernel"].startswith("int8-pixel")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    pixels = prepared.make_input(x)
    assert pixels.dtype == torch.int8 and pixels.shape == (2, 4, 32, 32)
    with torch.inference_mode():
        agree = correctness.compare(prepared.run(pixels), resnet18(x), precision)
    assert not agree.flagged, agree
    assert prepared.faults() is None  # no split-K wait gave up (`split_k.faults`, asked after the timed runs)
