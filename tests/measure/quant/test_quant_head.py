"""The fused average-pool + classifier head (`quant.head`) in the Triton interpreter, against torch's path.

int8 pools exactly in fp32 (|Σ| < 2^24) and fp8/fp16 widen exactly, so the only difference from
`QuantNet.run_head`'s torch path is the order of the classifier's fp32 sums: within `head.AGREE_REL`,
the bound the engine's choice holds the kernel to on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

triton = pytest.importorskip("triton")

from deepgap.measure.quant import head, layers  # noqa: E402
from deepgap.measure.quant.stem_choice import choose_head  # noqa: E402


def _torch_head(x, batch, weight, bias, scale):
    """`QuantNet.run_head`'s torch path: pool in fp32 (fp8 through fp16), then the fp32 classifier."""
    y = x.view(batch, -1, x.shape[1])
    pooled = y.to(torch.float16).sum(1, dtype=torch.float32) if y.dtype != torch.int8 else y.sum(1).float()
    return F.linear(pooled * scale, weight, bias)


@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp16"])
def test_the_fused_head_equals_the_torch_path(fmt):
    g = torch.Generator().manual_seed(0)
    batch, p, c, n = 2, 49, 256, 1000  # 7×7 pooled (BP pads to 64), 1,000 classes (the last program masked)
    x = torch.randn(batch * p, c, generator=g).relu() * 20
    x = layers.quantize_act(x, fmt) if fmt != "fp16" else x.half()
    weight, bias = torch.randn(n, c, generator=g) * 0.05, torch.randn(n, generator=g)
    scale = 0.05 / p
    got = head.head(x, batch, weight, bias, scale)
    ref = _torch_head(x, batch, weight, bias, scale)
    assert got.shape == (batch, n) and got.dtype == torch.float32
    assert float((got - ref).norm() / ref.norm()) <= head.AGREE_REL


def test_bad_operands_are_refused():
    x = torch.zeros(49, 256, dtype=torch.int8)
    with pytest.raises(ValueError, match="fp32"):
        head.head(x, 1, torch.zeros(10, 256, dtype=torch.float16), torch.zeros(10), 1.0)
    with pytest.raises(ValueError, match="multiple of"):
        head.head(x[:, :100].contiguous(), 1, torch.zeros(10, 100), torch.zeros(10), 1.0)


def test_the_choice_keeps_the_torch_head_off_a_gpu():
    class Net:
        head_backend = "triton"

    net = Net()
    info = choose_head(net, 1, "cpu", use_triton=True)
    assert net.head_backend == "torch" and info == {"chosen": "torch", "reason": "needs Triton on a GPU"}
