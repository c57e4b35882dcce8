"""The head's average pool in one Triton kernel, chosen against torch's by time (`stem_choice.choose_head`).

Why: at batch 1 the per-layer table (session 29, one H200) names the head first, 10.3 µs of ResNet-50's
0.262 ms, for a [49, 2048] sum and a 1000 × 2048 classifier. Torch runs it as four kernels on fp8 (widen to
fp16, sum, scale, the classifier) and three on int8. Here one kernel sums each image's positions in fp32 and
applies the tensor's scale and 1/(H·W), so the head is two kernels: this and cuBLAS's classifier.

Unlike session 26's fused head (pool and classifier in one kernel, 125 programs each pooling the whole image
in a loop of loads that fed no dot: 25.6 µs against torch's 9.6, so dropped), a program here pools one block
of channels of one image in a single load of all its positions, and the classifier stays cuBLAS's. int8
codes sum exactly in fp32 (|Σ| ≤ 127·H·W), so int8 logits equal torch's bit for bit; fp8 and fp16 sums may
differ from torch's in their last bit (another order). `stem_choice.choose_head` keeps this kernel only where
it is faster at the run's batch and its logits agree with torch's.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.launch import check, launcher

BLOCK_C = 128  # channels a program


@triton.jit(do_not_specialize=["HW", "C"])
def pool_kernel(y_ptr, out_ptr, HW, C, scale, BR: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False):
    """out[b, c] = scale · Σ_{p < HW} y[b·HW + p, c] in fp32, for one image ``b`` and ``BC`` channels a program.

    ``PDL``: inside `launch.pdl` (the batch-1 graph's programmatic dependent launch) it waits for the last
    convolution's writes before its first load, as every kernel of the network does (`gdc.pdl_enter`).
    """
    pdl_enter(PDL)
    b = tl.program_id(0)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    c_ok = rc < C
    acc = tl.zeros((BC,), dtype=tl.float32)
    for r0 in tl.range(0, HW, BR):
        rr = r0 + tl.arange(0, BR)
        ok = (rr < HW)[:, None] & c_ok[None, :]
        v = tl.load(y_ptr + (b * HW + rr)[:, None] * C + rc[None, :], mask=ok, other=0.0)
        acc += tl.sum(v.to(tl.float32), axis=0)
    tl.store(out_ptr + b * C + rc, acc * scale, mask=c_ok)


def pool(y: torch.Tensor, batch: int, scale: float, backend: str = "triton") -> torch.Tensor:
    """NHWC rows ``y`` [batch·H·W, C] (int8, fp8 or fp16) → fp32 [batch, C]: each image's sum times ``scale``.

    ``backend`` 'triton' launches `pool_kernel` (interpreted on CPU tensors); anything else is torch's path.
    """
    check(y.dim() == 2 and y.shape[0] % batch == 0, f"y must be [batch·H·W, C] rows; got {tuple(y.shape)}")
    hw, c = y.shape[0] // batch, y.shape[1]
    if backend != "triton":
        v = y.view(batch, hw, c)
        if v.dtype == torch.int8:
            pooled = v.sum(1, dtype=torch.int32).float()
        elif v.dtype in (torch.float16, torch.float32):
            pooled = v.sum(1, dtype=torch.float32)
        else:  # fp8 has no reduction kernels; widening to fp16 is exact
            pooled = v.to(torch.float16).sum(1, dtype=torch.float32)
        return pooled * scale
    y = y.contiguous()
    out = torch.empty((batch, c), dtype=torch.float32, device=y.device)
    rows = min(64, triton.next_power_of_2(hw))
    launcher(pool_kernel, y.device)[(batch, triton.cdiv(c, BLOCK_C))](
        y, out, hw, c, float(torch.tensor(scale, dtype=torch.float32)), BR=rows, BC=BLOCK_C, num_warps=4
    )
    return out
