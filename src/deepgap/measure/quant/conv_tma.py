"""A 3×3 convolution whose input tiles arrive by TMA, the padding as the copy engine's zeros (Hopper).

Why: the grouped implicit-GEMM kernel (`kernels.conv_gemm_kernel`) gathers each A tile of a 3×3 layer by
per-thread address arithmetic and masks, tap by tap. On one H200 at batch 1024 (session 28's main job,
results/h200/session28) layer1's three 3×3 ``conv2`` took 1.30 ms at 28% of the fp8 peak and 0.95 TB/s,
neither compute- nor memory-bound: the gather is the limit. Here a program owns a TH×TW block of one image's
output pixels; for each of the nine taps and each BK channels, one 4-D TMA copy brings the input window
shifted by the tap (``[1, TH, TW, BK]`` of the NHWC activation at (h0 + dy − 1, w0 + dx − 1)); coordinates
outside the image, negative ones included, arrive as zeros, which is exactly the convolution's padding. The
window is the MMA's A operand as it lies ([TH·TW, BK]); the weights are the engine's [C_out, (kh, kw, c)].
The epilogue is the engine's own (`kernels._finish`); the output leaves through a 4-D TMA store that clips
what falls outside the image (a TW wider than the image wastes those columns' MMA work, not their bytes).
A stage's first 3×3 (stride 2, even sizes) reads its input as [N, H/2, 2, W/2, 2·C] (`conv3x3_tma_kernel`).

Timed on one H200 in session 29 (`benchmarks/conv_tma.sh`): faster than the grouped kernel only on
ResNet-50's layer2 (28 wide), so the tuner is offered that one tile there (`tma_configs`), and keeps it
only where its own timing agrees. ``DEEPGAP_QUANT_CONV_TMA=on`` (`core.switches`) offers it; off by default since
session 55, when at batch 256 and 1024 its first layer (layer2.1.conv2) was the first tensor whose values changed
between two eager runs of the network. Session 56 ran it alone (`benchmarks/conv_tma_repeat.py`, one H100): fp8 at
3 and 4 pipeline stages changed 0.1-1.9% of its outputs at every launch, at 1 and 2 never (int8 never), so it runs
at most `MAX_STAGES` = 2; there it was worth 0.4% at batch 1024 on that H100, within the run's interval, and stays
off. The interpreter runs it (descriptors and their out-of-bounds zeros included), so the CPU tests check it
exactly.
"""

# Triton convention: compile-time (constexpr) parameters in capitals; constexpr branches stay if/else.
# ruff: noqa: N803, N806, SIM108

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.core import switches
from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import _finish, _mma, _widen, epilogue_flags, epilogue_operands
from deepgap.measure.quant.launch import INT32_LIMIT, check, check_vec, launcher

ENV = "DEEPGAP_QUANT_CONV_TMA"
DESC_ENV = "DEEPGAP_QUANT_CONV_TMA_DESC"
# Pipeline stages this kernel may run: at 3 and 4 its fp8 output changed from one run to the next (session 56, one
# H100, Triton 3.6, `benchmarks/conv_tma_repeat.py`: every launch of layer2's shapes at batch 256 and 1024, 0.1-1.9%
# of outputs, descriptors made by each program or at launch alike), at 1 and 2 never, nor int8 at any. The cause is
# not pinned: in the sm_90 PTX (Triton 3.8, here) the window reaches the MMA through registers, fp8 as two wgmma
# groups with one left in flight across the loop's turn, int8 as one group waited for; but 2-stage fp8 has that too.
MAX_STAGES = 2


def offered() -> bool:
    """Whether the tuner offers these tiles: ``DEEPGAP_QUANT_CONV_TMA`` 'on' or 'off' (the default since session 55)."""
    return switches.read(ENV) == "on"


