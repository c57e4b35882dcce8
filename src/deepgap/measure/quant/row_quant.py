"""Per-row (per-token) activation quantization in one kernel: each row's amax, its scale and its 8-bit codes.

Why: an 8-bit Linear that quantizes its input per row (`deepgap.measure.quant.linear`, ``act_scale="row"``)
runs, eager, ``abs``, ``amax``, a cast to fp32, a divide, a clamp and a cast to 8 bits: six passes over the
rows, about 33 bytes of traffic per element (fp32 intermediates) against this kernel's 3 (the row read twice,
mostly from L2, and its codes written once). At the 8B shape that is about 0.8 MB per token and layer over
the four Linears' inputs, which an eager prefill (a served decoder's admissions, replayed in CUDA graphs:
`deepgap.serving.worker.llm_prefill`) pays at HBM's rate. Under ``torch.compile`` Inductor fuses the same ops
itself (with the norm before them), so `QuantLinear` takes this kernel only outside a compile.

Exactly the reference's arithmetic (`linear.row_scales`, `linear.quantize_codes`): the scale is
``max(amax, TINY) / qmax`` in fp32, each code ``x / scale`` divided with IEEE rounding (``div_rn``: Triton's
``/`` is approximate in fp32), clamped to ±qmax and rounded half to even (int8 through the engine's magic
number, `kernels.stored`; fp8 by the GPU's ``cvt.rn.satfinite``, and in Triton's interpreter through
`rope_store.e4m3_rne` first, since its own cast misrounds where rounding carries into the exponent).
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.kernels import stored
from deepgap.measure.quant.launch import check, launcher
from deepgap.measure.quant.rope_store import e4m3_rne

# `linear.QMAX` and `linear.TINY` again, not imported: `linear` imports this module (an import cycle otherwise);
# the tests hold the codes and the all-zero row's scale to linear's own
QMAX = {"fp8": 448.0, "int8": 127.0}  # as `linear.QMAX`
TINY = 1e-12  # as `linear.TINY`: an all-zero row's amax, so that its scale stays finite
BLOCK = 1024  # elements of a row a program loads a step (8 bf16 a thread at 4 warps)


@triton.jit
def row_quant_kernel(
    x_ptr, codes_ptr, scale_ptr, K, stride, QMAX: tl.constexpr, TINY: tl.constexpr, FP8: tl.constexpr,
    RNE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program a row: its amax over K, then its codes (module doc); the scale to ``scale_ptr[row]``."""
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * stride
    rk = tl.arange(0, BLOCK)
    top = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(0, K, BLOCK):
        v = tl.load(src + k + rk, mask=k + rk < K, other=0.0).to(tl.float32)
        top = tl.maximum(top, tl.abs(v))
    scale = tl.maximum(tl.max(top, axis=0), TINY) / QMAX  # IEEE: a scalar's division is exact in both
    tl.store(scale_ptr + row, scale)
    dst = codes_ptr + row * K
    for k in range(0, K, BLOCK):
        mask = k + rk < K
        v = tl.load(src + k + rk, mask=mask, other=0.0).to(tl.float32)
        y = tl.div_rn(v, tl.full((BLOCK,), 0.0, tl.float32) + scale)
        if FP8:
            y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
            if RNE:  # a zero keeps its sign, as the GPU's cast keeps it
                y = tl.where(y == 0.0, y, e4m3_rne(y))
            tl.store(dst + k + rk, stored(y, 1), mask=mask)
        else:
            tl.store(dst + k + rk, stored(y, 0), mask=mask)


def row_quant(x: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes (M, K), scales (M, 1) fp32)`` of a row-major 2-D ``x`` (bf16, fp16 or fp32), per row.

    The codes are e4m3 (``precision`` "fp8") or int8, contiguous; bit for bit `linear.quantize_codes` at
    `linear.row_scales`'s scales.
    """
    check(precision in QMAX, f"precision must be one of {sorted(QMAX)}; got {precision!r}")
    check(x.dim() == 2 and x.stride(1) == 1, "x: a 2-D tensor with contiguous rows")
    check(x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"x: bf16, fp16 or fp32; got {x.dtype}")
    m, k = x.shape
    fp8 = precision == "fp8"
    codes = torch.empty((m, k), dtype=torch.float8_e4m3fn if fp8 else torch.int8, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        launcher(row_quant_kernel, x.device)[(m,)](
            x, codes, scales, k, x.stride(0), QMAX=QMAX[precision], TINY=TINY, FP8=fp8,
            RNE=fp8 and x.device.type == "cpu", BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False,
        )  # fmt: skip
    return codes, scales
