"""Every layer of a batch-1 decode step in one persistent kernel: no kernel boundary between the GEMVs.

Why: at batch 1 the 8B step reads its 7.5 GB of 8-bit weights at 0.69× a plain read (session 23): about 190
kernels a token, and each GEMV of 17–117 MB pays 3–4 µs for its launch, ramp and tail while HBM idles
(`deepgap.measure.llm_fused`, docs/llm.md). Here the programs (one an SM, all resident) walk the layers in
order; a layer is five *phases*, each ended by a grid barrier (1.35 µs on an H200 in session 34) instead of a
kernel boundary:

    1. qkv:    the fused row GEMV with the norm and RoPE folded in; q to a row, k and v into the layer's cache
    2. attend: (KV head, chunk) items over the cache up to the step's position, the chunk's softmax partials
               stored; the last chunk of a KV head to finish merges its query heads' rows (`llm_merge.merge_group`)
    3. o:      the GEMV of the attention's row, the residual added, into the hidden row
    4. gate_up: the norm and SwiGLU folded in, into the MLP's row
    5. down:   its GEMV, the residual added, into the hidden row

The barrier is split (`whole_flow.grid_arrive`, then `grid_wait`): a program that has finished a phase counts
itself in, loads its first weights of the next GEMV phase (which never depend on the barrier), and only then
waits, so the load's latency overlaps the wait. Each GEMV phase deals its bands of ``BN`` output channels
round-robin and walks (band, K step) as one loop; with ``AHEAD`` each step's weights are loaded a step early.

With ``LEAD_KB`` each program keeps that many KB of its own coming weights asked of L2
(``cp.async.bulk.prefetch.L2``, one thread, a band at a time), across the barriers too: its first bands of a
phase before the wait that starts it (o's before the attention, which reads little of HBM), then a band
further on as each band starts. Why: one program of 16 warps an SM holds one K step of weights in registers,
8-32 KB (at most 32 without spilling), 1-4 MB over 132 SMs, while HBM at 4.8 TB/s and ~1 µs under load wants
~5 MB in flight (the per-layer GEMVs have several programs an SM). A prefetch takes no register and is not
waited for, so HBM sees the lead's bytes in flight and the loads that follow hit L2 (at 64 KB: 8.4 MB in all).

The arithmetic is `gemv_fused`'s (`fused_step`, `finish`), the attention `llm_attention`'s (`attend_rows`,
`store_chunk`): the same sums as the per-layer kernels in the same order. Activations written during the launch
are read past L1 (``.cg``).

The layers' weights, scales, norms and caches are found through a device table of pointers (`NF` int64 a
layer, `llm_whole_plan`), so that nothing is copied. One counter serves every barrier (its target grows by G
each time); the last program to leave puts it back to zero, so a CUDA graph replays the launch as it is. A wait
that lasts too long sets the error flag instead of hanging (`whole_flow.LIMIT`). In Triton's interpreter the
programs run one after another, so the tests run one program, which takes every item.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803, N806, SIM102

from __future__ import annotations

import triton
import triton.language as tl

from deepgap.measure.llm_attention import attend_rows, store_chunk
from deepgap.measure.quant import gemv, l2_prefetch
from deepgap.measure.quant.gemv_fused import finish, folded_root, fused_step, rows_first
from deepgap.measure.quant.kernels import pdl_enter
from deepgap.measure.quant.launch import launcher
from deepgap.measure.quant.whole_flow import grid_arrive, grid_wait

# a layer's row of the pointer table: codes and per-channel scales of the four projections, the two norms'
# scales, the layer's K and V cache
COLUMNS = ("qkv", "qkv_s", "o", "o_s", "gate_up", "gate_up_s", "down", "down_s", "norm1", "norm2", "k", "v")
NF = tl.constexpr(len(COLUMNS))
# the columns as the kernel reads them, by name (a jit function sees only constexpr globals)
_QKV, _QKV_S, _O, _O_S = (tl.constexpr(COLUMNS.index(c)) for c in ("qkv", "qkv_s", "o", "o_s"))
_GU, _GU_S, _DN, _DN_S = (tl.constexpr(COLUMNS.index(c)) for c in ("gate_up", "gate_up_s", "down", "down_s"))
_N1, _N2, _K, _V = (tl.constexpr(COLUMNS.index(c)) for c in ("norm1", "norm2", "k", "v"))


@triton.jit
def _ptr(row, col, ty):
    """Column ``col`` of a layer's table row as a pointer to ``ty``."""
    return tl.load(row + col).to(tl.pointer_type(ty))


