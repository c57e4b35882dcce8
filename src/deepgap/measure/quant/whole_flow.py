"""Dataflow between the whole-network kernel's layers (`whole.whole_kernel` with ``FLOW``): counters, not barriers.

Why: a grid barrier costs 1.35 µs on an H200 (session 34), and it makes every program wait for the slowest tile
of the phase before any starts the next layer. A tile needs far less: a 1×1 layer's output rows need the same
rows of its input, a 3×3 one's the rows one image row above and below, and the residual the same rows of its
producer. So each layer counts its finished tiles per 64-row block (`signal`, after the tile's epilogue
stores), and a tile of the next layer waits only for the row blocks it reads (`wait_rows`), each complete when
its count reaches the producer's column tiles. Layers then overlap: a program goes on to the next layer's
items while the last tiles of this one finish elsewhere.

Why it cannot deadlock (every program resident): the items are dealt round-robin in one order over all layers,
each program takes its own in that order, and an item waits only for items of earlier layers. The unfinished
item earliest in that order has every item it waits for finished, and every item its program took before it
finished, so its program is running it. A wait that outlasts `LIMIT` polls sets the error flag
instead of hanging, as a barrier does. The counters are zeroed by the last program to leave (`reset`).
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import triton
import triton.language as tl

LIMIT = tl.constexpr(1 << 18)  # polls of one counter before the wait gives up and flags the error

# The grid barrier's two halves in PTX, run by one thread of a program. Operands: $1 the counter, $2 the count to
# wait for, $3 the polls before giving up (`LIMIT`), $4 the error flag; registers n, v, q, r declared by the caller.
ARRIVE_PTX = """fence.acq_rel.gpu;
red.relaxed.gpu.global.add.s32 [$1], 1;"""
WAIT_PTX = """mov.u32 n, 0;
WAIT:
ld.relaxed.gpu.global.s32 v, [$1];
add.u32 n, n, 1;
setp.ge.u32 r, n, $3;
@r bra GIVEUP;
setp.lt.s32 q, v, $2;
@q bra WAIT;
bra FENCE;
GIVEUP:
st.relaxed.gpu.global.s32 [$4], 1;
FENCE:
fence.acq_rel.gpu;"""
ONE_THREAD = """mov.u32 t, %tid.x;
mov.u32 $0, 0;
setp.ne.u32 p, t, 0;
@p bra DONE;"""
ARRIVE_ASM = tl.constexpr("{\n.reg .pred p;\n.reg .u32 t;\n" + ONE_THREAD + "\n" + ARRIVE_PTX + "\nDONE:\n}")
WAIT_ASM = tl.constexpr(
    "{\n.reg .pred p, q, r;\n.reg .u32 t, n;\n.reg .s32 v;\n" + ONE_THREAD + "\n" + WAIT_PTX + "\nDONE:\n}"
)


def block_barrier_asm(barrier: int) -> str:
    """Both halves in one asm block, between two ``bar.sync barrier, $5`` ($5: the threads that meet there).

    For a persistent loop that Triton should keep software-pipelined: `grid_sync`'s ``tl.debug_barrier`` stops
    the pipeline of a loop it sits in (compiled for sm_90), this block's own ``bar.sync`` does not
    (benchmarks/stream_ring.py). Thread ``tid % $5 == 0`` arrives and polls: the block's first thread where $5
    is its size, a warp-specialized partition's where ``barrier`` is a named barrier of that partition's threads.
    """
    sync = f"bar.sync {barrier}, $5;"
    head = ["{", ".reg .pred p, q, r;", ".reg .u32 t, n;", ".reg .s32 v;", "mov.u32 $0, 0;", sync]
    lead = ["mov.u32 t, %tid.x;", "rem.u32 t, t, $5;", "setp.ne.u32 p, t, 0;", "@p bra MET;"]
    return "\n".join([*head, *lead, ARRIVE_PTX, WAIT_PTX, "MET:", sync, "}"])


@triton.jit
def fence_after(v, FENCE: tl.constexpr):
    """``fence.acq_rel.gpu`` in every thread, after the read that gave ``v``: that read becomes an acquire.

    Why asm: an ``atomic_add(ptr, 0, sem="acquire")`` whose result is unused left no instruction in the PTX
    (Triton 3.6, session 34); a volatile read (relaxed, system scope) and this fence are PTX's acquire pattern.
    Not in Triton's interpreter (``FENCE`` off), which has no inline asm and runs one program at a time.
    """
    if FENCE:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def wait_count(ptr, target, err_ptr, FENCE: tl.constexpr):
    """Wait until the counter at ``ptr`` reaches ``target``; then the stores of the tiles it counts are seen."""
    polls = 0
    v = tl.load(ptr, volatile=True)
    while (v < target) & (polls < LIMIT):
        polls += 1
        v = tl.load(ptr, volatile=True)
    if polls >= LIMIT:
        tl.atomic_xchg(err_ptr, 1, sem="relaxed", scope="gpu")
    fence_after(v, FENCE)


@triton.jit
def wait_rows(flow_ptr, err_ptr, rm0, m, ks, stride, pad, h, w, oh, ow, x_cnt, x_tn, res_cnt, res_tn, has_res,
              BM: tl.constexpr, FENCE: tl.constexpr):  # fmt: skip
    """Before a tile of output rows ``rm0 ..`` (at most BM): wait for the input rows and residual rows it reads.

    The input rows: from the first output row's top window row to the last one's bottom row, whole image rows
    (a conservative range), as 64-row blocks of the producer's output; ``x_cnt`` < 0: the network's input,
    ready before the launch. The residual (``res_cnt`` ≥ 0): the same row block of its producer.
    """
    if x_cnt >= 0:
        first, last = row_blocks(rm0, m, ks, stride, pad, h, w, oh, ow, BM)
        for t in range(first, last + 1):
            wait_count(flow_ptr + x_cnt + t, x_tn, err_ptr, FENCE)
    if (has_res != 0) & (res_cnt >= 0):
        wait_count(flow_ptr + res_cnt + rm0 // BM, res_tn, err_ptr, FENCE)


@triton.jit
def row_blocks(rm0, m, ks, stride, pad, h, w, oh, ow, BM: tl.constexpr):
    """(first, last) 64-row block of the input that output rows ``rm0 ..`` (at most BM, of ``m``) read.

    From the first output row's top window row to the last one's bottom row, whole image rows (conservative
    within them), clamped to the image.
    """
    r1 = tl.minimum(rm0 + BM, m) - 1
    hw = oh * ow
    nb0 = rm0 // hw
    nb1 = r1 // hw
    ih_lo = tl.maximum(((rm0 - nb0 * hw) // ow) * stride - pad, 0)
    ih_hi = tl.minimum(((r1 - nb1 * hw) // ow) * stride - pad + ks - 1, h - 1)
    return ((nb0 * h + ih_lo) * w) // BM, ((nb1 * h + ih_hi) * w + w - 1) // BM


@triton.jit
def signal(flow_ptr, out_cnt, rm0, BM: tl.constexpr):
    """After a tile's epilogue: count it done in its 64-row block (release: its stores come first)."""
    tl.debug_barrier()
    tl.atomic_add(flow_ptr + out_cnt + rm0 // BM, 1, sem="release", scope="gpu")


@triton.jit
def reset(flow_ptr, n_flow, BLOCK: tl.constexpr):
    """Every counter back to zero (the last program to leave; a CUDA graph then replays the launch as it is)."""
    for off in range(0, n_flow, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        tl.store(flow_ptr + idx, tl.zeros([BLOCK], dtype=tl.int32), mask=idx < n_flow)


@triton.jit
def grid_sync(bar_ptr, err_ptr, target, BARRIER: tl.constexpr, FENCE: tl.constexpr):
    """Arrive at a grid barrier; wait until its counter ``bar_ptr`` reaches ``target``.

    ``target``: the programs (G) where each barrier has its own counter (`whole.whole_kernel`), or G × the
    barriers passed so far where one counter serves them all.

    ``BARRIER`` 0: every thread takes part; each program's stores come before its release-add (block barrier
    first), and a program leaves after an acquire read of the full count, so it sees every program's stores.
    Polls with volatile loads (an atomic poll would queue behind the adds at the one L2 address). 1: as
    cooperative groups' grid sync does it, one thread a program arrives and polls (a fence, an add, polls, a
    fence) while the block waits at its barrier, so 132 programs put 132 polls on the counter's L2 line, not
    132 × 4 warps'. Either gives up after `LIMIT` polls and sets the error flag.
    """
    grid_arrive(bar_ptr, BARRIER)
    grid_wait(bar_ptr, err_ptr, target, BARRIER, FENCE)


@triton.jit
def grid_arrive(bar_ptr, BARRIER: tl.constexpr):
    """`grid_sync`'s first half: this program's stores are issued, then it counts itself in; it does not wait.

    Why apart (`split_k.spread_sum`): between arriving and waiting a program may do work that does not depend
    on the barrier, and only some programs wait at all.
    """
    tl.debug_barrier()
    if BARRIER == 0:
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    else:
        tl.inline_asm_elementwise(
            ARRIVE_ASM,
            "=r,l",
            [bar_ptr],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def grid_wait(bar_ptr, err_ptr, target, BARRIER: tl.constexpr, FENCE: tl.constexpr):
    """`grid_sync`'s second half: wait until the counter reaches ``target`` (one thread polls, as there).

    Then every thread of the program sees every arrived program's stores.
    """
    if BARRIER == 0:
        wait_count(bar_ptr, target, err_ptr, FENCE)
    else:
        tl.inline_asm_elementwise(
            WAIT_ASM,
            "=r,l,r,r,l",
            [bar_ptr, target, LIMIT, err_ptr],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    tl.debug_barrier()