@triton.jit(do_not_specialize=["NB", "H", "W"])
def conv3x3_tma_kernel(
    x_ptr, w_ptr, out_ptr, alpha_ptr, beta_ptr, res_ptr, gamma, NB, H, W,
    C: tl.constexpr, N: tl.constexpr, RELU: tl.constexpr, HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr,
    ACC_INT: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    STRIDE: tl.constexpr = 1, PDL: tl.constexpr = False, HOST_DESC: tl.constexpr = False,
):  # fmt: skip
    """out[n, i, j, :] = epilogue(Σ_(dy,dx) x[n, S·i + dy − 1, S·j + dx − 1, :] · W[:, (dy, dx), :]ᵀ), a TH×TW block.

    Program (pid, pid_n): output block ``pid`` (image-major, then rows, then columns of blocks), channels
    BN·pid_n … BN·pid_n + BN − 1. The K loop (9 taps × C / BK) is one software-pipelined loop. With
    ``STRIDE`` 2 (H and W even) the input is read as [N, H/2, 2, W/2, 2·C]: input row 2i + dy − 1 is row
    i + (dy − 1 − p)/2 of parity p = (dy + 1) mod 2, and the column's parity joins the channels, so each tap is
    still one box of TH×TW consecutive pixels (a 5-D TMA copy; row and column −1 arrive as zeros).
    ``HOST_DESC``: ``x_ptr``, ``w_ptr``, ``out_ptr`` and ``res_ptr`` are those descriptors, made at launch
    (`host_descriptors`), not by each program in global scratch.
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    pid_n = tl.program_id(1)
    OH = H // STRIDE
    OW = W // STRIDE
    blocks_w = (OW + TW - 1) // TW
    blocks = ((OH + TH - 1) // TH) * blocks_w
    img = pid // blocks
    h0 = (pid % blocks) // blocks_w * TH
    w0 = (pid % blocks) % blocks_w * TW
    if HOST_DESC:
        x_desc = x_ptr
        w_desc = w_ptr
        o_desc = out_ptr
    else:
        if STRIDE == 1:
            x_desc = tl.make_tensor_descriptor(
                x_ptr, shape=[NB, H, W, C], strides=[H * W * C, W * C, C, 1], block_shape=[1, TH, TW, BK]
            )
        else:
            x_desc = tl.make_tensor_descriptor(
                x_ptr, shape=[NB, OH, 2, OW, 2 * C], strides=[H * W * C, 2 * W * C, W * C, 2 * C, 1],
                block_shape=[1, TH, 1, TW, BK],
            )  # fmt: skip
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, 9 * C], strides=[9 * C, 1], block_shape=[BN, BK])
        o_desc = tl.make_tensor_descriptor(
            out_ptr, shape=[NB, OH, OW, N], strides=[OH * OW * N, OW * N, N, 1], block_shape=[1, TH, TW, BN]
        )
    if ACC_INT:
        acc = tl.zeros((TH * TW, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((TH * TW, BN), dtype=tl.float32)
    for ks in tl.range(0, 9 * (C // BK)):
        tap = ks // (C // BK)
        c0 = (ks % (C // BK)) * BK
        dy = tap // 3
        dx = tap % 3
        if STRIDE == 1:
            a = x_desc.load([img, h0 + dy - 1, w0 + dx - 1, c0]).reshape(TH * TW, BK)
        else:
            ph = (dy + 1) % 2
            pw = (dx + 1) % 2
            a = x_desc.load([img, h0 + (dy - 1 - ph) // 2, ph, w0 + (dx - 1 - pw) // 2, pw * C + c0])
            a = a.reshape(TH * TW, BK)
        acc = _mma(a, w_desc.load([pid_n * BN, tap * C + c0]).T, acc, ACC_INT)
    rn = pid_n * BN + tl.arange(0, BN)
    y = acc.to(tl.float32) * tl.load(alpha_ptr + rn)[None, :]
    r = y
    if HAS_RES:
        if HOST_DESC:
            r_desc = res_ptr
        else:
            r_desc = tl.make_tensor_descriptor(
                res_ptr,
                shape=[NB, OH, OW, N],
                strides=[OH * OW * N, OW * N, N, 1],
                block_shape=[1, TH, TW, BN],
            )
        r = _widen(r_desc.load([img, h0, w0, pid_n * BN]).reshape(TH * TW, BN))
    out = _finish(y, tl.load(beta_ptr + rn)[None, :], r, gamma, RELU, HAS_RES, OUT_KIND)
    o_desc.store([img, h0, w0, pid_n * BN], out.reshape(1, TH, TW, BN))


def host_descriptors(x, w, out, res, nhw, stride: int, th: int, tw: int, bn: int, bk: int) -> tuple:
    """The kernel's four descriptors made on the host: (x, w, out, residual or out), as ``HOST_DESC`` reads them.

    Why: made once at launch and passed by value (captured so by a CUDA graph), where the device form has
    every program write its own into global scratch and fence it before its first copy.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor as Desc

    nb, h, wd = nhw
    c, n = x.shape[1], w.shape[0]
    oh, ow = h // stride, wd // stride
    if stride == 1:
        xd = Desc(x, [nb, h, wd, c], [h * wd * c, wd * c, c, 1], [1, th, tw, bk])
    else:
        xd = Desc(x, [nb, oh, 2, ow, 2 * c], [h * wd * c, 2 * wd * c, wd * c, 2 * c, 1], [1, th, 1, tw, bk])
    od = Desc(out, [nb, oh, ow, n], [oh * ow * n, ow * n, n, 1], [1, th, tw, bn])
    rd = Desc(res, [nb, oh, ow, n], [oh * ow * n, ow * n, n, 1], [1, th, tw, bn]) if res is not None else od
    return xd, Desc(w, [n, 9 * c], [9 * c, 1], [bn, bk]), od, rd


