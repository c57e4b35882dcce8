"""The swapped super-pixel stem with its 3×3/2 max-pool in the same kernel, through a per-program scratch in L2.

Why: the super-pixel stem (`stem_s2d`) writes the 7×7/2 convolution's 8-bit output (112×112×64 per 224²
image, 822 MB at batch 1024) to HBM and `stem_kernels.pool8` reads it back to write a quarter of it: about
1.6 GB of HBM traffic and a second kernel (0.31 ms for fp8's pool alone at 1024 on one H200, session 26) for
a layer whose convolution's own floor is about 0.3 ms. Session 24's fused stem (`stem_pool`) kept the pool in
registers, on four parity planes shifted by ``tl.gather``; it computed 1.31× the convolution (its tiles overlap
by a pooled row and column) and lost 1.37-1.75× to the unfused pair.

Here a persistent program walks *bands*: ``T`` pooled rows of one image, all their columns. It computes the
2T + 1 convolution rows their windows cover (rows 2·i0 − 1 … 2·i0 + 2T − 1; the first is its upper
neighbour's last, so the convolution work is (2T + 1) / 2T of the unfused one's: 1.125× at T = 4, 1.06× at
T = 8) with `stem_s2d.stem_swap_kernel`'s arithmetic (the 64 channels as the wgmma's M, ``BM`` pixels its N,
the weights resident), writes them to the program's own scratch rows, waits at a block barrier, pools from the
scratch, writes the pooled band to the output, and waits again before the next band reuses the scratch. A
program's scratch (at T = 4, 9 × 112 × 64 = 63 KB) is written and read by the same SM a few microseconds
apart, so it stays in L2 (132 programs: 8.5 MB) and HBM sees only the image read and the pooled write.

Exact, as the unfused pair: the epilogue is monotone per channel and ends in a ReLU, so every code is ≥ 0 and
the pool's padding reads as 0 (a convolution row outside the output is stored as 0, a column outside it is
masked to 0); int8 pools its codes, fp8 and fp16 in fp32 (`stem_kernels.pool8`'s rule). `stem_int8.reference`
is the reference, bit for bit. The pool is ResNet's (3, 2, 1); others are refused.
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
from deepgap.measure.quant.layers import DTYPES
from deepgap.measure.quant.stem_s2d import checked, reference, swap_dot, swap_weights

# (pixels a convolution tile, warps, pipeline stages, programs an SM, pooled rows a band) to time
# (`benchmarks/stem_split.py`); the engine offers those a GPU has timed (`stem_choice.STEM_VARIANTS`).
TILES = (
    (128, 4, 2, 1, 4),
    (128, 4, 2, 1, 8),
    (128, 4, 2, 2, 4),
    (128, 4, 3, 1, 4),
    (256, 8, 2, 1, 4),
    (128, 4, 2, 1, 2),  # small batches: more bands (1.25× the convolution)
    (64, 4, 2, 1, 1),  # batch 1: 56 bands of one pooled row (1.5× the convolution)
)
POOL = (3, 2, 1)  # the max-pool this kernel fuses: ResNet's
BP = 64  # pooled pixels a step of the pool phase


@triton.jit(do_not_specialize=["H2", "W2", "OH", "OW", "PH", "PW", "BANDS", "PER_IMAGE", "QP"])
def stem_swap_pool_kernel(
    x_ptr, w_ptr, out_ptr, scratch_ptr, alpha_ptr, beta_ptr, H2, W2, OH, OW, PH, PW, BANDS, PER_IMAGE, QP,
    N: tl.constexpr, PAD: tl.constexpr, OUT_KIND: tl.constexpr, BM: tl.constexpr, T: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, STAGES: tl.constexpr, CODES: tl.constexpr, BP: tl.constexpr = 64,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Bands ``pid, pid + NUM_PROGRAMS, …``: each its 2T + 1 convolution rows into scratch, then its T pooled rows.

    ``QP``: the scratch rows a program owns (the band's 2T + 1 rows of OW pixels, padded to whole tiles).
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    rn = tl.arange(0, N)
    alpha = tl.load(alpha_ptr + rn)
    beta = tl.load(beta_ptr + rn)
    w0, w1, w2, w3 = swap_weights(w_ptr, N)
    sbase = scratch_ptr + pid.to(tl.int64) * QP * N
    count = (2 * T + 1) * OW  # convolution pixels a band
    for band in range(pid, BANDS, NUM_PROGRAMS):
        nb = band // PER_IMAGE
        i0 = (band - nb * PER_IMAGE) * T  # the band's first pooled row
        r0 = 2 * i0 - 1  # the convolution row of scratch row 0
        for t in tl.range(0, (count + BM - 1) // BM, num_stages=STAGES):
            q = t * BM + tl.arange(0, BM)
            lr = q // OW
            col = q - lr * OW
            cr = r0 + lr
            ok = (q < count) & (cr >= 0) & (cr < OH)
            acc = swap_dot(x_ptr, w0, w1, w2, w3, nb, cr - PAD, col - PAD, ok, H2, W2, N, BM)
            y = acc.to(tl.float32) * alpha[:, None]
            out = tl.trans(_finish(y, beta[:, None], y, 0.0, True, False, OUT_KIND))
            out = tl.where(
                ok[:, None], out, tl.zeros_like(out)
            )  # off the convolution's rows: the pool's padding
            tl.store(sbase + q[:, None] * N + rn[None, :], out)
        tl.debug_barrier()  # the band's convolution rows stored, by every thread, before any is pooled
        pool_band(sbase, out_ptr, nb, i0, OW, PH, PW, N, T, CODES, BP)
        tl.debug_barrier()  # every pooled read done before the next band's rows overwrite the scratch


@triton.jit
def pool_band(
    sbase,
    out_ptr,
    nb,
    i0,
    OW,
    PH,
    PW,
    N: tl.constexpr,
    T: tl.constexpr,
    CODES: tl.constexpr,
    BP: tl.constexpr,
):
    """Pooled rows ``i0 …`` (up to T) of image ``nb`` from the band's scratch: 3×3/2 windows, padding 1 as 0.

    Pooled (i, j) reads convolution rows 2i − 1 … 2i + 1, scratch rows 2(i − i0) … + 2, and columns 2j − 1 … 2j + 1.
    """
    rn = tl.arange(0, N)
    for p0 in range(0, T * PW, BP):
        p = p0 + tl.arange(0, BP)
        pi = p // PW
        pj = p - pi * PW
        valid = (p < T * PW) & (i0 + pi < PH)
        best = tl.zeros((BP, N), dtype=tl.int8 if CODES else tl.float32)
        for dr in tl.static_range(3):
            for dc in tl.static_range(3):
                c = 2 * pj - 1 + dc
                c_ok = valid & (c >= 0) & (c < OW)
                v = tl.load(
                    sbase + ((2 * pi + dr) * OW + c)[:, None] * N + rn[None, :], mask=c_ok[:, None], other=0.0
                )
                best = tl.maximum(best, v.to(best.dtype))
        row = (nb * PH + i0 + pi) * PW + pj
        tl.store(
            out_ptr + row[:, None] * N + rn[None, :], best.to(out_ptr.dtype.element_ty), mask=valid[:, None]
        )


def stem(
    x, w, ksize, stride, padding, alpha, beta, out_fmt, pool=POOL, block_m=128, num_warps=4, stages=2,
    persistent=1, band=4, num_programs=None, backend="triton",
):  # fmt: skip
    """Super pixels ``x`` (int8 [nb, 16, H/2, W/2], channels_last) → max-pooled stem output [nb·ph·pw, 64].

    As `stem_s2d.stem` (its ``w`` from `stem_s2d.pack_weights`), in one kernel: ``band`` pooled rows a band,
    ``persistent`` programs an SM (``num_programs`` overrides the count, as the tests do).
    """
    nb, h2, w2, pad2, (oh, ow, _) = checked(x, w, ksize, stride, padding, alpha, beta, out_fmt)
    check(tuple(pool) == POOL, f"the pooled swap stem fuses ResNet's 3×3/2 max-pool (padding 1); got {pool}")
    check(w.shape[0] == 64, f"the swapped stem takes 64 output channels (one wgmma's M); got {w.shape[0]}")
    check(
        band >= 1 and block_m in (64, 128, 256),
        f"band ≥ 1 pooled rows and a tile of 64-256; got {band}, {block_m}",
    )
    if backend != "triton":
        return reference(x, w, ksize, stride, padding, alpha, beta, out_fmt, pool)
    from deepgap.measure.quant.persistent import programs

    ph, pw = out_size(oh, *pool), out_size(ow, *pool)
    per_image = triton.cdiv(ph, band)
    bands = nb * per_image
    nprog = min(num_programs or programs(x.device) * max(1, int(persistent)), bands)
    qp = triton.cdiv((2 * band + 1) * ow, block_m) * block_m
    dtype = DTYPES[out_fmt]
    scratch = torch.empty((nprog * qp, 64), dtype=dtype, device=x.device)
    out = torch.empty((nb * ph * pw, 64), dtype=dtype, device=x.device)
    launcher(stem_swap_pool_kernel, x.device)[(nprog,)](
        x.permute(0, 2, 3, 1).contiguous(), w, out, scratch, alpha, beta, h2, w2, oh, ow, ph, pw, bands, per_image,
        qp, N=64, PAD=pad2, OUT_KIND=OUT_KIND[out_fmt], BM=block_m, T=band, NUM_PROGRAMS=nprog, STAGES=stages,
        CODES=dtype == torch.int8, BP=BP, num_warps=num_warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def tile_args(cfg: tuple[int, ...]) -> dict[str, int]:
    """`stem`'s keywords for a tile of `TILES`: (pixels, warps, stages, programs an SM, pooled rows a band)."""
    block, warps, stages, per_sm, band = cfg
    return {"block_m": block, "num_warps": warps, "stages": stages, "persistent": per_sm, "band": band}


def tile_name(cfg: tuple[int, ...]) -> str:
    """A tile's short name, e.g. '128x4ws2p1t4'."""
    return "{}x{}ws{}p{}t{}".format(*cfg)
