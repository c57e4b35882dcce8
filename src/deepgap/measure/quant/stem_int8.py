"""The ResNet stem on int8 pixels: 4-byte NHWC pixels, an int8 GEMM reading a kernel row per K step.

Images are quantized once into 4-byte pixels; the 7×7/2 convolution is an int8 tensor-core GEMM whose K
step is one kernel row, then the 8-bit max-pool runs as for the fused stem. The GEMM is the fused stem's
kernel (`stem_kernels.stem_conv_kernel`, its prologue and epilogue) with ``INT8_PIXELS``: its K loop is
`stem_kernels.pixel_rows_dot`.

Why: the per-layer table (`deepgap layers`) names the stem as the quant engine's largest single item
at batch 256 (0.65 ms of ResNet-50's 5.1 ms on an H200), and says its pace is set by the gather of K,
not by its arithmetic: `stem_kernels.stem_conv_kernel` gathers K = 7·7·3 = 147 fp16 values element by
element, each with its own division into (row, column, channel). Here a pixel is 4 int8 bytes (the
three channels and a zero), so a kernel row of 7 taps is 28 contiguous bytes of the image; one K step
of 32 is one kernel row (the last tap, 4 bytes, meets zero weights), and the gather's address is a
base plus the byte index. The operands are int8, so the GEMM is an int8·int8→int32 wgmma, exact.

The same layout is the engine's *resident* input (``--inputs int8-resident``, MLPerf-like: images
already quantized in device memory): `quantize_image` is what turns a float batch into it, once,
outside the timed window; in the default input mode the engine may choose to run it inside the
window, as the first step of this stem, when that is faster than the fp16 stems (prepare's stem choice).

Scales are symmetric: the image's ``in_scale`` (its calibrated range / 127), per output channel for the
weights, and the stem's output scale folded into ``alpha``. `reference` is the exact torch emulation
the tests compare the kernels with, and the path the engine takes on CPU tensors without Triton.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import MAGIC, OUT_KIND, _finish, window_origin
from deepgap.measure.quant.launch import INT32_LIMIT, check, launcher
from deepgap.measure.quant.stem_kernels import pixel_rows_dot, pool8, stem_conv_kernel, stem_output

PIXEL = 4  # bytes per resident pixel: three channels and a zero
ROW = 32  # K per kernel row: 8 taps of 4 bytes (a 7-tap row and 4 zero bytes), one int8 wgmma K step
QMAX = 127.0


@triton.jit(do_not_specialize=["P", "HW"])
def quantize_image_kernel(
    x_ptr,
    out_ptr,
    P,
    HW,
    s_n,
    s_c,
    s_p,
    inv_scale,
    C: tl.constexpr,
    BP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[p, c] = round(x[n, c, h, w] / scale) clamped to ±127 for c < C, 0 beyond (p = n·H·W + h·W + w)."""
    pdl_enter(PDL)
    rp = tl.program_id(0) * BP + tl.arange(0, BP)
    rc = tl.arange(0, 4)
    p_ok = rp < P
    n = rp // HW
    p = rp - n * HW
    ok = p_ok[:, None] & (rc < C)[None, :]
    v = tl.load(x_ptr + n[:, None] * s_n + rc[None, :] * s_c + p[:, None] * s_p, mask=ok, other=0.0)
    y = v.to(tl.float32) * inv_scale
    q = tl.minimum(tl.maximum(y, -127.0), 127.0) + MAGIC
    out = q.to(tl.int32, bitcast=True).to(tl.int8)  # low byte = the value rounded half to even
    tl.store(out_ptr + rp[:, None] * 4 + rc[None, :], out, mask=p_ok[:, None])


def quantize_image(x: torch.Tensor, in_scale: float, backend: str = "triton") -> torch.Tensor:
    """A float image batch [nb, 3, H, W] (any memory format) → int8 [nb, 4, H, W] channels_last pixels.

    ``backend`` 'triton' launches `quantize_image_kernel` (interpreted on CPU tensors); anything else runs
    the same arithmetic in torch.
    """
    check(x.dim() == 4 and x.shape[1] <= PIXEL, f"images must be [nb, ≤4, H, W]; got {tuple(x.shape)}")
    check(x.is_floating_point(), f"images must be floating point to quantize; got {x.dtype}")
    check(in_scale > 0 and in_scale == in_scale, f"in_scale must be positive; got {in_scale}")
    nb, c, h, w = x.shape
    out = torch.empty((nb, PIXEL, h, w), dtype=torch.int8, device=x.device, memory_format=torch.channels_last)
    inv = torch.tensor(1.0 / in_scale, dtype=torch.float32)
    if backend != "triton":
        from deepgap.measure.quant.layers import quantize_act

        out.zero_()
        out[:, :c].copy_(quantize_act(x.float() * inv.to(x.device), "int8"))
        return out
    if x.stride(2) != w * x.stride(3):  # (h, w) must flatten to one index p = h·W + w
        x = x.contiguous()
    check(
        x.numel() <= INT32_LIMIT and out.numel() <= INT32_LIMIT,
        "more than 2^31 elements; use a smaller batch",
    )
    p = nb * h * w
    block = 256
    launcher(quantize_image_kernel, x.device)[(triton.cdiv(p, block),)](
        x, out, p, h * w, x.stride(0), x.stride(1), x.stride(3), float(inv), C=c, BP=block,
        num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["M", "H", "W", "OH", "OW"])
