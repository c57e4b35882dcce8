"""The fused batch-1 GEMVs (`gemv_fused`) as torch custom ops: torch.compile keeps each one call, a graph captures it.

- `fused_gemv_op`: the norm folded in or handed over (`norm_handoff`), SwiGLU, a residual add;
- `handoff_gemv_op`: a residual add that also hands the next norm over, returning the row, the row ⊙ γ and
  the row's square sums (the buffers are the op's outputs, so a compiled step sees no mutation);
- `rope_gemv_op`: the qkv GEMV with RoPE and the K/V cache write.
"""

from __future__ import annotations

import torch

from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv
from deepgap.measure.quant.norm_handoff import HandOff, squares_width


@torch.library.custom_op("deepgap::fused_gemv", mutates_args=())
def fused_gemv_op(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    gamma: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    swiglu: bool,
    handed: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fused_gemv` of one row: ``handed`` (with ``eps``) the square sums of the row x is ``⊙ γ`` of."""
    return fused_gemv(x, codes, scale, Fusion(gamma, eps, swiglu, residual, handed=handed))


@fused_gemv_op.register_fake
def _(x, codes, scale, gamma, residual, eps, swiglu, handed=None):
    return x.new_empty((1, codes.shape[0] // (2 if swiglu else 1)), dtype=torch.bfloat16)


@torch.library.custom_op("deepgap::handoff_gemv", mutates_args=())
def handoff_gemv_op(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``residual + x · Wᵀ``, the next norm (scale ``gamma``) handed over: (row, row ⊙ γ, square sums)."""
    hand = HandOff.to(gamma)
    row = fused_gemv(x, codes, scale, Fusion(residual=residual, hand=hand))
    return row, hand.scaled, hand.squares


@handoff_gemv_op.register_fake
def _(x, codes, scale, residual, gamma):
    n = codes.shape[0]
    row = x.new_empty((1, n), dtype=torch.bfloat16)
    return row, torch.empty_like(row), x.new_empty((squares_width(n),), dtype=torch.float32)


@torch.library.custom_op("deepgap::rope_gemv", mutates_args=("k", "v"))
def rope_gemv_op(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    gamma: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    handed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The qkv GEMV with the norm and RoPE folded in (`RopeWrite`): q returned, k and v written into the cache.

    ``gamma`` None and ``handed`` given: the norm handed over (`norm_handoff`).
    """
    return fused_gemv(
        x, codes, scale, Fusion(gamma, eps, rope=RopeWrite(cos, sin, pos, k, v, heads), handed=handed)
    )


@rope_gemv_op.register_fake
def _(x, codes, scale, gamma, eps, cos, sin, pos, k, v, heads, handed=None):
    """One bf16 row of the query heads, for tracing."""
    return x.new_empty((1, heads * k.shape[3]), dtype=torch.bfloat16)
