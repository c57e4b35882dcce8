"""A persistent, TMA-fed GEMM for the quant engine's 1×1 stride-1 convolutions (Hopper).

Why: a 1×1 convolution on NHWC activations is a plain GEMM (M = batch·H·W, K = C_in, N = C_out), and in
ResNet-50's layer1/layer2 it is memory-bound with K = 64–512: a `kernels.conv_gemm_kernel` tile's life
is load → one or a few MMAs → epilogue, and each of its ~6,000 programs (batch 256) starts cold. Here a
grid of one program per SM (or ``TileConfig.persistent`` per SM) walks the tiles: `tl.range(...,
flatten=True)` makes the tile walk and the K loop one software-pipelined loop, so the next tile's loads
are in flight during this tile's epilogue. A and the weights arrive through TMA tensor descriptors
(`tl.make_tensor_descriptor`: one bulk copy per block instead of per-thread address arithmetic,
out-of-bounds rows zero-filled). Triton's tutorial 09-persistent-matmul.py is the pattern. The epilogue
is the engine's own (`kernels._finish`: α·acc + β, + γ·residual, ReLU, requantization to int8/fp8 or
fp16), so the output equals `conv_gemm_kernel`'s; ``TMA_EPILOGUE`` also moves the residual and the
output through descriptors.

It is a tile candidate (`tiles.persistent_configs`, ``TileConfig.persistent``) that the tuner times beside
the others per layer, unless ``DEEPGAP_QUANT_GEMM=off`` (`tiles.gemm_mode`). On one H200 (session 22,
docs/quant.md) it made ResNet-50 at batch 256 4.7% (fp8) and 6.7% (int8) faster; `benchmarks/gemm_1x1.py`
and tests/measure/quant/test_quant_persistent_gpu.py are what measures it.

On the CPU it runs in the Triton interpreter (`launch.interpreted`), which executes the device-side
tensor descriptors itself (Triton 3.8), so the tests check this very kernel, TMA loads and the tile walk
included, against the exact reference; no pointer-load substitute is needed.

The pieces any persistent TMA GEMM needs are helpers here, shared with the fused MLP's fp8 Linear
(`linear_kernels.fp8_linear_persistent_kernel`): `tile_count` and `tile_product` (one tile's K loop through
the descriptors) on the device, `check_tma` and `persistent_grid` on the host.
"""

# Triton convention: compile-time (constexpr) parameters in capitals; constexpr branches stay if/else.
# ruff: noqa: N803, N806, SIM108

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import (
    _check_conv_inputs,
    _finish,
    _grouped_tile,
    _load_f32,
    _mma,
    _widen,
    check_out_res,
    epilogue_flags,
    epilogue_operands,
)
from deepgap.measure.quant.launch import check, check_vec, launcher

CPU_PROGRAMS = 3  # the interpreter's "SM count": few programs, so each walks several tiles
TMA_ALIGN = 16  # bytes: a TMA descriptor's base address and row pitch


