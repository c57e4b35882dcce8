"""Triton kernels of the quant engine: implicit-GEMM convolution with a fused epilogue, and its epilogue alone.

Why these: a quantized CNN layer is one GEMM (M = batch·H_out·W_out, N = C_out, K = k·k·C_in)
whose epilogue carries everything else — per-channel scale, bias, residual add, ReLU, requantization
— so an activation is written once, in 8 bits, and read once by the next layer.

  conv_gemm_kernel   A gathered on the fly from NHWC int8/fp8 activations (no im2col buffer), B the
                     weights as [C_out, (kh, kw, c)] K-major (what Hopper's 8-bit wgmma wants), one
                     flattened K loop so Triton software-pipelines every tap; epilogue as below.
  (maxpool_kernel, the stem's pooling behind its cuDNN convolution, is in `stem_kernels`.)
  epilogue_kernel    the same epilogue over a ready [M, N] tensor: finishes layers that run in fp16
                     (cuDNN conv) and converts between activation formats.

The epilogue, identical everywhere (and in ``layers.epilogue_reference``, which mirrors it op by op):
    y = acc·α[n];  y = y + β[n];  y = y + γ·res (if any);  y = max(y, 0) (if ReLU)
    int8: round-half-even(clamp(y, −127, 127))    fp8 (e4m3): clamp(y, −448, 448) rounded    fp16: y
Kernels run with ``enable_fp_fusion=False`` so the GPU rounds exactly like the reference (no FMA).
int8 conversions avoid the GPU's quarter-rate converters (I2F, FRND, F2I), which made the int8
epilogue ~3× heavier than fp8's and memory-bound residual layers twice as slow: a value v in
[−2²², 2²²] and the float 1.5·2²³ added together put round-half-even(v) in the low mantissa bits, so
rounding is one FADD plus a bitcast, and an int8 residual becomes fp32 by the same identity reversed.

Every kernel also runs on CPU tensors through the Triton interpreter (`launch.interpreted`), which is how the
tests check them without a GPU.
"""

# Triton convention: compile-time (constexpr) parameters in capitals; constexpr branches stay if/else.
# ruff: noqa: N803, SIM108

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant import launch, split_k
from deepgap.measure.quant.gdc import pdl_enter, pdl_launch, pdl_wait
from deepgap.measure.quant.launch import INT32_LIMIT, check, check_vec, launcher, out_size

OUT_KIND = {"int8": 0, "fp8": 1, "fp16": 2}
MAGIC = tl.constexpr(
    12582912.0
)  # 1.5·2²³: x + MAGIC holds round-half-even(x) in its low mantissa bits, |x| ≤ 2²²
MAGIC_BITS = tl.constexpr(0x4B400000)  # the bit pattern of MAGIC


@triton.jit
def _widen(v):
    """Widen to fp32; int8 through the magic-number identity (no quarter-rate I2F)."""
    if v.dtype == tl.int8:
        bits = v.to(tl.int32) + MAGIC_BITS
        f = bits.to(tl.float32, bitcast=True) - MAGIC
    else:
        f = v.to(tl.float32)
    return f


@triton.jit
def _load_f32(ptrs, mask):
    """Load and widen to fp32."""
    return _widen(tl.load(ptrs, mask=mask, other=0.0))


@triton.jit
def _finish(y, beta, r, gamma, RELU: tl.constexpr, HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr):
    """Epilogue after the per-channel multiply: bias, residual, ReLU, cast/requantize."""
    y = y + beta
    if HAS_RES:
        y = y + r * gamma
    if RELU:
        y = tl.maximum(y, 0.0)
    return stored(y, OUT_KIND)


@triton.jit
def stored(y, OUT_KIND: tl.constexpr):
    """``y`` in the output's format: int8 (round-half-even, clamped to ±127), fp8 e4m3 (clamped to ±448), fp16."""
    if OUT_KIND == 0:
        q = tl.minimum(tl.maximum(y, -127.0), 127.0) + MAGIC
        out = q.to(tl.int32, bitcast=True).to(tl.int8)  # low byte = the rounded value
    elif OUT_KIND == 1:
        out = tl.minimum(tl.maximum(y, -448.0), 448.0).to(tl.float8e4nv)
    else:
        out = y.to(tl.float16)
    return out


@triton.jit
def window_origin(r, OH, OW, STRIDE, PAD):
    """Image, first input row and column of output pixels ``r`` (batch·OH·OW order): conv and pool windows."""
    rem = r % (OH * OW)
    return r // (OH * OW), (rem // OW) * STRIDE - PAD, (rem % OW) * STRIDE - PAD


