"""Every quantized convolution of the network in one persistent kernel, for the latency-bound small batch.

Why: at batch 1 ResNet-50 is 52 quantized convolutions of 2–10 µs each (session 29's per-layer table, one
H200: 0.262 ms in all), and each kernel pays its launch, its ramp and its drain while most SMs idle. Here
one program per SM walks the layers in order from a table (`whole_plan.Plan`): in each *phase* (layers
that read nothing another layer of the phase writes: a block's first 1×1 and its downsample) the programs
deal out the phase's work items — a 64×64 output tile, or a K slice of one (split-K, the last slice's
program adds the partials in slice order as `split_k` does) — and then meet at a grid barrier before the
next phase reads what this one wrote. The barriers replace 51 kernel boundaries.

The arithmetic and the epilogue are `kernels.conv_gemm_kernel`'s (α·acc + β (+ γ·residual), ReLU,
requantized to the network's 8-bit format), with the layer's shape, stride, padding, ReLU and residual read
at run time instead of compiled in. Activations live in one arena (`Plan.act`) and are read past L1
(``.cg``): another SM wrote them during this launch.

The grid barrier needs every program resident at once: the launch takes at most one program per SM
(`Plan.programs`), and a barrier that waits too long (`whole_flow.LIMIT` polls) gives up and sets an error flag
instead of hanging the GPU, which `Plan.flagged` reports (the engine's check refuses such a plan). The
barrier counters are put back to zero by the last program to leave, so a CUDA graph replays the launch as it
is.

In Triton's interpreter the programs run one after another, so the tests run one program (a barrier of
one passes at once), which walks every item; the GPU tests run one per SM.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803, N806, SIM102, SIM108

from __future__ import annotations

import triton
import triton.language as tl

from deepgap.measure.quant import whole_flow
from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import _mma, _widen, stored, window_origin
from deepgap.measure.quant.launch import launcher

# the table's columns (`whole_plan.Plan.table`), one int64 row per convolution
FIELDS = (
    "x_off", "w_off", "out_off", "res_off", "ab_off", "m", "n", "c", "h", "w", "oh", "ow", "ks", "stride",
    "pad", "relu", "has_res", "split", "sync_after", "ws_off", "cnt_off", "k_total", "out16",
    "x_cnt", "x_tn", "res_cnt", "res_tn", "out_cnt",  # `whole_flow`: counters of the producers and of this layer
)  # fmt: skip
COL = {name: i for i, name in enumerate(FIELDS)}
NF = len(FIELDS)
# the same columns as the kernel reads them, by name (a jit function sees only constexpr globals)
_X_OFF = tl.constexpr(COL["x_off"])
_W_OFF = tl.constexpr(COL["w_off"])
_OUT_OFF = tl.constexpr(COL["out_off"])
_RES_OFF = tl.constexpr(COL["res_off"])
_AB_OFF = tl.constexpr(COL["ab_off"])
_M = tl.constexpr(COL["m"])
_N = tl.constexpr(COL["n"])
_C = tl.constexpr(COL["c"])
_H = tl.constexpr(COL["h"])
_W = tl.constexpr(COL["w"])
_OH = tl.constexpr(COL["oh"])
_OW = tl.constexpr(COL["ow"])
_KS = tl.constexpr(COL["ks"])
_STRIDE = tl.constexpr(COL["stride"])
_PAD = tl.constexpr(COL["pad"])
_RELU = tl.constexpr(COL["relu"])
_HAS_RES = tl.constexpr(COL["has_res"])
_SPLIT = tl.constexpr(COL["split"])
_SYNC_AFTER = tl.constexpr(COL["sync_after"])
_WS_OFF = tl.constexpr(COL["ws_off"])
_CNT_OFF = tl.constexpr(COL["cnt_off"])
_K_TOTAL = tl.constexpr(COL["k_total"])
_OUT16 = tl.constexpr(COL["out16"])
_X_CNT = tl.constexpr(COL["x_cnt"])
_X_TN = tl.constexpr(COL["x_tn"])
_RES_CNT = tl.constexpr(COL["res_cnt"])
_RES_TN = tl.constexpr(COL["res_tn"])
_OUT_CNT = tl.constexpr(COL["out_cnt"])
# one tile for every layer: C_in and C_out of a ResNet are multiples of 64; a layer of C_in ≥ 128 takes K
# steps of 2·BK (`step_k`)
BM, BN, BK = 64, 64, 64


def step_k(c_in: int) -> int:
    """The K step of a layer with ``c_in`` input channels (the kernel's rule): 128 from 128 channels, else 64."""
    return 2 * BK if c_in >= 2 * BK else BK


@triton.jit
def _col(row, col):
    """A shape column of a layer's table row, as int32 (offsets stay int64)."""
    return tl.load(row + col).to(tl.int32)


@triton.jit
def _row(table_ptr, gamma_ptr, i, in_delta, NF: tl.constexpr):
    """Layer ``i``'s row: offsets (int64; the network's input read at ``in_delta``), shapes and flags, γ."""
    row = table_ptr + i * NF
    # a producer's counter below 0: the network's input, read at in_delta (`whole_plan.build`)
    x_off = tl.multiple_of(tl.where(tl.load(row + _X_CNT) < 0, in_delta, tl.load(row + _X_OFF)), 16)
    res_off = tl.multiple_of(tl.where(tl.load(row + _RES_CNT) < 0, in_delta, tl.load(row + _RES_OFF)), 16)
    return (
        x_off, res_off, tl.multiple_of(tl.load(row + _W_OFF), 16), tl.multiple_of(tl.load(row + _OUT_OFF), 16),
        tl.load(row + _AB_OFF), tl.load(row + _WS_OFF), tl.load(row + _CNT_OFF), _col(row, _M), _col(row, _N),
        _col(row, _C), _col(row, _SPLIT), _col(row, _K_TOTAL), _col(row, _H), _col(row, _W), _col(row, _OH),
        _col(row, _OW), _col(row, _KS), _col(row, _STRIDE), _col(row, _PAD), _col(row, _RELU), _col(row, _HAS_RES),
        _col(row, _OUT16), _col(row, _SYNC_AFTER), tl.load(gamma_ptr + i), _col(row, _X_CNT), _col(row, _X_TN),
        _col(row, _RES_CNT), _col(row, _RES_TN), _col(row, _OUT_CNT),
    )  # fmt: skip


@triton.jit
def _tile_sum(act_ptr, w_ptr, x_off, w_off, rm, rn, m_ok, k_lo, k_hi, c, h, w, oh, ow, ks, stride, pad,
              k_total, ACC_INT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """Σ_k A[m, k]·W[n, k] over ``k_lo..k_hi``: A the implicit im2col of the NHWC activation at ``x_off``."""
    rk = tl.arange(0, BK)
    if ACC_INT:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    w_ptrs = w_ptr + w_off + tl.multiple_of(rn * k_total, BK)[None, :] + rk[:, None]
    if (ks == 1) & (stride == 1):
        a_ptrs = act_ptr + x_off + tl.multiple_of(rm * c, BK)[:, None] + rk[None, :]
        for k in range(k_lo, k_hi, BK):
            a = tl.load(a_ptrs + k, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
            acc = _mma(a, tl.load(w_ptrs + k), acc, ACC_INT)
    else:
        nb, ih0, iw0 = window_origin(rm, oh, ow, stride, pad)
        for k in range(k_lo, k_hi, BK):
            tap = k // c
            c0 = tl.multiple_of(k - tap * c, BK)
            kh = tap // ks
            kw = tap - kh * ks
            ih = ih0 + kh
            iw = iw0 + kw
            ok = m_ok & (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
            row = tl.multiple_of(((nb * h + ih) * w + iw) * c, BK)
            a = tl.load(act_ptr + x_off + row[:, None] + (c0 + rk)[None, :], mask=ok[:, None], other=0.0,
                        cache_modifier=".cg")  # fmt: skip
            acc = _mma(a, tl.load(w_ptrs + k), acc, ACC_INT)
    return acc


@triton.jit
def _epilogue(acc, alpha, beta, r_raw, act_ptr, o16_ptr, out_off, gamma, offs, m_ok, relu, has_res, out16,
              OUT_KIND: tl.constexpr):  # fmt: skip
    """`kernels._conv_epilogue`'s steps: α·acc + β (+ γ·residual), ReLU, stored in the network's 8-bit format.

    α, β and the residual's stored tile come loaded (before the K loop). The layer the head reads (``out16``)
    is stored in fp16 into ``o16_ptr`` instead.
    """
    y = acc.to(tl.float32) * alpha[None, :]
    y = y + beta[None, :]
    y = tl.where(has_res, y + _widen(r_raw) * gamma, y)
    y = tl.where(relu, tl.maximum(y, 0.0), y)
    if out16:
        tl.store(o16_ptr + offs, stored(y, 2), mask=m_ok[:, None])
    else:
        tl.store(act_ptr + out_off + offs, stored(y, OUT_KIND), mask=m_ok[:, None])


@triton.jit
def _split_sum(acc, ws_ptr, cnt_ptr, tile, s, split, offs, m_ok, mn):
    """(the tile's whole sum, whether this program has it): `split_k.split_sum` with a run-time split."""
    tl.store(ws_ptr + s * mn + offs, acc, mask=m_ok[:, None])
    tl.debug_barrier()
    last = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu") == split - 1
    total = tl.zeros_like(acc)
    if last:
        # in slice order, so the sum does not depend on who finished last; four loads in flight at a time
        # (masked past the split), not one: a loop of dependent L2 reads cost ~1 µs a slice (session 34)
        for i in range(0, split, 4):
            for u in tl.static_range(4):
                ok = m_ok[:, None] & (i + u < split)
                total += tl.load(ws_ptr + (i + u) * mn + offs, mask=ok, other=0, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
    return total, last


@triton.jit
def _item(j, act_ptr, o16_ptr, w_ptr, alpha_ptr, beta_ptr, ws_ptr, cnt_ptr, x_off, res_off, w_off, out_off, ab_off,
          ws_off, cnt_off, m, n, c, split, k_total, h, w, oh, ow, ks, stride, pad, relu, has_res, out16, gamma,
          flow_ptr, err_ptr, x_cnt, x_tn, res_cnt, res_tn, out_cnt, ACC_INT: tl.constexpr, OUT_KIND: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FLOW: tl.constexpr, FENCE: tl.constexpr):  # fmt: skip
    """Work item ``j`` of a layer: one 64×64 output tile, or one K slice of it (split-K), and its epilogue.

    With ``FLOW`` it first waits for the row blocks it reads (`whole_flow.wait_rows`) and, once its tile is
    stored, counts it done (`whole_flow.signal`).
    """
    tiles_n = n // BN
    slice_k = k_total // split
    tile = j // split
    s = j - tile * split
    pid_m = tile // tiles_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = (tile - pid_m * tiles_n) * BN + tl.arange(0, BN)
    m_ok = rm < m
    if FLOW:
        whole_flow.wait_rows(flow_ptr, err_ptr, pid_m * BM, m, ks, stride, pad, h, w, oh, ow, x_cnt, x_tn, res_cnt,
                             res_tn, has_res, BM, FENCE)  # fmt: skip
    offs = tl.multiple_of(rm[:, None] * n, [1, BN]) + rn[None, :]  # N is a multiple of 64
    # the epilogue's operands first: their loads overlap the K loop instead of following it
    alpha = tl.load(alpha_ptr + ab_off + rn)
    beta = tl.load(beta_ptr + ab_off + rn)
    r_raw = tl.load(act_ptr + res_off + offs, mask=m_ok[:, None] & (has_res != 0), other=0.0,
                    cache_modifier=".cg")  # fmt: skip
    if c >= 2 * BK:  # K steps of 2·BK: half the steps, twice the bytes in flight a stage
        k_lo = tl.multiple_of(s * slice_k, 2 * BK)  # a whole number of K steps (`whole_plan._split`)
        k_hi = tl.multiple_of(k_lo + slice_k, 2 * BK)
        acc = _tile_sum(act_ptr, w_ptr, x_off, w_off, rm, rn, m_ok, k_lo, k_hi, c, h, w, oh, ow, ks, stride,
                        pad, k_total, ACC_INT, BM, BN, 2 * BK)  # fmt: skip
    else:
        k_lo = tl.multiple_of(s * slice_k, BK)
        k_hi = tl.multiple_of(k_lo + slice_k, BK)
        acc = _tile_sum(act_ptr, w_ptr, x_off, w_off, rm, rn, m_ok, k_lo, k_hi, c, h, w, oh, ow, ks, stride,
                        pad, k_total, ACC_INT, BM, BN, BK)  # fmt: skip
    last = split <= 1
    if split > 1:
        acc, last = _split_sum(acc, ws_ptr + ws_off, cnt_ptr + cnt_off, tile, s, split, offs, m_ok, m * n)
    if last:
        _epilogue(acc, alpha, beta, r_raw, act_ptr, o16_ptr, out_off, gamma, offs, m_ok, relu != 0,
                  has_res != 0, out16 != 0, OUT_KIND)  # fmt: skip
        if FLOW:
            whole_flow.signal(flow_ptr, out_cnt, pid_m * BM, BM)


@triton.jit(do_not_specialize=["in_delta", "n_convs", "n_phases", "n_flow"])
def whole_kernel(
    table_ptr, gamma_ptr, act_ptr, in_delta, o16_ptr, w_ptr, alpha_ptr, beta_ptr, ws_ptr, cnt_ptr, sync_ptr,
    n_convs, n_phases, times_ptr, flow_ptr, n_flow, NF: tl.constexpr, ACC_INT: tl.constexpr,
    OUT_KIND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BARRIER: tl.constexpr = 0,
    TIMES: tl.constexpr = False, SKIP_WORK: tl.constexpr = False, FLOW: tl.constexpr = False,
    FENCE: tl.constexpr = True, PDL: tl.constexpr = False,
):  # fmt: skip
    """All the plan's convolutions, phase by phase, each program taking every G-th work item of a phase.

    ``in_delta``: the network's input (the stem's output) as an element offset from ``act_ptr`` (rows whose
    ``x_cnt`` / ``res_cnt`` is below 0 read it there). ``o16_ptr``: the fp16 output of the layer the head reads
    (``out16``). ``sync_ptr``: ``n_phases`` barrier counters, the exit counter, the error flag.
    The row's columns are read through constexprs made from `COL`, so the kernel and the table agree by name.
    ``BARRIER``: the grid barrier's form (`whole_flow.grid_sync`). For the benchmark that finds where the time goes:
    ``TIMES`` has program 0 write the global timer (ns) into ``times_ptr`` at the start and after each barrier,
    and ``SKIP_WORK`` leaves out every work item, so what is left is the barriers alone. ``FLOW``: no barriers;
    each tile waits for the row blocks it reads instead (`whole_flow`, ``n_flow`` counters at ``flow_ptr``).
    ``FENCE``: the acquire fences after each wait (off in Triton's interpreter: no inline asm, one program).
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    dealt = 0  # items of the current phase dealt before this layer's
    phase = 0
    if TIMES:
        if pid == 0:
            tl.store(times_ptr, tl.extra.cuda.globaltimer())
    # each layer's row is read during the previous phase, before its barrier, so that the read's L2 round trip
    # overlaps the wait instead of starting the phase (the table ends in a row of zeros)
    x_off, res_off, w_off, out_off, ab_off, ws_off, cnt_off, m, n, c, split, k_total, h, w, oh, ow, ks, stride, \
        pad, relu, has_res, out16, sync, gamma, x_cnt, x_tn, res_cnt, res_tn, out_cnt = _row(
            table_ptr, gamma_ptr, 0, in_delta, NF)  # fmt: skip
    err_ptr = sync_ptr + n_phases + 1
    for i in range(0, n_convs):
        items = ((m + BM - 1) // BM) * (n // BN) * split
        first = (pid - dealt % G + G) % G  # this program's first item j: (dealt + j) % G == pid
        if SKIP_WORK:
            first = items
        for j in range(first, items, G):
            _item(j, act_ptr, o16_ptr, w_ptr, alpha_ptr, beta_ptr, ws_ptr, cnt_ptr, x_off, res_off, w_off, out_off,
                  ab_off, ws_off, cnt_off, m, n, c, split, k_total, h, w, oh, ow, ks, stride, pad, relu, has_res,
                  out16, gamma, flow_ptr, err_ptr, x_cnt, x_tn, res_cnt, res_tn, out_cnt, ACC_INT, OUT_KIND, BM, BN,
                  BK, FLOW, FENCE)  # fmt: skip
        dealt += items
        barrier = sync
        x_off, res_off, w_off, out_off, ab_off, ws_off, cnt_off, m, n, c, split, k_total, h, w, oh, ow, ks, \
            stride, pad, relu, has_res, out16, sync, gamma, x_cnt, x_tn, res_cnt, res_tn, out_cnt = _row(
                table_ptr, gamma_ptr, i + 1, in_delta, NF)  # fmt: skip
        if not FLOW:
            if barrier != 0:
                whole_flow.grid_sync(sync_ptr + phase, err_ptr, G, BARRIER, FENCE)
                phase += 1
                dealt = 0
                if TIMES:
                    if pid == 0:
                        tl.store(times_ptr + phase, tl.extra.cuda.globaltimer())
    if TIMES:
        if pid == 0:
            tl.store(times_ptr + n_phases + 1, tl.extra.cuda.globaltimer())
    # the last to leave puts the barrier counters back to zero: every program has passed every barrier
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + n_phases, 1, sem="acq_rel", scope="gpu") == G - 1:
        for p in range(0, n_phases + 1):
            tl.atomic_xchg(sync_ptr + p, 0, sem="relaxed", scope="gpu")
        if FLOW:
            whole_flow.reset(flow_ptr, n_flow, 1024)


def launch(device, programs: int):
    """``whole_kernel`` on ``programs`` programs of ``device`` (interpreted on the CPU), for `whole_plan.Plan.run`."""
    return launcher(whole_kernel, device)[(programs,)]
