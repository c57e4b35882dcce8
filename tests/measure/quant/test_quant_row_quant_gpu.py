"""`quant.row_quant` compiled for the GPU: bit for bit the torch ops, and an 8-bit Linear through it gives the
torch path's output; captured in a CUDA graph (a served decoder's prefill replays it so)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deepgap.measure.quant.linear import LinearQuant, QuantLinear, quantize_codes, row_scales
from deepgap.measure.quant.row_quant import row_quant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("k", [4096, 14336, 1100])
def test_codes_equal_the_torch_ops_on_the_gpu(precision, k):
    if precision == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    torch.manual_seed(0)
    x = (torch.randn(513, k, device="cuda") * torch.logspace(-3, 3, 513, device="cuda")[:, None]).bfloat16()
    x[7] = 0
    codes, scales = row_quant(x, precision)
    s = row_scales(x, precision)
    assert torch.equal(scales, s)
    assert torch.equal(codes.view(torch.int8), quantize_codes(x, s, precision).view(torch.int8))


def test_a_linear_through_the_kernel_equals_the_torch_path_and_replays_in_a_graph(monkeypatch):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    torch.manual_seed(0)
    q = QuantLinear(nn.Linear(4096, 1024).cuda(), LinearQuant("fp8", "row"))
    x = torch.randn(300, 4096, device="cuda").bfloat16()
    with torch.inference_mode():
        want = q(x).clone()
        monkeypatch.setenv("DEEPGAP_QUANT_ROW_QUANT", "triton")
        assert torch.equal(q(x), want)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            q(x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = q(x)
        x.mul_(2.0)
        g.replay()
        assert torch.equal(out, q(x))