@triton.jit
def _grouped_tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Program ``pid``'s (row, column) tile, GROUP_M row tiles at a time (the weights' tiles stay cached)."""
    num_pid_m = (M + BM - 1) // BM  # not tl.cdiv: a jit helper the explicit interpreter cannot call
    group = GROUP_M * (N // BN)
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % group) % size_m, (pid % group) // size_m


@triton.jit
def _mma(a, b, acc, ACC_INT: tl.constexpr):
    """``acc + a·b``: int32 accumulation for int8 operands, fp32 for fp8."""
    if ACC_INT:
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["M", "H", "W", "OH", "OW"])
def conv_gemm_kernel(
    x_ptr, w_ptr, out_ptr, alpha_ptr, beta_ptr, res_ptr, gamma, M, N, C, H, W, OH, OW, ws_ptr, cnt_ptr,
    KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, RELU: tl.constexpr,
    HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr, ACC_INT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, GROUP_M: tl.constexpr, EARLY_RES: tl.constexpr = False, SPLIT: tl.constexpr = 1,
    PDL: tl.constexpr = False, SPREAD: tl.constexpr = False, PARTS: tl.constexpr = 1, AHEAD: tl.constexpr = False,
):  # fmt: skip
    """out[M, N] = epilogue(Σ_k A[m, k]·W[n, k]); A is the implicit im2col of NHWC ``x``.

    ``EARLY_RES`` issues the residual tile's load before the K loop, in its stored 8- or 16-bit form,
    so that its memory latency overlaps the main loop instead of following it: a 1×1 layer with few
    input channels runs one K step, and its epilogue (residual in, output out) is most of its time.
    ``SPLIT`` > 1 (`quant.split_k`): the grid's second axis splits K in that many slices, and the
    program that finishes a tile's last slice adds the partials (``ws_ptr``, ticket ``cnt_ptr``) and
    runs the epilogue (`split_k.split_sum`); not with ``EARLY_RES``. ``SPREAD`` (a GPU): ``PARTS`` of the
    slices' programs each sum and finish a band of the tile instead (`split_k.spread_sum`). ``AHEAD`` (under
    PDL, `launch.constants_ahead`): α and β, which no kernel writes, load before the wait, not after the K loop.
    """
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    pdl_launch(PDL)
    if AHEAD:
        alpha = tl.load(alpha_ptr + rn)
        beta = tl.load(beta_ptr + rn)
    pdl_wait(PDL)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    ktot = KH * KW * C
    if SPLIT > 1:
        # a whole number of BK steps (the launch checks it): said, so the loads keep their 16-byte vectors
        k_lo = tl.multiple_of(tl.program_id(1) * (ktot // SPLIT), BK)
        k_hi = k_lo + ktot // SPLIT
    else:
        k_lo = 0
        k_hi = ktot
    if ACC_INT:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    w_ptrs = w_ptr + rn[None, :] * ktot + rk[:, None]
    offs = rm[:, None] * N + rn[None, :]
    r_early = acc  # replaced by the residual's tile with EARLY_RES, unused without
    if HAS_RES and EARLY_RES:
        r_early = tl.load(res_ptr + offs, mask=m_ok[:, None], other=0.0)
    if KH == 1 and KW == 1 and STRIDE == 1 and PAD == 0:
        a_ptrs = x_ptr + rm[:, None] * C + rk[None, :]
        for k in range(k_lo, k_hi, BK):
            a = tl.load(a_ptrs + k, mask=m_ok[:, None], other=0.0)
            acc = _mma(a, tl.load(w_ptrs + k), acc, ACC_INT)
    else:
        nb, ih0, iw0 = window_origin(rm, OH, OW, STRIDE, PAD)
        for k in range(k_lo, k_hi, BK):
            tap = k // C
            c0 = k - tap * C
            kh = tap // KW
            kw = tap - kh * KW
            ih = ih0 + kh
            iw = iw0 + kw
            ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            row = ((nb * H + ih) * W + iw) * C
            a = tl.load(x_ptr + row[:, None] + (c0 + rk)[None, :], mask=ok[:, None], other=0.0)
            acc = _mma(a, tl.load(w_ptrs + k), acc, ACC_INT)
    last = True  # without split-K every program finishes its tile
    if SPLIT > 1:
        if SPREAD:
            acc, offs, m_ok, last = split_k.spread_sum(acc, ws_ptr, cnt_ptr, offs, m_ok, M, N, pid_m * BM, rn, SPLIT,
                                                       PARTS, BM, BN)  # fmt: skip
        else:
            acc, last = split_k.split_sum(acc, ws_ptr, cnt_ptr, offs, m_ok, M, N, SPLIT)
    if last:
        if not AHEAD:
            alpha = tl.load(alpha_ptr + rn)
            beta = tl.load(beta_ptr + rn)
        _conv_epilogue(acc, out_ptr, alpha, beta, res_ptr, gamma, offs, m_ok, r_early, RELU, HAS_RES, OUT_KIND,
                       EARLY_RES)  # fmt: skip


@triton.jit
def _conv_epilogue(
    acc, out_ptr, alpha, beta, res_ptr, gamma, offs, m_ok, r_early, RELU: tl.constexpr,
    HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr, EARLY_RES: tl.constexpr,
):  # fmt: skip
    """`conv_gemm_kernel`'s epilogue: α·acc + β (+ γ·residual), ReLU, the output's format, stored."""
    y = acc.to(tl.float32) * alpha[None, :]
    r = y
    if HAS_RES:
        if EARLY_RES:
            r = _widen(r_early)
        else:
            r = _load_f32(res_ptr + offs, m_ok[:, None])
    out = _finish(y, beta[None, :], r, gamma, RELU, HAS_RES, OUT_KIND)
    tl.store(out_ptr + offs, out, mask=m_ok[:, None])


@triton.jit(do_not_specialize=["M"])
def epilogue_kernel(
    x_ptr, out_ptr, alpha_ptr, beta_ptr, res_ptr, gamma, M, N, RELU: tl.constexpr, HAS_RES: tl.constexpr,
    OUT_KIND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """out[M, N] = epilogue(x[M, N]) for a ready (e.g. cuDNN fp16) result."""
    pdl_enter(PDL)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm[:, None] * N + rn[None, :]
    x = _load_f32(x_ptr + offs, mask)
    alpha = tl.load(alpha_ptr + rn, mask=rn < N, other=0.0)
    beta = tl.load(beta_ptr + rn, mask=rn < N, other=0.0)
    y = x * alpha[None, :]
    r = y
    if HAS_RES:
        r = _load_f32(res_ptr + offs, mask)
    out = _finish(y, beta[None, :], r, gamma, RELU, HAS_RES, OUT_KIND)
    tl.store(out_ptr + offs, out, mask=mask)


def epilogue_operands(out, alpha, beta, res, gamma) -> tuple:
    """The epilogue's run-time arguments, in every launch after its inputs: out, α, β, residual, γ.

    Without a residual its pointer is ``out`` (never read: ``HAS_RES`` is off), and γ a float.
    """
    return out, alpha, beta, res if res is not None else out, float(gamma)


def epilogue_flags(relu, res, out_fmt) -> dict:
    """The epilogue's compile-time switches, in every launch: ReLU, a residual, the output format."""
    return {"RELU": bool(relu), "HAS_RES": res is not None, "OUT_KIND": OUT_KIND[out_fmt]}


