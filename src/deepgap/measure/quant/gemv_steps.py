"""The fused one-row GEMV's K steps: one step on loaded weights, and the loop with the next step's loads ahead.

Why apart from `gemv_fused`: the row kernel (`gemv_fused.fused_row_kernel`) and the one-kernel step
(`deepgap.measure.llm_whole`) sum the same steps; the kernel's file keeps its launch and epilogue.
"""

# ruff: noqa: N803 - Triton's capitals

from __future__ import annotations

import triton
import triton.language as tl

from deepgap.measure.quant import gemv


@triton.jit
def fused_step(
    acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk,
    NORM: tl.constexpr, PAIRED: tl.constexpr, REDUCE: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """One K step of the row kernel on loaded weights: x's slice (``CACHE``: its loads'), its squares, products."""
    x = tl.load(x_ptr + k + rk, cache_modifier=CACHE).to(tl.float32)
    if NORM:
        squares += x * x
        x = x * tl.load(gamma_ptr + k + rk).to(tl.float32)
    acc = gemv.mac(acc, w, x, REDUCE)
    if PAIRED:  # the second row of the pair (SwiGLU's up row, RoPE's other half of the head)
        acc_up = gemv.mac(acc_up, w_up, x, REDUCE)
    return acc, acc_up, squares


@triton.jit
def k_loop(
    acc, acc_up, squares, w_ptrs, apart, x_ptr, gamma_ptr, K, rk,
    NORM: tl.constexpr, PAIRED: tl.constexpr, REDUCE: tl.constexpr, PDL: tl.constexpr, BK: tl.constexpr,
    AHEAD: tl.constexpr,
):  # fmt: skip
    """`gemv_fused.fused_row_kernel`'s K loop: each step's weights loaded, then summed (`fused_step`).

    With ``PDL`` the first step's weights are read before the wait for the previous kernel (they do not depend on
    it). ``AHEAD`` (`GemvTile.prefetch`): the next step's weights are in flight while this one is summed
    (`_ahead`); without, the loop is the one the kernel always had (its registers unchanged at sm_90).
    """
    if AHEAD:
        acc, acc_up, squares = _ahead(acc, acc_up, squares, w_ptrs, apart, x_ptr, gamma_ptr, K, rk, NORM, PAIRED,
                                      REDUCE, PDL, BK)  # fmt: skip
    else:
        if PDL:
            w = tl.load(w_ptrs)
            w_up = w
            if PAIRED:
                w_up = tl.load(w_ptrs + apart)
            tl.extra.cuda.gdc_wait()
            acc, acc_up, squares = fused_step(
                acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, 0, rk, NORM, PAIRED, REDUCE, ""
            )
        for k in range(PDL * BK, K, BK):
            w = tl.load(w_ptrs + k)
            w_up = w
            if PAIRED:
                w_up = tl.load(w_ptrs + apart + k)
            acc, acc_up, squares = fused_step(
                acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk, NORM, PAIRED, REDUCE, ""
            )
    return acc, acc_up, squares


@triton.jit
def _ahead(
    acc, acc_up, squares, w_ptrs, apart, x_ptr, gamma_ptr, K, rk,
    NORM: tl.constexpr, PAIRED: tl.constexpr, REDUCE: tl.constexpr, PDL: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """`k_loop` with the next step's weights loaded before this step is summed.

    Why: in a program of several K steps (down's 14336 in steps of 2048) each step's loads otherwise wait for the
    step before to be summed, and the arithmetic adds to the time instead of hiding under the loads (one H100,
    session 40: down's fp8 GEMV 10% over its tile's loads alone, gate_up's one step 2%).
    """
    w = tl.load(w_ptrs)
    w_up = tl.load(w_ptrs + apart) if PAIRED else w
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k in range(0, K, BK):
        more = (k + BK + rk)[None, :] < K  # the last step asks for nothing
        w_next = tl.load(w_ptrs + k + BK, mask=more, other=0.0)
        w_up_next = tl.load(w_ptrs + apart + k + BK, mask=more, other=0.0) if PAIRED else w_next
        acc, acc_up, squares = fused_step(acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk, NORM, PAIRED,
                                          REDUCE, "")  # fmt: skip
        w, w_up = w_next, w_up_next
    return acc, acc_up, squares