@triton.jit
def _band(w_ptr, t, steps, pid, G, K, second, rk, ok, BN: tl.constexpr, BK: tl.constexpr, D: tl.constexpr,
          ROPE: tl.constexpr, PAIRED: tl.constexpr):  # fmt: skip
    """Step ``t`` of a program's (band, K step) walk: weights (none loaded where ``ok`` is false), rows, K offset.

    Returns the band's weights (and its pair's), its output channels, its weight rows and the step's K offset.
    """
    rn = (pid + (t // steps) * G) * BN + tl.arange(0, BN)
    k = (t % steps) * BK
    rows = rows_first(rn, D, ROPE)
    w_ptrs = w_ptr + rows[:, None] * K + k + rk[None, :]
    w = tl.load(w_ptrs, mask=ok, other=0.0)
    w_up = w
    if PAIRED:
        w_up = tl.load(w_ptrs + second * K, mask=ok, other=0.0)
    return w, w_up, rn, rows, k


@triton.jit
def _gemv_phase(
    pid, G, x_ptr, w_ptr, s_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr,
    L, NQ, NKV, bar_ptr, done, times_ptr, NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr,
    ROPE: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, AHEAD: tl.constexpr,
    BARRIER: tl.constexpr, FENCE: tl.constexpr, TIMES: tl.constexpr, ONE: tl.constexpr, LEAD_KB: tl.constexpr,
):  # fmt: skip
    """This program's bands of one fused row GEMV (`gemv_fused.fused_row_kernel`'s arithmetic, REDUCE each step).

    Bands ``pid, pid + G, ...`` of ``NO / BN``, walked as one loop of (band, K step). The first step's weights
    are loaded before the wait for the ``done``-th barrier (`_wait`): they never depend on it, so their latency
    overlaps the wait. ``AHEAD``: every step's weights are loaded one step ahead, so two steps' bytes are in
    flight (a program is alone on its SM: no other program's loads cover its wait). ``ONE``: K is one step
    (``BK == K``), so x is the same for every band: read once a phase, normalised once (the root folded into
    it), not once a band as a kernel of one band a program must. ``res_ptr`` may be ``out_ptr`` (the hidden row
    updated in place: a band reads only its own channels). ``LEAD_KB``: as each band starts, L2 is asked for
    the band `_lead_bands` further on (`_lead_in` asked for the first ones before the wait).
    """
    PAIRED: tl.constexpr = SWIGLU or ROPE
    steps = K // BK
    total = (NO // BN - pid + G - 1) // G * steps
    second = NO
    if ROPE:
        second = D // 2
    ahead_band = pid + _lead_bands(NO, K, BN, PAIRED, LEAD_KB) * G  # the band asked of L2 as band pid starts
    rk = tl.arange(0, BK)
    acc = tl.zeros((BN,), dtype=tl.float32)
    acc_up = acc
    squares = tl.zeros((BK,), dtype=tl.float32)
    w, w_up, rn, rows, k = _band(w_ptr, 0, steps, pid, G, K, second, rk, total > 0, BN, BK, D, ROPE, PAIRED)
    _wait(bar_ptr, G, done, BARRIER, FENCE, times_ptr, TIMES)
    if ONE:  # x · γ · rsqrt(mean(x²) + eps), once: `finish` then has no norm to apply
        xs = tl.load(x_ptr + rk, cache_modifier=".cg").to(tl.float32)
        if NORM:
            root = folded_root(xs * xs, K, eps)
            xs = xs * tl.load(gamma_ptr + rk).to(tl.float32) * root
    for t in range(0, total):
        if LEAD_KB > 0:  # noqa: SIM102 - a constexpr, then a runtime test
            if t % steps == 0:
                _prefetch(ahead_band + (t // steps) * G, w_ptr, NO, K, second, BN, D, ROPE, PAIRED)
        if AHEAD:
            nxt = _band(w_ptr, t + 1, steps, pid, G, K, second, rk, t + 1 < total, BN, BK, D, ROPE, PAIRED)
        elif t > 0:
            w, w_up, rn, rows, k = _band(
                w_ptr, t, steps, pid, G, K, second, rk, True, BN, BK, D, ROPE, PAIRED
            )
        if ONE:
            acc = gemv.mac(tl.zeros((BN,), dtype=tl.float32), w, xs, True)
            if PAIRED:
                acc_up = gemv.mac(tl.zeros((BN,), dtype=tl.float32), w_up, xs, True)
            finish(acc, acc_up, 1.0, rn, rows, second, s_ptr, res_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr,
                   v_ptr, L, NQ, NKV, SWIGLU, RESIDUAL, ROPE, D, True, ".cg")  # fmt: skip
        else:
            acc, acc_up, squares = fused_step(acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk, NORM,
                                              PAIRED, True, ".cg")  # fmt: skip
            if k + BK == K:
                root = 1.0
                if NORM:
                    root = folded_root(squares, K, eps)
                finish(acc, acc_up, root, rn, rows, second, s_ptr, res_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr,
                       k_ptr, v_ptr, L, NQ, NKV, SWIGLU, RESIDUAL, ROPE, D, True, ".cg")  # fmt: skip
                acc = tl.zeros((BN,), dtype=tl.float32)
                acc_up = acc
                squares = tl.zeros((BK,), dtype=tl.float32)
        if AHEAD:
            w, w_up, rn, rows, k = nxt


@triton.jit
def _lead_bands(NO, K, BN: tl.constexpr, PAIRED: tl.constexpr, LEAD_KB: tl.constexpr):
    """How many of a program's bands of a GEMV phase its L2 prefetch keeps asked for ahead: ``LEAD_KB`` of them.

    At least one; a band is BN rows of K codes (two bands for a pair): 16 KB for o's, 57 KB for down's.
    """
    return tl.maximum((LEAD_KB * 1024) // (BN * K * (1 + PAIRED)), 1)


@triton.jit
def _prefetch(band, w_ptr, NO, K, second, BN: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
              PAIRED: tl.constexpr):  # fmt: skip
    """Ask L2 for band ``band`` of a GEMV phase's weights, where there is one (sm_90; never interpreted).

    ``PAIRED``: with its pair ``second`` rows further (SwiGLU's up rows: NO; RoPE's other half: D/2). One
    ``cp.async.bulk.prefetch.L2`` a band, from one thread (`l2_prefetch.band`): no registers, no wait.
    """
    if band < NO // BN:
        l2_prefetch.band(w_ptr, rows_first(band * BN, D, ROPE), K, second, BN, PAIRED)


@triton.jit
def _lead_in(pid, G, w_ptr, NO, K, second, BN: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
             PAIRED: tl.constexpr, LEAD_KB: tl.constexpr):  # fmt: skip
    """Before a GEMV phase's wait: ask L2 for this program's first bands of it (`_lead_bands`; none at 0 KB).

    The weights do not depend on what the barrier waits for, so HBM reads them across the barrier, and the
    phase's first loads hit L2; inside the phase `_gemv_phase` keeps the same lead band by band.
    """
    if LEAD_KB > 0:
        for j in range(0, _lead_bands(NO, K, BN, PAIRED, LEAD_KB)):
            _prefetch(pid + j * G, w_ptr, NO, K, second, BN, D, ROPE, PAIRED)


@triton.jit
def _attention_phase(
    pid, G, q_ptr, k_ptr, v_ptr, ws_ptr, a_ptr, cnt_ptr, pos, L, scale, NQ, NKV, CHUNK, NCH,
    GQ: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, SP: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    """Items (KV head, chunk): the chunk's softmax partials, then the last chunk of a head merges its rows.

    As `llm_attention.decode_attention_kernel` with ``SPLIT`` and ``LAST``; a chunk past ``pos`` writes nothing
    but still counts. ``ws``: partial outputs (NQ·NCH·D), then maxima and sums (NQ·NCH each), fp32.
    """
    m_ptr = ws_ptr + NQ * NCH * D
    l_ptr = m_ptr + NQ * NCH
    for j in range(pid, NKV * NCH, G):
        bh = j // NCH
        lo = (j % NCH) * CHUNK
        hi = tl.minimum(tl.minimum(lo + CHUNK, L), pos + 1)
        m_i, l_i, acc = attend_rows(q_ptr, k_ptr, v_ptr, bh, lo, hi, L, scale, GQ, D, BL, DOT_F32, ".cg", 1)
        store_chunk(ws_ptr, m_ptr, l_ptr, cnt_ptr, a_ptr, bh, j % NCH, lo, pos, m_i, l_i, acc, CHUNK, NCH, GQ, D, SP,
                    True)  # fmt: skip


@triton.jit
def _wait(bar_ptr, G, done, BARRIER: tl.constexpr, FENCE: tl.constexpr, times_ptr, TIMES: tl.constexpr):
    """Wait until every program has arrived ``done`` times (one counter, its target growing by G).

    The error flag is at ``bar + 2``. ``TIMES`` (`benchmarks/whole_decode_phases.py`): program 0 then writes the
    global timer (ns).
    """
    grid_wait(bar_ptr, bar_ptr + 2, G * done, BARRIER, FENCE)
    if TIMES:
        if tl.program_id(0) == 0:
            tl.store(times_ptr + done, tl.extra.cuda.globaltimer())


@triton.jit
def _arrive(bar_ptr, done, BARRIER: tl.constexpr):
    """This program's phase is done (its stores issued first): one more arrival; the next phase waits for it."""
    grid_arrive(bar_ptr, BARRIER)
    return done + 1


@triton.jit
def whole_decode_kernel(
    x_ptr, h_ptr, table_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, a_ptr, mid_ptr, ws_ptr, cnt_ptr, bar_ptr,
    LAYERS, H, F, NQ, NKV, L, CHUNK, NCH, eps, scale,
    D: tl.constexpr, GQ: tl.constexpr, INT8: tl.constexpr, BN_QKV: tl.constexpr, BK_QKV: tl.constexpr,
    BN_O: tl.constexpr, BK_O: tl.constexpr, BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_DN: tl.constexpr,
    BK_DN: tl.constexpr, AHEAD: tl.constexpr, ONE: tl.constexpr, BL: tl.constexpr, SP: tl.constexpr,
    BARRIER: tl.constexpr, FENCE: tl.constexpr, LEAD_KB: tl.constexpr, DOT_F32: tl.constexpr,
    PDL: tl.constexpr = False, times_ptr=None, TIMES: tl.constexpr = False,
):  # fmt: skip
    """The hidden row ``x (1, H)`` through every layer into ``h`` (module docstring); caches written at ``pos``.

    ``q``, ``a``: the step's query and attention rows (NQ·D), ``mid``: the MLP's row (F); ``cnt``: NKV int32
    merge counts, ``bar``: the barrier's counter, the exit count and the error flag, all 0 at rest. ``PDL``:
    launched inside `launch.pdl` (a decode graph's), it waits for the previous kernel before reading anything.
    ``TIMES``: the global timer as program 0 passes each wait (`_wait`), and after the last phase. ``ONE``: the
    GEMV phases whose K is one step (bits 1 qkv, 2 o, 4 gate_up, 8 down; `_gemv_phase`; the host's choice:
    `llm_whole_plan._one_step`). ``LEAD_KB``: each program keeps that many KB of its weights asked of L2 ahead
    of its loads (`_lead_in`, `_gemv_phase`; 0: none).
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    wty = tl.float8e4nv
    if INT8:
        wty = tl.int8
    pos = tl.load(pos_ptr)
    n_qkv = (NQ + 2 * NKV) * (D // 2)  # RoPE's channel pairs
    done = 0  # phases every program has finished (arrivals of each at the barrier's counter)
    _lead_in(pid, G, _ptr(table_ptr, _QKV, wty), n_qkv, H, D // 2, BN_QKV, D, True, True, LEAD_KB)
    # not hoisting what each phase's loops need out of the layer loop: hoisted, all of it was live at once and
    # 32 layers spilled 348-404 B a thread (sm_90, Triton 3.6; 16-24 B without)
    for layer in tl.range(0, LAYERS, disable_licm=True):
        row = table_ptr + layer * NF
        src = h_ptr
        if layer == 0:
            src = x_ptr
        k_ptr = _ptr(row, _K, tl.bfloat16)
        v_ptr = _ptr(row, _V, tl.bfloat16)
        rope = (cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, L, NQ, NKV)
        # 1. qkv: the norm and RoPE folded in; q to its row, k and v into the cache
        w, w_s, gamma = _ptr(row, _QKV, wty), _ptr(row, _QKV_S, tl.float32), _ptr(row, _N1, tl.bfloat16)
        _gemv_phase(pid, G, src, w, w_s, gamma, src, q_ptr, n_qkv, H, eps, *rope, bar_ptr, done, times_ptr, True,
                    False, False, True, D, BN_QKV, BK_QKV, AHEAD, BARRIER, FENCE, TIMES, ONE & 1, LEAD_KB)  # fmt: skip
        done = _arrive(bar_ptr, done, BARRIER)
        # 2. the attention over the cache, split in chunks, merged by each KV head's last chunk (o's weights
        # asked of L2 first: the attention reads little of HBM)
        w, w_s = _ptr(row, _O, wty), _ptr(row, _O_S, tl.float32)
        _lead_in(pid, G, w, H, NQ * D, 0, BN_O, D, False, False, LEAD_KB)
        _wait(bar_ptr, G, done, BARRIER, FENCE, times_ptr, TIMES)
        _attention_phase(pid, G, q_ptr, k_ptr, v_ptr, ws_ptr, a_ptr, cnt_ptr, pos, L, scale, NQ, NKV, CHUNK, NCH,
                         GQ, D, BL, SP, DOT_F32)  # fmt: skip
        done = _arrive(bar_ptr, done, BARRIER)
        # 3. o, the residual added: into the hidden row
        _gemv_phase(pid, G, a_ptr, w, w_s, a_ptr, src, h_ptr, H, NQ * D, eps, *rope, bar_ptr, done, times_ptr, False,
                    False, True, False, D, BN_O, BK_O, AHEAD, BARRIER, FENCE, TIMES, ONE & 2, LEAD_KB)  # fmt: skip
        done = _arrive(bar_ptr, done, BARRIER)
        # 4. gate_up, the norm and SwiGLU folded in: the MLP's row
        w, w_s, gamma = _ptr(row, _GU, wty), _ptr(row, _GU_S, tl.float32), _ptr(row, _N2, tl.bfloat16)
        _lead_in(pid, G, w, F, H, F, BN_GU, D, False, True, LEAD_KB)
        _gemv_phase(pid, G, h_ptr, w, w_s, gamma, h_ptr, mid_ptr, F, H, eps, *rope, bar_ptr, done, times_ptr, True,
                    True, False, False, D, BN_GU, BK_GU, AHEAD, BARRIER, FENCE, TIMES, ONE & 4, LEAD_KB)  # fmt: skip
        done = _arrive(bar_ptr, done, BARRIER)
        # 5. down, the residual added: the hidden row in place (a band reads and writes only its own channels)
        w, w_s = _ptr(row, _DN, wty), _ptr(row, _DN_S, tl.float32)
        _lead_in(pid, G, w, H, F, 0, BN_DN, D, False, False, LEAD_KB)
        _gemv_phase(pid, G, mid_ptr, w, w_s, mid_ptr, h_ptr, h_ptr, H, F, eps, *rope, bar_ptr, done, times_ptr,
                    False, False, True, False, D, BN_DN, BK_DN, AHEAD, BARRIER, FENCE, TIMES, ONE & 8,
                    LEAD_KB)  # fmt: skip
        done = _arrive(bar_ptr, done, BARRIER)
        if layer + 1 < LAYERS:
            _lead_in(pid, G, _ptr(row + NF, _QKV, wty), n_qkv, H, D // 2, BN_QKV, D, True, True, LEAD_KB)
    if TIMES:  # the last phase's end: every program's last arrival
        _wait(bar_ptr, G, done, BARRIER, FENCE, times_ptr, TIMES)
    # the last to leave puts the counter back to zero: every program has passed every wait (the last phase's
    # arrivals have no wait: the next layer's qkv is what needs them, and the launch's end orders the output)
    tl.debug_barrier()
    if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")


def launch(device, programs: int):
    """`whole_decode_kernel` on ``programs`` programs of ``device`` (interpreted on the CPU)."""
    return launcher(whole_decode_kernel, device)[(programs,)]
