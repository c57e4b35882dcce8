"""The split attention's chunks merged into each query row's output, by a kernel of its own or by the last chunk.

Why a module: the split decode attention (`deepgap.measure.llm_attention`, flash decoding) leaves each query row's
softmax in pieces (a chunk's running max, sum and unnormalised output). They merge as
``Σ e^(m_c − M) o_c / Σ e^(m_c − M) l_c``: in `combine_kernel`, one program a row, after the attention kernel
(`DEEPGAP_DECODE_COMBINE=kernel`, the default), or by the program that finishes a KV head's last chunk, one
group's rows at once (`merge_group`: `llm_attention.store_chunk` with ``last-block``).
"""

# ruff: noqa: N803, N806

from __future__ import annotations

import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter


@triton.jit
def combine_kernel(
    part_ptr, m_ptr, l_ptr, out_ptr, pos_ptr, NQ, POS_STRIDE, CHUNK, NCH,
    D: tl.constexpr, SP: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """One query row's output from its chunks (`merge_row`): ``Σ e^(m_c − M) o_c / Σ e^(m_c − M) l_c``."""
    pdl_enter(PDL)  # after the wait, every chunk's partials are written
    r = tl.program_id(0)  # (sequence, query head)
    merge_row(
        part_ptr, m_ptr, l_ptr, out_ptr, r, tl.load(pos_ptr + (r // NQ) * POS_STRIDE), CHUNK, NCH, D, SP
    )


@triton.jit
def merge_row(part_ptr, m_ptr, l_ptr, out_ptr, r, pos, CHUNK, NCH, D: tl.constexpr, SP: tl.constexpr):
    """Query row ``r``'s output from the chunks that hold a position ≤ pos (the others were not written).

    The partials are read past L1 (``.cg``): in the last-block merge other programs wrote them.
    """
    rc = tl.arange(0, SP)
    rd = tl.arange(0, D)
    ok = (rc < NCH) & (rc * CHUNK <= pos)
    m = tl.load(m_ptr + r * NCH + rc, mask=ok, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(l_ptr + r * NCH + rc, mask=ok, other=0.0, cache_modifier=".cg")  # noqa: E741
    o = tl.load(
        part_ptr + (r * NCH + rc)[:, None] * D + rd[None, :],
        mask=ok[:, None],
        other=0.0,
        cache_modifier=".cg",
    )
    w = tl.exp(m - tl.max(m, 0))  # chunk 0 always holds position 0: the max is finite
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w * l, 0)
    tl.store(out_ptr + r * D + rd, out.to(out_ptr.dtype.element_ty))


@triton.jit
def merge_group(
    part_ptr, m_ptr, l_ptr, out_ptr, bh, pos, CHUNK, NCH, G: tl.constexpr, D: tl.constexpr, SP: tl.constexpr
):
    """Group ``bh``'s G output rows from their chunks: `merge_row`'s arithmetic, all G rows at once.

    Why: one round of loads for the group, where G calls of `merge_row` issue theirs one after another (a row's
    store may alias the next row's loads, so they cannot be hoisted; session 25's last-block merge lost so).
    ``SP``: NCH rounded up to a power of two. Read past L1 (``.cg``): other programs wrote them.
    """
    GP: tl.constexpr = triton.next_power_of_2(G)  # G's rows padded to a power of two
    j = tl.arange(0, GP * SP)
    gl, ch = j // SP, j % SP
    ok = (gl < G) & (ch < NCH) & (ch * CHUNK <= pos)
    idx = (bh * G + gl) * NCH + ch
    rd = tl.arange(0, D)
    m = tl.reshape(tl.load(m_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg"), (GP, SP))
    l = tl.reshape(tl.load(l_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg"), (GP, SP))  # noqa: E741
    o = tl.load(part_ptr + idx[:, None] * D + rd[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
    top = tl.max(m, 1)
    top = tl.where(top == float("-inf"), 0.0, top)  # a padding row (gl ≥ G) has no chunk; chunk 0 holds pos 0
    w = tl.exp(m - top[:, None])
    num = tl.sum(w[:, :, None] * tl.reshape(o, (GP, SP, D)), 1)
    den = tl.sum(w * l, 1)
    rg = tl.arange(0, GP)
    out = num / tl.where(den == 0.0, 1.0, den)[:, None]
    dest = out_ptr + (bh * G + rg)[:, None] * D + rd[None, :]
    tl.store(dest, out.to(out_ptr.dtype.element_ty), mask=(rg < G)[:, None])