def stem_conv_persistent_kernel(
    x_ptr, w_ptr, out_ptr, alpha_ptr, beta_ptr, M, H, W, OH, OW, N: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, OUT_KIND: tl.constexpr, BM: tl.constexpr,
    NUM_SMS: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """`stem_conv_kernel` on int8 pixels (``C``-byte pixels, a kernel row per ``BK``) with ``NUM_SMS`` programs.

    Why: a tile of the stem is short (7 K steps) and its epilogue (α, β, ReLU, 8-bit codes) long beside
    them; one program per tile waits for its first loads cold and for α and β after its last MMA. Here α
    and β are loaded once per program, and `tl.range(..., flatten=True)` makes the tile walk and the K
    loop one software-pipelined loop, so the next tile's rows load during this tile's epilogue (the
    pattern of `quant.persistent.gemm_1x1_kernel`; the epilogue's tile is a second counter, ``tile_c``).
    """
    pdl_enter(PDL)
    rn = tl.arange(0, N)
    alpha = tl.load(alpha_ptr + rn)
    beta = tl.load(beta_ptr + rn)
    tiles = (M + BM - 1) // BM
    start = tl.program_id(0)
    tile_c = start - NUM_SMS
    for tile in tl.range(start, tiles, NUM_SMS, flatten=True):
        rm = tile * BM + tl.arange(0, BM)
        m_ok = rm < M
        nb, ih0, iw0 = window_origin(rm, OH, OW, STRIDE, PAD)
        acc = pixel_rows_dot(x_ptr, w_ptr, nb, ih0, iw0, m_ok, rn, H, W, C, N, KH, KW, KH * BK, BM, BK)
        tile_c += NUM_SMS
        rc = tile_c * BM + tl.arange(0, BM)
        y = acc * alpha[None, :]
        out = _finish(y, beta[None, :], y, 0.0, True, False, OUT_KIND)
        tl.store(out_ptr + rc[:, None] * N + rn[None, :], out, mask=(rc < M)[:, None])


def pack_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float stem weights [C_out, C ≤ 4, KH, KW ≤ 8] → (int8 [C_out, KH·32] in row-major taps, fp32 scales).

    Per output channel ``s = max|W| / 127`` (1 where a channel is all zero); K step ``kh`` holds that kernel
    row's taps as 4-byte pixels, zero for channels ≥ C and taps ≥ KW.
    """
    cout, c, kh, kw = w.shape
    check(
        c <= PIXEL and kw * PIXEL <= ROW,
        f"the int8 stem takes ≤ 4 channels and ≤ 8 taps; got {tuple(w.shape)}",
    )
    wd = w.detach().double().cpu()
    amax = wd.abs().flatten(1).amax(1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(torch.clamp(wd / scale[:, None, None, None], -QMAX, QMAX))
    packed = torch.zeros((cout, kh, ROW // PIXEL, PIXEL), dtype=torch.float64)
    packed[:, :, :kw, :c] = q.permute(0, 2, 3, 1)
    return packed.reshape(cout, kh * ROW).to(torch.int8).contiguous(), scale.float()


def unpack_weights(w_i8: torch.Tensor, kh: int, kw: int) -> torch.Tensor:
    """`pack_weights`'s int8 matrix → [C_out, 4, KH, KW] (the zero channel included), as float64."""
    cout = w_i8.shape[0]
    return w_i8.double().reshape(cout, kh, ROW // PIXEL, PIXEL)[:, :, :kw].permute(0, 3, 1, 2).contiguous()


def stem(
    x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, pool=(3, 2, 1), block_m=128, num_warps=4,
    backend="triton", persistent=0, num_programs=None,
):  # fmt: skip
    """Resident pixels ``x`` (int8 [nb, 4, H, W], channels_last) → max-pooled stem output [nb·ph·pw, C_out].

    ``alpha`` = in_scale·s_w / s_out per channel (positive), ``beta`` = bias / s_out; ReLU always.
    ``persistent`` > 0: `stem_conv_persistent_kernel` with that many programs per SM (``num_programs``
    overrides the count, as the tests do), else one program per tile of ``block_m`` output pixels.
    """
    if backend != "triton":
        checked(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt)
        return reference(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, pool)
    conv, nb, oh, ow = convolve(
        x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, block_m, num_warps, persistent, num_programs
    )
    return pool8(conv, nb, oh, ow, pool)


def convolve(
    x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, block_m=128, num_warps=4, persistent=0,
    num_programs=None,
):  # fmt: skip
    """`stem`'s convolution alone (Triton): (its 8-bit output [nb·oh·ow, C_out], nb, oh, ow).

    Apart so that `benchmarks/stem_split.py` can time the convolution and the max-pool each on its own.
    """
    nb, h, wd, n, kp, (oh, ow, m) = checked(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt)
    geometry = (h, wd, ksize, ksize, stride, padding, PIXEL, ROW)
    conv = launch_conv(
        x, w_i8, alpha, beta, out_fmt, (nb, oh, ow), geometry, block_m, num_warps, persistent, num_programs
    )
    return conv, nb, oh, ow


def launch_conv(x, w, alpha, beta, out_fmt, nhw, geometry, block_m, num_warps, persistent, num_programs):
    """One int8 stem convolution launch over ``x``'s pixels (int8 [nb, C, H, W], channels_last) → [nb·oh·ow, N].

    ``geometry`` = (H, W, KH, KW, stride, padding, C, BK): a K step of ``BK`` bytes is one kernel row of
    ``C``-byte pixels (`stem_kernels.pixel_rows_dot`). This stem passes its own 4-byte pixels and 7×7/2
    window; `quant.stem_s2d` passes 16-byte super pixels and the 4×4/1 window they make of it.
    """
    from deepgap.measure.quant.layers import DTYPES
    from deepgap.measure.quant.persistent import programs

    (nb, oh, ow), (h, wd, kh, kw, stride, padding, c, bk) = nhw, geometry
    n, m = w.shape[0], nb * oh * ow
    xm = x.permute(0, 2, 3, 1).contiguous()  # a no-op for channels_last pixels
    conv = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    common = dict(
        N=n, KH=kh, KW=kw, STRIDE=stride, PAD=padding, OUT_KIND=OUT_KIND[out_fmt], BM=block_m, C=c, BK=bk
    )
    if persistent:
        nsm = num_programs or programs(x.device) * int(persistent)
        launcher(stem_conv_persistent_kernel, x.device)[(min(nsm, triton.cdiv(m, block_m)),)](
            xm, w, conv, alpha, beta, m, h, wd, oh, ow, NUM_SMS=nsm, **common, num_warps=num_warps,
            enable_fp_fusion=False,
        )  # fmt: skip
        return conv
    launcher(stem_conv_kernel, x.device)[(triton.cdiv(m, block_m),)](
        xm, w, conv, alpha, beta, m, h, wd, oh, ow, KP=kh * bk, INT8_PIXELS=True, **common, num_warps=num_warps,
        enable_fp_fusion=False,
    )  # fmt: skip
    return conv


def checked(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt) -> tuple:
    """`stem`'s operands checked (and `stem_pool.stem`'s): (nb, H, W, C_out, K, (OH, OW, OH·OW·nb))."""
    check(out_fmt in OUT_KIND, f"the int8 stem writes int8, fp8 or fp16; got {out_fmt!r}")
    check(
        x.dtype == torch.int8 and x.dim() == 4 and x.shape[1] == PIXEL,
        f"x must be int8 [nb, {PIXEL}, H, W] pixels; got {x.dtype} {tuple(x.shape)}",
    )
    nb, _, h, wd = x.shape
    n, kp = w_i8.shape
    check(w_i8.dtype == torch.int8 and kp == ksize * ROW, f"w_i8 must be int8 [C_out, {ksize * ROW}]")
    return nb, h, wd, n, kp, stem_output(x, n, (nb, h, wd), ksize, stride, padding, alpha, beta)


def reference(x, w_i8, ksize, stride, padding, alpha, beta, out_fmt, pool=(3, 2, 1)) -> torch.Tensor:
    """The int8 stem in torch: the exact integer convolution (float64), the kernels' fp32 epilogue, max-pool.

    Max after the epilogue: the epilogue is monotone per channel (``alpha`` > 0) and ends in a ReLU, so
    this is what the kernels compute (the convolution's 8-bit output, then its maximum).
    """
    acc = F.conv2d(x.double(), unpack_weights(w_i8, ksize, ksize).to(x.device), None, stride, padding)
    return finish_reference(acc, alpha, beta, out_fmt, pool)


def finish_reference(acc: torch.Tensor, alpha, beta, out_fmt: str, pool=(3, 2, 1)) -> torch.Tensor:
    """`reference`'s tail on the exact sums ``acc`` [nb, N, oh, ow]: the fp32 epilogue, then the max-pool."""
    from deepgap.measure.quant.layers import epilogue_reference

    n = acc.shape[1]
    flat = acc.permute(0, 2, 3, 1).reshape(-1, n).float()  # exact: |acc| < 2^24
    q = epilogue_reference(flat, alpha, beta, out_fmt, True)
    b, _, oh, ow = acc.shape
    q4 = q.float().reshape(b, oh, ow, n).permute(0, 3, 1, 2)
    k, s, p = pool
    pooled = F.max_pool2d(q4, k, s, p)  # values ≥ 0 after the ReLU: -inf padding never wins over them
    return pooled.permute(0, 2, 3, 1).reshape(-1, n).to(q.dtype)