@triton.jit(do_not_specialize=["M"])
def gemm_1x1_kernel(
    x_ptr, w_ptr, out_ptr, alpha_ptr, beta_ptr, res_ptr, gamma, M, N, K: tl.constexpr, RELU: tl.constexpr,
    HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr, ACC_INT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, TMA_EPILOGUE: tl.constexpr,
    EARLY_RES: tl.constexpr = False, PDL: tl.constexpr = False, EPI_N: tl.constexpr = 0,
):  # fmt: skip
    """out[M, N] = epilogue(x[M, K] · w[N, K]ᵀ), one program per SM walking tiles NUM_SMS apart.

    ``K`` is a compile-time constant (a handful of values per network), so the K loop's trip count is
    known and a one-step loop (K = BK) is no loop at all. The epilogue's tile index is a second counter
    (``tile_c``), as in Triton's persistent tutorial, so the pipeliner can run the next tile's loads
    ahead of this tile's epilogue. The pipeliner does not carry the residual ahead (compiled for sm_90,
    its load, by pointers or by TMA, is waited for where it is issued), so ``EARLY_RES`` loads the
    program's next tile's residual into registers before this tile's MMA and hands it on through the
    loop: its latency hides behind a whole tile instead of stalling each epilogue.

    ``EPI_N`` = BN / 2 (``TileConfig.split_epilogue``; 0 or BN: whole) finishes the tile in two column halves,
    each with its half of the residual (`_finish_cols`), as `linear_kernels.fp8_linear_persistent_kernel` does:
    what lets a residual layer take a 256-column tile without spilling (`tiles.WIDE_RESIDUAL`; one H100 at batch
    1024 kept it for ResNet-50's layer3 and layer4 `conv3`, +0.2% in all, results/h100/session48).
    """
    EW: tl.constexpr = BN if EPI_N == 0 else EPI_N
    pdl_enter(PDL)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    o_dst = out_ptr  # where the epilogue stores and reads the residual: descriptors with TMA_EPILOGUE
    r_src = res_ptr
    if TMA_EPILOGUE:
        o_dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EW])
        if HAS_RES and not EARLY_RES:
            r_src = tl.make_tensor_descriptor(res_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EW])
    start = tl.program_id(0)
    tiles = tile_count(M, N, BM, BN)
    tile_c = start - NUM_SMS
    if HAS_RES and EARLY_RES:
        r_next = _residual_tile(res_ptr, start, M, N, BM, BN, GROUP_M)
    for tile in tl.range(start, tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, M, N, BM, BN, GROUP_M)
        if HAS_RES and EARLY_RES:  # this tile's residual came one tile ago; ask for the next one's now
            r_early = r_next
            r_next = _residual_tile(res_ptr, tl.minimum(tile + NUM_SMS, tiles - 1), M, N, BM, BN, GROUP_M)
        acc = tile_product(a_desc, w_desc, pid_m, pid_n, K, BM, BN, BK, ACC_INT)
        tile_c += NUM_SMS
        pid_m, pid_n = _grouped_tile(tile_c, M, N, BM, BN, GROUP_M)
        row0, col0 = pid_m * BM, pid_n * BN
        if EW < BN:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, EW)), (0, 2, 1)))
            _finish_cols(left, row0, col0, o_dst, r_src, left, alpha_ptr, beta_ptr, gamma, M, N, BM, EW, RELU,
                         HAS_RES, OUT_KIND, TMA_EPILOGUE, False)  # fmt: skip
            _finish_cols(right, row0, col0 + EW, o_dst, r_src, right, alpha_ptr, beta_ptr, gamma, M, N, BM, EW, RELU,
                         HAS_RES, OUT_KIND, TMA_EPILOGUE, False)  # fmt: skip
        elif HAS_RES and EARLY_RES:
            _finish_cols(acc, row0, col0, o_dst, r_src, r_early, alpha_ptr, beta_ptr, gamma, M, N, BM, BN, RELU,
                         HAS_RES, OUT_KIND, TMA_EPILOGUE, True)  # fmt: skip
        else:
            _finish_cols(acc, row0, col0, o_dst, r_src, acc, alpha_ptr, beta_ptr, gamma, M, N, BM, BN, RELU,
                         HAS_RES, OUT_KIND, TMA_EPILOGUE, False)  # fmt: skip


@triton.jit
def _finish_cols(
    acc, row0, col0, o_dst, r_src, r_given, alpha_ptr, beta_ptr, gamma, M, N, BM: tl.constexpr, W: tl.constexpr,
    RELU: tl.constexpr, HAS_RES: tl.constexpr, OUT_KIND: tl.constexpr, TMA_EPILOGUE: tl.constexpr,
    GIVEN: tl.constexpr,
):  # fmt: skip
    """The epilogue of the tile's [BM, W] column block at (row0, col0), the whole tile where W = BN.

    ``o_dst`` and ``r_src``: descriptors of that block's shape (``TMA_EPILOGUE``) or the output's and the
    residual's pointers. ``GIVEN``: the residual is ``r_given``, loaded a tile ahead (``EARLY_RES``).
    """
    rm = row0 + tl.arange(0, BM)
    rn = col0 + tl.arange(0, W)
    offs = rm[:, None] * N + rn[None, :]
    y = acc.to(tl.float32) * tl.load(alpha_ptr + rn)[None, :]
    r = y
    if HAS_RES:
        if GIVEN:
            r = _widen(r_given)
        elif TMA_EPILOGUE:
            r = _widen(r_src.load([row0, col0]))
        else:
            r = _load_f32(r_src + offs, (rm < M)[:, None])
    out = _finish(y, tl.load(beta_ptr + rn)[None, :], r, gamma, RELU, HAS_RES, OUT_KIND)
    if TMA_EPILOGUE:
        o_dst.store([row0, col0], out)  # rows past M are clipped by the copy engine
    else:
        tl.store(o_dst + offs, out, mask=(rm < M)[:, None])


