"""The fused stem (`quant.stem_kernels`) on the CPU through the Triton interpreter vs a float64 reference.

The kernel accumulates the fp16 operands in fp32 where the reference is exact, so an 8-bit output may
differ by one step where the exact value sits on a rounding boundary: at most 1 (int8) and rarely. The
interpreter's fp8 rounding is wrong near binade edges, so fp8 is checked loosely here and exactly on the GPU
(tests/measure/quant/test_quant_gpu.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

triton = pytest.importorskip("triton")

from deepgap.measure.quant import layers, stem_kernels  # noqa: E402


def _reference(x, w, alpha, beta, out_fmt):
    y = F.conv2d(x.double(), w.double(), None, 2, 3)
    pooled = F.max_pool2d(y, 3, 2, 1)  # max before the epilogue, as the engine's torch path does
    flat = pooled.permute(0, 2, 3, 1).reshape(-1, y.shape[1]).float()
    return layers.epilogue_reference(flat, alpha, beta, out_fmt, True)


@pytest.mark.parametrize("out_fmt", ["int8", "fp8"])
@pytest.mark.parametrize("hw", [(32, 32), (29, 35)])
def test_fused_stem_matches_the_exact_reference(out_fmt, hw):
    g = torch.Generator().manual_seed(0)
    h, w_ = hw
    x = torch.randn(2, 3, h, w_, generator=g).half()
    w = (torch.randn(64, 3, 7, 7, generator=g) * 0.2).half()
    alpha = torch.rand(64, generator=g) * 4 + 0.5
    beta = torch.randn(64, generator=g)
    ref = _reference(x, w, alpha, beta, out_fmt)
    xm = x.permute(0, 2, 3, 1).contiguous().reshape(-1, 3)
    out = stem_kernels.stem(xm, (2, h, w_), stem_kernels.pad_weights(w), 7, 2, 3, alpha, beta, out_fmt)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    o, r = out.float(), ref.float()
    if out_fmt == "int8":
        d = (o - r).abs()
        assert d.max() <= 1 and (d > 0).float().mean() < 0.01, (float(d.max()), float((d > 0).float().mean()))
    else:  # the interpreter misrounds fp32 → e4m3 near binade edges (test_quant_kernels); the GPU's is exact
        close = (o - r).abs() <= r.abs() / 2 + 2**-8
        assert bool(close.all()) and float((o == r).float().mean()) > 0.9, float((o == r).float().mean())


def test_pad_weights_orders_k_as_kh_kw_c_and_pads_with_zeros():
    w = torch.arange(2 * 3 * 7 * 7, dtype=torch.float32).reshape(2, 3, 7, 7).half()
    p = stem_kernels.pad_weights(w)
    assert p.shape == (2, 160) and not p[:, 147:].any()
    assert p[1, 0] == w[1, 0, 0, 0] and p[1, 1] == w[1, 1, 0, 0] and p[1, 3] == w[1, 0, 0, 1]


def test_bad_input_is_refused():
    x = torch.zeros(4, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="fp16"):
        stem_kernels.stem(
            x, (1, 2, 2), torch.zeros(64, 160).half(), 7, 2, 3, torch.ones(64), torch.zeros(64), "int8"
        )
    with pytest.raises(ValueError, match="int8 or fp8"):
        stem_kernels.stem(
            x.half(), (1, 2, 2), torch.zeros(64, 160).half(), 7, 2, 3, torch.ones(64), torch.zeros(64), "fp16"
        )


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float16])
@pytest.mark.parametrize("hw", [(8, 8), (7, 9)])
def test_pool8_takes_the_max_of_the_codes_bit_for_bit(dtype, hw):
    """The max-pool of values ≥ 0 is the float max: int8 pooled on its codes, fp8 and fp16 widened to fp32.

    int8's output is compared code for code; fp8's and fp16's by value (a window of zeros of either sign
    may write either zero: the fp32 maximum's choice, as before session 26). -0.0 (e4m3's 0x80, fp16's
    0x8000) and the padding never win over a positive value.
    """
    g = torch.Generator().manual_seed(3)
    h, w = hw
    vals = torch.rand(2 * h * w, 64, generator=g) * 100
    vals[torch.rand(vals.shape, generator=g) < 0.2] = 0.0
    vals[torch.rand(vals.shape, generator=g) < 0.2] = -0.0
    vals[: h * w, 5] = -0.0  # a channel of one image all -0.0
    conv = vals.round().to(dtype) if dtype == torch.int8 else vals.to(dtype)
    out = stem_kernels.pool8(conv, 2, h, w)
    floats = conv.float().reshape(2, h, w, 64).permute(0, 3, 1, 2)
    ref = F.max_pool2d(floats, 3, 2, 1).permute(0, 2, 3, 1).reshape(-1, 64).to(dtype)
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.equal(out.float(), ref.float())
    assert bool((out.float() >= 0).all()) and bool((out.float() > 0).any())
    if dtype == torch.int8:
        assert torch.equal(out, ref)


def test_pool8_refuses_32_bit_values():
    with pytest.raises(ValueError, match="int8, fp8 or fp16"):
        stem_kernels.pool8(torch.zeros(16, 64), 1, 4, 4)