def check_out_res(out, res, m, n, device, out_fmt):
    """A launch's output (and residual) tensors: shape, layout, dtype and device, and 32-bit indexing."""
    from deepgap.measure.quant.layers import DTYPES

    check(out_fmt in OUT_KIND, f"out_fmt must be one of {sorted(OUT_KIND)}; got {out_fmt!r}")
    check(
        out.shape == (m, n) and out.is_contiguous() and out.dtype == DTYPES[out_fmt] and out.device == device,
        f"out must be contiguous {DTYPES[out_fmt]} [{m}, {n}] on {device}; "
        f"got {out.dtype} {tuple(out.shape)}",
    )
    if res is not None:
        check(
            res.shape == (m, n)
            and res.is_contiguous()
            and res.device == device
            and res.dtype in (torch.int8, torch.float8_e4m3fn, torch.float16, torch.float32),
            f"residual must be a contiguous [{m}, {n}] int8/fp8/fp16/fp32 tensor on {device}; "
            f"got {res.dtype} {tuple(res.shape)}",
        )
    check(
        m * n <= INT32_LIMIT, f"[{m}, {n}] has more than 2^31 elements (32-bit indexing); use a smaller batch"
    )


def conv_gemm(
    x, nhw, w, ksize, stride, padding, alpha, beta, out_fmt, relu, cfg, res=None, gamma=0.0, out=None
):
    """Launch `conv_gemm_kernel`: quantized convolution of NHWC ``x`` ([nb·h·w, C]) with fused epilogue.

    Args:
        x: activations [nb·h·w, C], int8 or float8_e4m3fn, contiguous (NHWC flattened).
        nhw: (nb, h, w) of ``x``.
        w: weights [C_out, k·k·C] in (kh, kw, c) order, same dtype as ``x``, contiguous.
        ksize: the square kernel's size k.
        stride: the convolution's stride.
        padding: zero padding on each side.
        alpha: float32 [C_out], multiplies the accumulator.
        beta: float32 [C_out], added after.
        out_fmt: 'int8', 'fp8' or 'fp16'.
        relu: apply ReLU.
        cfg: a `tiles.TileConfig` (its `launch`: BM, BN, BK, GROUP_M, num_warps, num_stages).
        res: optional residual [M, C_out] (int8/fp8/fp16).
        gamma: multiplies the residual.
        out: optional preallocated output [M, C_out].

    Returns:
        The output [nb·oh·ow, C_out] in ``out_fmt``.
    """
    from deepgap.measure.quant.layers import DTYPES

    nb, h, wd = nhw
    c, n = _check_conv_inputs(x, nhw, w, ksize, out_fmt, cfg)
    oh, ow = out_size(h, ksize, stride, padding), out_size(wd, ksize, stride, padding)
    m = nb * oh * ow
    check(m > 0, f"empty output for input {nb}×{h}×{wd}, k={ksize}, stride={stride}, padding={padding}")
    check_vec("alpha", alpha, n, x.device)
    check_vec("beta", beta, n, x.device)
    if out is None:
        out = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    check_out_res(out, res, m, n, x.device, out_fmt)
    tiles = triton.cdiv(m, cfg.bm) * (n // cfg.bn)
    split, ws, cnt = split_k.operands(cfg, w, m, n, ksize * ksize * c, tiles, x.dtype == torch.int8, out)
    launcher(conv_gemm_kernel, x.device)[(tiles, split)](
        x,
        w,
        *epilogue_operands(out, alpha, beta, res, gamma),
        m,
        n,
        c,
        h,
        wd,
        oh,
        ow,
        ws,
        cnt,
        KH=ksize,
        KW=ksize,
        STRIDE=stride,
        PAD=padding,
        **epilogue_flags(relu, res, out_fmt),
        ACC_INT=x.dtype == torch.int8,
        EARLY_RES=bool(getattr(cfg, "early_res", False)) and res is not None,
        SPLIT=split,
        AHEAD=launch.constants_ahead(),
        **split_k.constexprs(cfg, x.device),
        **cfg.launch(),
        enable_fp_fusion=False,
    )
    return out


def _check_conv_inputs(x, nhw, w, ksize: int, out_fmt: str, cfg) -> tuple[int, int]:
    """`conv_gemm`'s operands as its kernel needs them (a `ValueError` naming the first that is not): (C_in, C_out)."""
    nb, h, wd = nhw
    check(out_fmt in OUT_KIND, f"out_fmt must be one of {sorted(OUT_KIND)}; got {out_fmt!r}")
    check(x.dtype in (torch.int8, torch.float8_e4m3fn), f"x must be int8 or float8_e4m3fn; got {x.dtype}")
    check(
        x.dim() == 2 and x.shape[0] == nb * h * wd and x.is_contiguous(),
        f"x must be contiguous [nb·h·w={nb * h * wd}, C]; "
        f"got {tuple(x.shape)} contiguous={x.is_contiguous()}",
    )
    c = x.shape[1]
    n = w.shape[0]
    check(
        w.dtype == x.dtype
        and w.dim() == 2
        and w.shape[1] == ksize * ksize * c
        and w.is_contiguous()
        and w.device == x.device,
        f"w must be contiguous {x.dtype} [C_out, {ksize}·{ksize}·{c}] on {x.device}; "
        f"got {w.dtype} {tuple(w.shape)}",
    )
    check(c % cfg.bk == 0, f"C_in={c} must be a multiple of BK={cfg.bk}")
    check(n % cfg.bn == 0, f"C_out={n} must be a multiple of BN={cfg.bn}")
    check(
        x.numel() <= INT32_LIMIT, "input has more than 2^31 elements (32-bit indexing); use a smaller batch"
    )
    return c, n


def epilogue(x, alpha, beta, out_fmt, relu, res=None, gamma=0.0, block_m=64, block_n=64):
    """Launch `epilogue_kernel` on a ready [M, N] tensor; returns [M, N] in ``out_fmt``."""
    from deepgap.measure.quant.layers import DTYPES

    check(out_fmt in OUT_KIND, f"out_fmt must be one of {sorted(OUT_KIND)}; got {out_fmt!r}")
    check(x.dim() == 2 and x.is_contiguous(), f"x must be a contiguous 2-D tensor; got {tuple(x.shape)}")
    check(
        x.dtype in (torch.int8, torch.float8_e4m3fn, torch.float16, torch.float32),
        f"x must be int8/fp8/fp16/fp32; got {x.dtype}",
    )
    m, n = x.shape
    check_vec("alpha", alpha, n, x.device)
    check_vec("beta", beta, n, x.device)
    out = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    check_out_res(out, res, m, n, x.device, out_fmt)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    launcher(epilogue_kernel, x.device)[grid](
        x,
        *epilogue_operands(out, alpha, beta, res, gamma),
        m,
        n,
        **epilogue_flags(relu, res, out_fmt),
        BM=block_m,
        BN=block_n,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out