@triton.jit
def tile_count(M, N, BM: tl.constexpr, BN: tl.constexpr):
    """Tiles of an [M, N] output (N a multiple of BN): what a persistent grid walks."""
    return ((M + BM - 1) // BM) * (N // BN)


@triton.jit
def tile_product(
    a_desc, w_desc, pid_m, pid_n, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ACC_INT: tl.constexpr,
):  # fmt: skip
    """One output tile's ``A[rows]·W[cols]ᵀ`` through TMA descriptors (A [M, K], W [N, K]), BK at a time.

    Shared by every persistent kernel (`gemm_1x1_kernel`, `linear_kernels.fp8_linear_persistent_kernel`):
    inlined into the caller's tile walk, where the pipeliner flattens it with the walk (``flatten=True``).
    """
    if ACC_INT:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = a_desc.load([pid_m * BM, k])
        b = w_desc.load([pid_n * BN, k])
        acc = _mma(a, b.T, acc, ACC_INT)
    return acc


@triton.jit
def _residual_tile(res_ptr, tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile ``tile``'s residual as stored (8 or 16 bits), by plain loads: rows past M read as zeros."""
    pid_m, pid_n = _grouped_tile(tile, M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    offs = rm[:, None] * N + (pid_n * BN + tl.arange(0, BN))[None, :]
    return tl.load(res_ptr + offs, mask=(rm < M)[:, None], other=0.0)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _scratch(size: int, alignment: int, stream):
    """Triton's allocator for the descriptors each program writes to global memory before its first copy.

    Called at launch; inside CUDA-graph capture the buffer comes from the graph's pool and stays its own.
    """
    return torch.empty(size, dtype=torch.int8, device="cuda")


def programs(device: torch.device) -> int:
    """Programs at one per SM: the GPU's SM count, or `CPU_PROGRAMS` in the interpreter."""
    if device.type != "cuda":
        return CPU_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def check_tma(**operands) -> None:
    """Each operand given (a 2-D tensor or None) can back a TMA descriptor: 16-byte base and row pitch."""
    for name, t in operands.items():
        if t is not None:
            check(
                t.data_ptr() % TMA_ALIGN == 0 and t.shape[1] * t.element_size() % TMA_ALIGN == 0,
                f"{name} must start on a {TMA_ALIGN}-byte boundary with rows a multiple of {TMA_ALIGN} "
                "bytes (a TMA descriptor's base and pitch); use a fresh contiguous tensor",
            )


def persistent_grid(
    device: torch.device, m: int, n: int, cfg, num_programs: int | None = None
) -> tuple[int, int]:
    """(NUM_SMS, grid size) of a persistent launch over an [m, n] output in ``cfg``'s tiles.

    ``num_programs`` overrides the walk's stride (default `programs` × ``cfg.persistent``: that many per
    SM); the grid never exceeds the number of tiles. On a GPU it also installs the allocator the device-side
    descriptors need.
    """
    tiles = triton.cdiv(m, cfg.bm) * (n // cfg.bn)
    nsm = num_programs or programs(device) * max(1, int(cfg.persistent))
    use_descriptors(device)
    return nsm, min(nsm, tiles)


def use_descriptors(device: torch.device) -> None:
    """Before a launch whose kernel makes TMA descriptors on the device: on a GPU, install their allocator."""
    if device.type == "cuda":
        triton.set_allocator(_scratch)


def conv_gemm(
    x, nhw, w, ksize, stride, padding, alpha, beta, out_fmt, relu, cfg, res=None, gamma=0.0, out=None,
    num_programs: int | None = None,
):  # fmt: skip
    """Launch `gemm_1x1_kernel`: `kernels.conv_gemm`'s arguments and result, for 1×1 stride-1 layers only.

    ``num_programs`` overrides the grid's size (default `programs` × ``cfg.persistent``: that many per
    SM); the grid never exceeds the number of tiles. A ``ValueError`` names what this kernel cannot take
    (a larger kernel, a stride, an operand that is not 16-byte aligned for TMA), as `kernels.conv_gemm`
    does for its own limits.
    """
    from deepgap.measure.quant.layers import DTYPES

    check(
        (ksize, stride, padding) == (1, 1, 0),
        f"the persistent kernel runs 1×1 stride-1 unpadded convolutions; got k={ksize}, stride={stride}, "
        f"padding={padding}",
    )
    c, n = _check_conv_inputs(x, nhw, w, ksize, out_fmt, cfg)
    m = x.shape[0]
    check_vec("alpha", alpha, n, x.device)
    check_vec("beta", beta, n, x.device)
    if out is None:
        out = torch.empty((m, n), dtype=DTYPES[out_fmt], device=x.device)
    check_out_res(out, res, m, n, x.device, out_fmt)
    check_tma(x=x, w=w, out=out, residual=res)
    check(
        not (cfg.split_epilogue and cfg.early_res),
        "a tile splits its epilogue or loads its residual early, not both",
    )
    check(  # never offered (`tiles.persistent_configs`): a test's variant, refused where it was seen to go wrong
        not (cfg.early_res and res is not None and c > cfg.bk),
        f"a residual loaded a tile ahead needs K in one step (K={c}, BK={cfg.bk}): with two, compiled for sm_90 "
        "(Triton 3.6), the 128x128 tile's outputs were wrong (session 48's GPU test)",
    )
    nsm, grid = persistent_grid(x.device, m, n, cfg, num_programs)
    launcher(gemm_1x1_kernel, x.device)[(grid,)](
        x,
        w,
        *epilogue_operands(out, alpha, beta, res, gamma),
        m,
        n,
        K=c,
        **epilogue_flags(relu, res, out_fmt),
        ACC_INT=x.dtype == torch.int8,
        NUM_SMS=nsm,
        TMA_EPILOGUE=bool(cfg.tma_epilogue),
        EARLY_RES=bool(cfg.early_res) and res is not None,
        EPI_N=cfg.bn // 2 if cfg.split_epilogue else cfg.bn,
        **cfg.launch(),
        enable_fp_fusion=False,
    )
    return out
