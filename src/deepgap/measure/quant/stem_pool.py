"""The int8-pixel stem with its 3×3/2 max-pool in the same kernel: only the pooled output reaches memory.

Why: `stem_int8.stem` writes the 7×7/2 convolution's 8-bit output (112×112×64 per 224² image, 205 MB
at batch 256) and `stem_kernels.pool8` reads it back to write a quarter of it; docs/quant.md names that
round trip as a lever. Here each program owns a tile of R×C *pooled* positions of one image and computes
the convolution outputs its pool windows cover, as four parity planes — ``E_ab[t, u]`` is the convolution
at row 2(i+t)+a, column 2(j+u)+b — each one `stem_kernels.pixel_rows_dot` GEMM of R·C rows with the
stem's epilogue (scale, bias, ReLU, 8-bit quantization). The pool is separable and, on parity planes,

    pooled[t, u] = max(V0[t, u], V1[t, u], V1[t, u-1]),  V_b[t, u] = max(E0b[t, u], E1b[t, u], E1b[t-1, u])

so the only data movement is three one-step shifts (``tl.gather`` along the tile). A tile's first row and
column are the halo of its neighbours' windows: computed, never written (the tiles overlap by one pooled
row and column), so a tile writes (R-1)·(C-1) outputs for 4·R·C convolution outputs: 1.31× the
convolution's work at 8×8 and 224² (56 = 8·7), where the unfused stem writes, and pools read, 4× the
pooled bytes. (A separate halo GEMM instead of the overlap does no better at 56: its 2R+2C+1 positions
pad to a power of two, 5 convolution rows per pooled output either way at 8×8.)

Exact, by the same argument as `stem_int8.reference`: the epilogue is monotone per channel (its scale is
positive) and ends in a ReLU, so the maximum of the quantized codes is the code of the maximum; every
code is ≥ 0, so a window position outside the convolution's output (the pool's padding) reads as 0 and
never exceeds a window's real element. `stem_int8.reference` (convolution, epilogue, then max-pool) is
this kernel's reference, bit for bit, and so is the unfused kernel pair.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import OUT_KIND, _finish
from deepgap.measure.quant.launch import check, launcher, out_size
from deepgap.measure.quant.stem_int8 import ROW, checked
from deepgap.measure.quant.stem_kernels import pixel_rows_dot

# (pooled rows, pooled columns, warps, pipeline stages) the engine times: none spills compiled for sm_90 under
# Triton 3.8 (tests/measure/quant/test_quant_stem_pool.py); 16×16 on 8 warps, and 8×16 on 4 warps or 3
# stages, do. Under the H200's Triton 3.6 the first spills 92 bytes with fp8 out (benchmarks/compile_sm90.py).
CONFIGS = ((8, 8, 4, 3), (8, 8, 4, 1), (8, 16, 8, 1))


@triton.jit
def parity_plane(x_ptr, w_ptr, alpha, beta, nb, cr, cc, rn, H, W, OH, OW, N, KH, KW, KP, STRIDE, PAD,
                 OUT_KIND, BM, BK):  # fmt: skip
    """The stem's output codes at convolution positions (``cr``, ``cc``) in fp16 (exact); 0 off the output.

    0 stands for the pool's padding: every code is ≥ 0 after the ReLU, so it never wins a window.
    """
    ok = (cr >= 0) & (cr < OH) & (cc >= 0) & (cc < OW)
    acc = pixel_rows_dot(
        x_ptr, w_ptr, nb, cr * STRIDE - PAD, cc * STRIDE - PAD, ok, rn, H, W, 4, N, KH, KW, KP, BM, BK
    )  # 4: `stem_int8.PIXEL`, the bytes of a pixel
    y = acc * alpha[None, :]
    out = _finish(y, beta[None, :], y, 0.0, True, False, OUT_KIND)
    return tl.where(ok[:, None], out.to(tl.float16), 0.0)


@triton.jit
def shifted(v, rm, s):
    """``v[m - s]`` for each row m of the tile (row 0 where m < s: those rows are the halo, not written)."""
    idx = tl.broadcast_to(tl.maximum(rm - s, 0)[:, None], v.shape)
    return tl.gather(v, idx, 0)


@triton.jit(do_not_specialize=["H", "W", "OH", "OW", "PH", "PW", "TR", "TC"])
def stem_pool_kernel(
    x_ptr, w_ptr, out_ptr, alpha_ptr, beta_ptr, H, W, OH, OW, PH, PW, TR, TC,
    N: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, KP: tl.constexpr, STRIDE: tl.constexpr,
    PAD: tl.constexpr, OUT_KIND: tl.constexpr, R: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """out[(n, i, j), :] = max over the 3×3/2 pad-1 window of the stem's quantized convolution (see above).

    Program ``pid`` is image ``pid // (TR·TC)``'s tile ``pid % (TR·TC)``: pooled rows from
    ``tr·(R-1) - 1``, columns from ``tc·(C-1) - 1``, its first row and column the halo.
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    nb1 = pid // (TR * TC)
    tile = pid - nb1 * (TR * TC)
    i0 = (tile // TC) * (R - 1) - 1
    j0 = (tile % TC) * (C - 1) - 1
    rm = tl.arange(0, R * C)
    t = rm // C
    u = rm - t * C
    nb = nb1 + tl.zeros_like(rm)
    ci = 2 * (i0 + t)  # the even convolution row of pooled row i0 + t (stride 2, pad 1: 2i - 1 .. 2i + 1)
    cj = 2 * (j0 + u)
    rn = tl.arange(0, N)
    alpha = tl.load(alpha_ptr + rn)
    beta = tl.load(beta_ptr + rn)
    e11 = parity_plane(x_ptr, w_ptr, alpha, beta, nb, ci + 1, cj + 1, rn, H, W, OH, OW, N, KH, KW, KP,
                       STRIDE, PAD, OUT_KIND, R * C, BK)  # fmt: skip
    v1 = tl.maximum(e11, shifted(e11, rm, C))
    e01 = parity_plane(x_ptr, w_ptr, alpha, beta, nb, ci, cj + 1, rn, H, W, OH, OW, N, KH, KW, KP, STRIDE,
                       PAD, OUT_KIND, R * C, BK)  # fmt: skip
    v1 = tl.maximum(v1, e01)
    best = tl.maximum(v1, shifted(v1, rm, 1))
    e10 = parity_plane(x_ptr, w_ptr, alpha, beta, nb, ci + 1, cj, rn, H, W, OH, OW, N, KH, KW, KP, STRIDE,
                       PAD, OUT_KIND, R * C, BK)  # fmt: skip
    best = tl.maximum(best, tl.maximum(e10, shifted(e10, rm, C)))
    e00 = parity_plane(x_ptr, w_ptr, alpha, beta, nb, ci, cj, rn, H, W, OH, OW, N, KH, KW, KP, STRIDE, PAD,
                       OUT_KIND, R * C, BK)  # fmt: skip
    best = tl.maximum(best, e00)
    pi = i0 + t
    pj = j0 + u
    keep = (t > 0) & (u > 0) & (pi < PH) & (pj < PW)
    row = (nb1 * PH + pi) * PW + pj
    tl.store(out_ptr + row[:, None] * N + rn[None, :], best.to(out_ptr.dtype.element_ty), mask=keep[:, None])


def tile_grid(ph: int, pw: int, tile: tuple[int, int]) -> tuple[int, int]:
    """(tile rows, tile columns) covering a ph×pw pooled output with ``tile``'s tiles overlapping by one."""
    r, c = tile
    return triton.cdiv(ph, r - 1), triton.cdiv(pw, c - 1)


def stem(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, tile=(8, 8), num_warps=4, num_stages=3):
    """`stem_int8.stem`'s arguments (pixels, packed weights, epilogue) → the same pooled output, one kernel.

    The pool is ResNet's 3×3/2 pad 1 (the kernel's parity planes are that pool's); ``tile`` is the
    program's (pooled rows, pooled columns), both powers of two ≥ 2.
    """
    from deepgap.measure.quant.layers import DTYPES

    nb, h, wd, n, kp, (oh, ow, _) = checked(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt)
    r, c = tile
    check(
        min(r, c) >= 2 and r * c >= 16 and r == triton.next_power_of_2(r) and c == triton.next_power_of_2(c),
        f"the pooled tile must be powers of two ≥ 2 with ≥ 16 positions; got {tile}",
    )
    ph, pw = out_size(oh, 3, 2, 1), out_size(ow, 3, 2, 1)
    out = torch.empty((nb * ph * pw, n), dtype=DTYPES[out_fmt], device=x.device)
    tr, tc = tile_grid(ph, pw, tile)
    xm = x.permute(0, 2, 3, 1).contiguous()  # a no-op for channels_last pixels
    launcher(stem_pool_kernel, x.device)[(nb * tr * tc,)](
        xm, w_i8, out, alpha, beta, h, wd, oh, ow, ph, pw, tr, tc, N=n, KH=ksize, KW=ksize, KP=kp,
        STRIDE=stride, PAD=padding, OUT_KIND=OUT_KIND[out_fmt], R=r, C=c, BK=ROW, num_warps=num_warps,
        num_stages=num_stages, enable_fp_fusion=False,
    )  # fmt: skip
    return out
