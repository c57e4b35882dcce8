"""`deepgap.measure.quant.row_quant`: a row's amax, scale and 8-bit codes in one kernel, bit for bit the torch
ops `QuantLinear` runs (`linear.row_scales`, `linear.quantize_codes`); in Triton's interpreter here, on a GPU in
`test_quant_row_quant_gpu.py`. And when `QuantLinear` takes it: a GPU, outside a compile, with the switch."""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant import linear
from deepgap.measure.quant.linear import quantize_codes, row_scales
from deepgap.measure.quant.row_quant import row_quant


def rows(dtype: torch.dtype, precision: str = "fp8") -> torch.Tensor:
    """Rows of very different ranges (one all zeros, one of ties), a K past one block.

    The last row's amax is half its code range (a scale of exactly 0.5), so its quarters k/4 become codes k/2:
    int8 ties at odd k (to even), and 8.5 … 15.5 become 17 … 31, e4m3's ties between steps of 2 (to even).
    """
    torch.manual_seed(0)
    x = torch.randn(6, 1100) * torch.tensor([1e-3, 1.0, 30.0, 300.0, 0.0, 1.0]).view(6, 1)
    x[5] = (torch.arange(1100) % 9 - 4.0) / 4
    x[5, 10:18] = torch.arange(8) + 8.5
    x[5, 3] = linear.QMAX[precision] * 0.5
    return x.to(dtype)


@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_codes_and_scales_equal_the_torch_ops(precision, dtype):
    x = rows(dtype, precision)
    codes, scales = row_quant(x, precision)
    want_s = row_scales(x, precision)
    want = quantize_codes(x, want_s, precision)
    assert codes.dtype == want.dtype and codes.is_contiguous() and scales.shape == (6, 1)
    assert torch.equal(scales, want_s)
    assert torch.equal(codes.view(torch.int8), want.view(torch.int8))  # -0.0 and +0.0 told apart too
    assert torch.equal(scales[4], torch.tensor([linear.TINY / linear.QMAX[precision]]))  # the zero row
    assert scales[5].item() == 0.5
    if precision == "fp8":
        assert codes[5, 10].float().item() == 16.0  # 17 ties to even: 16, not 18
    else:
        assert codes[5, [1, 7]].tolist() == [-2, 2]  # -1.5 and 1.5 tie to even


def test_a_strided_view_and_no_rows():
    """A view of a wider buffer (rows apart by its stride) quantizes as its copy does; no rows give none."""
    wide = rows(torch.bfloat16).repeat(1, 2)
    view = wide[:, :1100]
    got = row_quant(view, "fp8")
    want = row_quant(view.contiguous(), "fp8")
    assert torch.equal(got[0].view(torch.int8), want[0].view(torch.int8)) and torch.equal(got[1], want[1])
    codes, scales = row_quant(torch.empty(0, 64), "int8")
    assert codes.shape == (0, 64) and scales.shape == (0, 1)
    with pytest.raises(ValueError, match="precision"):
        row_quant(view, "fp4")


def test_quant_linear_takes_it_only_on_a_gpu_outside_a_compile_when_asked(monkeypatch):
    x = rows(torch.bfloat16)
    assert not linear._row_kernel(x)  # a CPU tensor: the torch ops (the reference path runs here)

    class Cuda:  # what `_row_kernel` reads of a tensor
        device = torch.device("cuda")

        @staticmethod
        def stride(dim):
            return 1

    assert not linear._row_kernel(Cuda)  # off by default until a GPU has timed it
    monkeypatch.setenv("DEEPGAP_QUANT_ROW_QUANT", "triton")
    assert linear._row_kernel(Cuda)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not linear._row_kernel(Cuda)  # Inductor fuses the torch ops itself
