"""The classifier head at small batches in one kernel: global average pool and the fully connected layer.

Why: at batch 1 ResNet-50's head (the last activation [49, 2048] pooled, then 2048 → 1000 in fp32) takes
10.6 µs on an H200 (session 26, the per-layer rows of the main job) for about 8 MB of weights: `QuantNet.
run_head`'s torch path is four or five launches (a widening, a sum, a scale, cuBLAS and its bias) at a batch
where each launch costs more than its work. `head_kernel` does it in one: each program pools a slice of
channels of one image (int8 sums exact in fp32: |Σ| ≤ 127·49 < 2^24; fp8 widened exactly) and multiplies it
into ``BN`` rows of the fp32 weights, over all channels, then scales and adds the bias. Each program reads
the image's whole activation (100 KB at 224², from L2) for its rows of weights, so it pays only where the
batch is small (`MAX_BATCH`).

Offered only with ``DEEPGAP_QUANT_SMALL_BATCH=on`` (`tiles.small_batch_offered`) until a GPU has timed it;
then `stem_choice.choose_head` times it against the torch path at the configuration's batch and keeps the faster one
that agrees (relative L2 of the logits ≤ `AGREE_REL`).
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.kernels import pdl_enter
from deepgap.measure.quant.launch import check, launcher

MAX_BATCH = 8  # images; past it the per-program re-read of each image's activation outgrows the weights
AGREE_REL = 1e-5  # fp32 sums in another order than torch's: far below any quantization error
BN = 8  # classes per program: 125 programs an image for ImageNet's 1,000
BC = 64  # channels per step (128 spilled in fp8 under Triton 3.6: 255 registers)


@triton.jit(do_not_specialize=["P", "C", "N"])
def head_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, P, C, N, scale, BP: tl.constexpr, BC: tl.constexpr, BN: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """out[b, n] = scale · Σ_c W[n, c] · Σ_p x[b·P + p, c] + bias[n]: one image ``b``, ``BN`` classes."""
    pdl_enter(PDL)
    b = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rp = tl.arange(0, BP)
    n_ok = rn < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for c0 in range(0, C, BC):
        rc = c0 + tl.arange(0, BC)
        x = tl.load(x_ptr + (b * P + rp)[:, None] * C + rc[None, :], mask=(rp < P)[:, None], other=0.0)
        pooled = tl.sum(x.to(tl.float32), axis=0)
        w = tl.load(w_ptr + rn[:, None] * C + rc[None, :], mask=n_ok[:, None], other=0.0)
        acc += tl.sum(w * pooled[None, :], axis=1)
    bias = tl.load(b_ptr + rn, mask=n_ok, other=0.0)
    tl.store(out_ptr + b * N + rn, acc * scale + bias, mask=n_ok)


def head(x: torch.Tensor, batch: int, weight: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Logits [batch, N] in fp32 from the last activation ``x`` [batch·P, C] (int8, fp8 or fp16).

    ``scale`` is the activation's per-tensor scale over P (the pool's 1/P); ``weight`` [N, C] and ``bias`` [N]
    are fp32, as the torch path's are.
    """
    check(x.dim() == 2 and x.shape[0] % batch == 0 and x.is_contiguous(), "x must be contiguous [batch·P, C]")
    p, c = x.shape[0] // batch, x.shape[1]
    n = weight.shape[0]
    check(
        weight.dtype == torch.float32 and weight.shape == (n, c) and weight.is_contiguous(),
        f"weight must be contiguous fp32 [N, {c}]",
    )
    check(c % BC == 0, f"channels must be a multiple of {BC}; got {c}")
    out = torch.empty((batch, n), dtype=torch.float32, device=x.device)
    launcher(head_kernel, x.device)[(batch, triton.cdiv(n, BN))](
        x, weight, bias, out, p, c, n, float(scale), BP=triton.next_power_of_2(p), BC=BC, BN=BN, num_warps=4
    )
    return out