def conv_gemm(
    x, nhw, w, ksize, stride, padding, alpha, beta, out_fmt, relu, cfg, res=None, gamma=0.0, out=None,
    descriptors: str | None = None,
):  # fmt: skip
    """Launch `conv3x3_tma_kernel`: `kernels.conv_gemm`'s arguments and result, for 3×3 padding-1 layers.

    Stride 1, or 2 on an input of even height and width.

    ``cfg`` is a `tiles.TileConfig` with ``tma_conv`` = TW (TH = bm // TW), ``bn`` and ``bk``. A ``ValueError``
    names what this kernel cannot take. ``descriptors``: 'device' (each program makes its own) or 'host'
    (`host_descriptors`); None reads ``DEEPGAP_QUANT_CONV_TMA_DESC``.
    """
    from deepgap.measure.quant.kernels import _check_conv_inputs, check_out_res
    from deepgap.measure.quant.layers import DTYPES
    from deepgap.measure.quant.persistent import check_tma, use_descriptors

    nb, h, wd = nhw
    check(
        (ksize, padding) == (3, 1) and (stride == 1 or (stride == 2 and h % 2 == 0 and wd % 2 == 0)),
        f"the TMA convolution runs 3×3 padding-1 layers at stride 1, or 2 on even sizes; got k={ksize}, "
        f"stride={stride}, padding={padding}, {h}×{wd}",
    )
    tw = int(cfg.tma_conv)
    check(tw > 0 and cfg.bm % tw == 0, f"tile {cfg.label}: tma_conv (TW) must divide BM")
    check(
        cfg.num_stages <= MAX_STAGES,
        f"tile {cfg.label}: at most {MAX_STAGES} stages (more change its output between runs; MAX_STAGES says why)",
    )
    c, n = _check_conv_inputs(x, nhw, w, ksize, out_fmt, cfg)
    oh, ow = h // stride, wd // stride
    m = nb * oh * ow
    check_vec("alpha", alpha, n, x.device)
    check_vec("beta", beta, n, x.device)
    if out is None:
        out = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    check_out_res(out, res, m, n, x.device, out_fmt)
    check(m * max(c, n) <= INT32_LIMIT, "more than 2^31 elements (32-bit indexing); use a smaller batch")
    check_tma(x=x, w=w, out=out, residual=res)
    th = cfg.bm // tw
    grid = (nb * triton.cdiv(oh, th) * triton.cdiv(ow, tw), n // cfg.bn)
    host = (descriptors or switches.read(DESC_ENV)) == "host"
    if host:  # the four operands the kernel reads through TMA, as descriptors
        x_, w_, o_, r_ = host_descriptors(x, w, out, res, nhw, stride, th, tw, cfg.bn, cfg.bk)
    else:
        use_descriptors(x.device)
        x_, w_, o_, r_ = x, w, out, res
    launcher(conv3x3_tma_kernel, x.device)[grid](
        x_, w_, *epilogue_operands(o_, alpha, beta, r_, gamma), nb, h, wd,
        C=c, N=n, **epilogue_flags(relu, res, out_fmt), ACC_INT=x.dtype == torch.int8, TH=th, TW=tw,
        BN=cfg.bn, BK=cfg.bk, STRIDE=stride, HOST_DESC=host, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


def tma_configs(node, h: int, w: int, capability: tuple[int, int] | None, explore: bool = False) -> list:
    """Tiles of this kernel worth timing for a 3×3 layer (stride 1, or 2 on even sizes) on an h×w input, else none.

    None unless `offered`, below Hopper (``capability`` None is the interpreter's CPU, which runs them), or for
    another kernel shape. ``explore`` (the bench, the GPU test): blocks of 128 pixels as wide as the output
    rounded up to a power of two (capped at 64, at least 8) and half that; BN the output channels up to 128,
    and 64 beside it; 2 and 1 stages (`MAX_STAGES`); BK 128 bytes where C allows, else 64.

    Otherwise (the tuner) only what won somewhere on one H200 (session 29, `benchmarks/conv_tma.sh`, batch
    256 and 1024, fp8 and int8, against the grouped kernel's best tile): 4×32 pixels, BN 128 on 8 warps,
    for outputs 17 to 32 wide (ResNet-50's layer2, stride 1 and 2: 1.08-1.17× at 3 stages, which race; now 2).
    Everywhere else every tile lost (layer1 0.74-0.77×, layer3 0.70-0.87×, layer4 0.36-0.49×), so none is
    offered there.
    """
    from deepgap.measure.quant.tiles import TileConfig

    if not offered() or (capability is not None and capability < (9, 0)):
        return []
    if (
        (node.kernel_size, node.padding) != (3, 1)
        or node.stride not in (1, 2)
        or (h % 2 or w % 2) * node.stride > 1
    ):
        return []
    w //= node.stride  # the output's width
    c, n = node.cin, node.cout
    bk = 128 if c % 128 == 0 else 64 if c % 64 == 0 else 0
    if not bk or n % 64:
        return []
    if not explore:
        out = [TileConfig(128, 128, bk, 8, 8, MAX_STAGES, tma_conv=32)] if 16 < w <= 32 else []
        return [cfg for cfg in out if cfg.fits(n, c)]
    tw = min(64, max(8, 1 << (w - 1).bit_length()))
    widths = [tw] + ([tw // 2] if tw >= 16 else [])
    bns = [128, 64] if n % 128 == 0 else [64]
    out = [
        TileConfig(128, bn, bk, 8, 8 if bn == 128 else 4, stages, tma_conv=width)
        for width in widths
        for bn in bns
        for stages in (MAX_STAGES, 1)
    ]
    return [cfg for cfg in out if cfg.fits(n, c)]
