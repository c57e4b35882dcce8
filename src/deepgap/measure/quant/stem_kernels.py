"""Triton kernels for the ResNet stem: the 7×7/2 convolution of the 3-channel image on tensor cores, max-pools.

Why: the per-layer table (`deepgap layers`) showed the stem — cuDNN's fp16 convolution, whose 3-channel
input suits none of its tensor-core kernels, writing a 16-bit output that the max-pool reads back — as
the largest single item of the quant engine at batch 256. Here the convolution is one GEMM whose K (7·7·3
= 147, zero-padded to a multiple of the K block) is gathered element by element from the NHWC image,
accumulated in fp32 from the same fp16 operands, and the stem's scale, bias, ReLU and quantization run in
its epilogue, so its output is written once in 8 bits. The max-pool then works on the quantized values:
the epilogue is monotone per channel (its scale is positive), so quantizing and then taking the maximum
equals taking the maximum and then quantizing, and after the ReLU every value is ≥ 0, so a window's
padding can read as 0. Loading a kernel row's 21 contiguous values per K step instead (no per-element
division) was slower (misaligned rows, seven K steps instead of five; docs/quant.md).

`maxpool_kernel` pools the fp16 output of the stem's cuDNN convolution instead (the `cudnn` stem),
with the stem's bias, ReLU and quantization moved behind the max for the same reason. All run on CPU
tensors through the Triton interpreter (`launch.interpreted`), as the tests do.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import OUT_KIND, _finish, check_out_res, window_origin
from deepgap.measure.quant.launch import INT32_LIMIT, check, check_vec, launcher, out_size

BLOCK_K = 32
POOL_BLOCK = 32  # output pixels per `maxpool8_kernel` program
POOLED = (torch.int8, torch.float8_e4m3fn, torch.float16)  # the stem outputs `pool8` takes


@triton.jit
def gather_dot(x_ptr, w_ptr, nb, ih0, iw0, m_ok, rn, H, W, C, N, KH, KW, KP, BM, BK):
    """Σ_k A[m, k]·W[n, k] in fp32: A gathered element by element from the fp16 NHWC image, K in (kh, kw, c)."""
    acc = tl.zeros((BM, N), dtype=tl.float32)
    for k0 in range(0, KP, BK):
        rk = k0 + tl.arange(0, BK)
        tap = rk // C
        c = rk - tap * C
        kh = tap // KW
        kw = tap - kh * KW
        ih = ih0[:, None] + kh[None, :]
        iw = iw0[:, None] + kw[None, :]
        ok = m_ok[:, None] & (rk < KH * KW * C)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_ptr + ((nb[:, None] * H + ih) * W + iw) * C + c[None, :], mask=ok, other=0.0)
        b = tl.load(w_ptr + rn[None, :] * KP + rk[:, None])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def pixel_rows_dot(x_ptr, w_ptr, nb, ih0, iw0, m_ok, rn, H, W, C, N, KH, KW, KP, BM, BK):
    """Σ_kh Σ_j A[m, kh, j]·W[n, kh·BK + j], exact in int32, as fp32: a K step is one kernel row of pixels.

    `deepgap.measure.quant.stem_int8`'s layout: ``C``-byte pixels, byte j of a row is tap j // C, channel
    j % C; a row's ``BK`` bytes are contiguous in the int8 image, so the gather is a base plus the byte
    index. The sums (|Σ| ≤ 127²·KH·BK < 2^24) are exact in fp32 too.
    """
    rj = tl.arange(0, BK)
    iw = iw0[:, None] + (rj // C)[None, :]
    col_ok = m_ok[:, None] & ((rj // C) < KW)[None, :] & (iw >= 0) & (iw < W)
    acc = tl.zeros((BM, N), dtype=tl.int32)
    for kh in range(KH):
        ih = ih0 + kh
        ok = col_ok & ((ih >= 0) & (ih < H))[:, None]
        a = tl.load(x_ptr + (((nb * H + ih) * W + iw0) * C)[:, None] + rj[None, :], mask=ok, other=0)
        b = tl.load(w_ptr + rn[None, :] * KP + kh * BK + rj[:, None])
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    return acc.to(tl.float32)


@triton.jit(do_not_specialize=["M", "H", "W", "OH", "OW"])
def stem_conv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    alpha_ptr,
    beta_ptr,
    M,
    H,
    W,
    OH,
    OW,
    C: tl.constexpr,
    N: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    KP: tl.constexpr,
    STRIDE: tl.constexpr,
    PAD: tl.constexpr,
    OUT_KIND: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    INT8_PIXELS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """out[m, n] = epilogue(Σ_k A[m, k]·W[n, k]) with ReLU; A gathered from NHWC ``x``, W [N, KP].

    Both stems: fp16 ``x`` with ``C`` channels (`gather_dot`), or, with ``INT8_PIXELS``, `stem_int8`'s
    int8 image of ``C``-byte pixels (`pixel_rows_dot`); one prologue, one epilogue.
    """
    pdl_enter(PDL)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, N)
    m_ok = rm < M
    nb, ih0, iw0 = window_origin(rm, OH, OW, STRIDE, PAD)
    if INT8_PIXELS:
        acc = pixel_rows_dot(x_ptr, w_ptr, nb, ih0, iw0, m_ok, rn, H, W, C, N, KH, KW, KP, BM, BK)
    else:
        acc = gather_dot(x_ptr, w_ptr, nb, ih0, iw0, m_ok, rn, H, W, C, N, KH, KW, KP, BM, BK)
    alpha = tl.load(alpha_ptr + rn)
    beta = tl.load(beta_ptr + rn)
    y = acc * alpha[None, :]
    out = _finish(y, beta[None, :], y, 0.0, True, False, OUT_KIND)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], out, mask=m_ok[:, None])


@triton.jit
def window_max(x_ptr, best, nb, ih0, iw0, p_ok, rc, c_ok, H, W, C, K: tl.constexpr, FILL: tl.constexpr):
    """``best`` [pixels, channels] raised to the max of NHWC ``x`` over each pixel's K×K window (both pools).

    ``nb``, ``ih0``, ``iw0`` are `window_origin`'s; a tap outside the image or a masked lane reads ``FILL``.
    Each value is taken in ``best``'s type: fp32 (widened), or int8 for `maxpool8_kernel`'s codes.
    """
    for kh in tl.static_range(K):
        for kw in tl.static_range(K):
            ih = ih0 + kh
            iw = iw0 + kw
            ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            row = ((nb * H + ih) * W + iw) * C
            v = tl.load(x_ptr + row[:, None] + rc[None, :], mask=ok[:, None] & c_ok[None, :], other=FILL)
            best = tl.maximum(best, v.to(best.dtype))
    return best


@triton.jit(do_not_specialize=["P", "H", "W", "OH", "OW"])
def maxpool8_kernel(
    x_ptr,
    out_ptr,
    P,
    H,
    W,
    OH,
    OW,
    C: tl.constexpr,
    K: tl.constexpr,
    STRIDE: tl.constexpr,
    PAD: tl.constexpr,
    BP: tl.constexpr,
    CODES: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """out[p, c] = max over the K×K window of NHWC ``x`` (values ≥ 0: padding reads as 0), same format.

    ``CODES`` (int8): the maximum of the int8 codes themselves (`pool8` says why); a code below 0 never
    wins over the 0 the maximum starts from. Otherwise each value is widened to fp32 and the maximum
    converted back.
    """
    pdl_enter(PDL)
    rp = tl.program_id(0) * BP + tl.arange(0, BP)
    rc = tl.arange(0, C)
    p_ok = rp < P
    nb, ih0, iw0 = window_origin(rp, OH, OW, STRIDE, PAD)
    best = tl.zeros((BP, C), dtype=tl.int8 if CODES else tl.float32)
    best = window_max(x_ptr, best, nb, ih0, iw0, p_ok, rc, rc < C, H, W, C, K, 0.0)
    tl.store(out_ptr + rp[:, None] * C + rc[None, :], best.to(out_ptr.dtype.element_ty), mask=p_ok[:, None])


def pad_weights(w_half: torch.Tensor, block_k: int = BLOCK_K) -> torch.Tensor:
    """[C_out, C_in, kh, kw] fp16 → [C_out, KP], K in (kh, kw, c) order, zero-padded (``block_k`` steps)."""
    n = w_half.shape[0]
    k = w_half[0].numel()
    kp = triton.cdiv(k, block_k) * block_k
    out = torch.zeros((n, kp), dtype=torch.float16, device=w_half.device)
    out[:, :k] = w_half.permute(0, 2, 3, 1).reshape(n, k)
    return out.contiguous()


def stem(
    x, nhw, w_gemm, ksize, stride, padding, alpha, beta, out_fmt, pool=(3, 2, 1), block_m=128, num_warps=4
):
    """NHWC image matrix ``x`` [nb·h·w, C] fp16 → the max-pooled, quantized stem output [nb·ph·pw, C_out].

    ``w_gemm`` is `pad_weights`'s [C_out, KP]; ``alpha`` (positive) and ``beta`` are the stem's epilogue.
    """
    from deepgap.measure.quant.layers import DTYPES

    nb, h, wd = nhw
    check(out_fmt in ("int8", "fp8"), f"the fused stem writes int8 or fp8; got {out_fmt!r}")
    check(
        x.dtype == torch.float16 and x.dim() == 2 and x.shape[0] == nb * h * wd and x.is_contiguous(),
        f"x must be a contiguous fp16 [nb·h·w={nb * h * wd}, C]; got {x.dtype} {tuple(x.shape)}",
    )
    c = x.shape[1]
    n, kp = w_gemm.shape
    check(
        w_gemm.dtype == torch.float16 and kp % BLOCK_K == 0 and kp >= ksize * ksize * c,
        f"w_gemm must be fp16 [C_out, KP ≥ {ksize * ksize * c}, a multiple of {BLOCK_K}]",
    )
    oh, ow, m = stem_output(x, n, (nb, h, wd), ksize, stride, padding, alpha, beta)
    conv = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    launcher(stem_conv_kernel, x.device)[(triton.cdiv(m, block_m),)](
        x,
        w_gemm,
        conv,
        alpha,
        beta,
        m,
        h,
        wd,
        oh,
        ow,
        C=c,
        N=n,
        KH=ksize,
        KW=ksize,
        KP=kp,
        STRIDE=stride,
        PAD=padding,
        OUT_KIND=OUT_KIND[out_fmt],
        BM=block_m,
        BK=BLOCK_K,
        num_warps=num_warps,
        enable_fp_fusion=False,
    )
    return pool8(conv, nb, oh, ow, pool)


def stem_output(x, n, nhw, ksize, stride, padding, alpha, beta) -> tuple[int, int, int]:
    """(oh, ow, nb·oh·ow) of a stem's convolution into ``n`` channels (a power of two), its epilogue checked.

    Both stems (this fp16 one and `deepgap.measure.quant.stem_int8`'s) write [nb·oh·ow, n] in 32-bit indexing.
    """
    nb, h, wd = nhw
    check(n == triton.next_power_of_2(n), f"C_out must be a power of two; got {n}")
    check_vec("alpha", alpha, n, x.device)
    check_vec("beta", beta, n, x.device)
    oh, ow = out_size(h, ksize, stride, padding), out_size(wd, ksize, stride, padding)
    m = nb * oh * ow
    check(
        max(x.numel(), m * n) <= INT32_LIMIT, "more than 2^31 elements (32-bit indexing); use a smaller batch"
    )
    return oh, ow, m


def pool8(
    conv: torch.Tensor, nb: int, oh: int, ow: int, pool=(3, 2, 1), block_p: int = POOL_BLOCK
) -> torch.Tensor:
    """`maxpool8_kernel` over a stem output [nb·oh·ow, C] (int8, fp8 or fp16; values ≥ 0) → [nb·ph·pw, C].

    int8 is pooled on its codes: for values ≥ 0 their order is the values' order, so the kernel skips
    widening each of the nine values to fp32 and rounding the maximum back. On one H200 (session 26,
    `benchmarks/stem_split.py`, batch 1024) that took int8's pool from 0.529 to 0.466 ms, but the same on
    e4m3 codes took fp8's from 0.308 to 0.465 ms (its converts are cheap, packed pairs), so fp8 and
    fp16 keep the fp32 maximum.
    """
    n = conv.shape[1]
    check(conv.dtype in POOLED, f"pool8 pools int8, fp8 or fp16 stem outputs; got {conv.dtype}")
    k, s, p = pool
    ph, pw = out_size(oh, k, s, p), out_size(ow, k, s, p)
    out = torch.empty((nb * ph * pw, n), dtype=conv.dtype, device=conv.device)
    launcher(maxpool8_kernel, conv.device)[(triton.cdiv(nb * ph * pw, block_p),)](
        conv,
        out,
        nb * ph * pw,
        oh,
        ow,
        ph,
        pw,
        C=n,
        K=k,
        STRIDE=s,
        PAD=p,
        BP=block_p,
        CODES=conv.dtype == torch.int8,
        num_warps=4,
    )
    return out


@triton.jit(do_not_specialize=["P", "H", "W", "OH", "OW"])
def maxpool_kernel(
    x_ptr,
    out_ptr,
    alpha_ptr,
    beta_ptr,
    P,
    C,
    H,
    W,
    OH,
    OW,
    K: tl.constexpr,
    STRIDE: tl.constexpr,
    PAD: tl.constexpr,
    RELU: tl.constexpr,
    OUT_KIND: tl.constexpr,
    BP: tl.constexpr,
    BC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[p, c] = epilogue(max over the K×K window of NHWC ``x``), P = batch·OH·OW output pixels."""
    pdl_enter(PDL)
    rp = tl.program_id(0) * BP + tl.arange(0, BP)
    rc = tl.arange(0, BC)
    p_ok = rp < P
    c_ok = rc < C
    nb, ih0, iw0 = window_origin(rp, OH, OW, STRIDE, PAD)
    best = tl.full((BP, BC), float("-inf"), dtype=tl.float32)
    best = window_max(x_ptr, best, nb, ih0, iw0, p_ok, rc, c_ok, H, W, C, K, float("-inf"))
    alpha = tl.load(alpha_ptr + rc, mask=c_ok, other=1.0)  # 1, not 0: masked lanes hold -inf (no NaN)
    beta = tl.load(beta_ptr + rc, mask=c_ok, other=0.0)
    y = best * alpha[None, :]
    out = _finish(y, beta[None, :], y, 0.0, RELU, False, OUT_KIND)
    tl.store(out_ptr + rp[:, None] * C + rc[None, :], out, mask=p_ok[:, None] & c_ok[None, :])


def maxpool(x, nhw, alpha, beta, out_fmt, relu, ksize=3, stride=2, padding=1, block_p=32):
    """Launch `maxpool_kernel` on NHWC ``x`` ([nb·h·w, C], fp16/fp32) → [nb·oh·ow, C] in ``out_fmt``."""
    from deepgap.measure.quant.layers import DTYPES

    nb, h, wd = nhw
    check(out_fmt in OUT_KIND, f"out_fmt must be one of {sorted(OUT_KIND)}; got {out_fmt!r}")
    check(x.dtype in (torch.float16, torch.float32), f"maxpool input must be fp16 or fp32; got {x.dtype}")
    check(
        x.dim() == 2 and x.shape[0] == nb * h * wd and x.is_contiguous(),
        f"x must be contiguous [nb·h·w={nb * h * wd}, C]; got {tuple(x.shape)}",
    )
    c = x.shape[1]
    check(
        x.numel() <= INT32_LIMIT, "input has more than 2^31 elements (32-bit indexing); use a smaller batch"
    )
    check_vec("alpha", alpha, c, x.device)
    check_vec("beta", beta, c, x.device)
    oh, ow = out_size(h, ksize, stride, padding), out_size(wd, ksize, stride, padding)
    p = nb * oh * ow
    out = torch.empty((p, c), dtype=DTYPES[out_fmt], device=x.device)
    check_out_res(out, None, p, c, x.device, out_fmt)
    launcher(maxpool_kernel, x.device)[(triton.cdiv(p, block_p),)](
        x,
        out,
        alpha,
        beta,
        p,
        c,
        h,
        wd,
        oh,
        ow,
        K=ksize,
        STRIDE=stride,
        PAD=padding,
        RELU=bool(relu),
        OUT_KIND=OUT_KIND[out_fmt],
        BP=block_p,
        BC=triton.next_power_of_2(c),
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out
