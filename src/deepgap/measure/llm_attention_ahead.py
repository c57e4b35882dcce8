"""The split decode attention with each chunk of the cache loaded before PDL's wait (``DEEPGAP_DECODE_SPLIT_KV=ahead``).

Why (issue 51, batch 1): on one H100 the split attention and its combine sat on the step's critical path for 6.9 µs
a layer (session 48's timeline), a chain of latencies: PDL's wait for the qkv GEMV, the cache's K and V read from
HBM, the softmax, the partials stored, the combine kernel's own wait and loads. Only the new position's K and V come
from the kernel before (the qkv GEMV writes them, or torch's ``index_copy_`` just before); every earlier position
was written in an earlier step, whose kernels had all finished before this step's began (the steps are separate
launches in stream order). So each split program (`llm_attention.decode_attention_kernel` with ``AHEAD``) loads its
chunk, one block of positions, while the GEMV before it still runs (`load_block`), then waits, reads q and the one
new row, and finishes from registers (`attend_block`): the cache's HBM round trip leaves the critical path.

Positions past ``pos`` are loaded too (the position lives on the device and may come from a kernel of the same
graph, so it is read after the wait) and masked: whatever they hold, NaN included, never reaches the output.

Measured first as one pass (session 49, one H100, 8B fp8, batch 1, bare loop): one 16-warp program per KV head
loading its whole 256-position cache (128 KB) took the step from 2.956 to 3.085 ms. Such a program needs a
whole SM's registers, so it could only start where the qkv GEMV had left an SM empty, at its end: the loads
stayed on the critical path and the combine kernel's saving was lost in eight long programs. The split's
programs are small (four warps, one 32-position block), so they fit beside the GEMV's last programs.
"""

# ruff: noqa: N803

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_block(k_ptr, v_ptr, bh, lo, L, D: tl.constexpr, BL: tl.constexpr, dt: tl.constexpr):
    """K and V of group ``bh`` at positions ``lo .. lo+BL−1`` (those in the cache), as ``dt``: before the wait."""
    rd = tl.arange(0, D)
    cols = lo + tl.arange(0, BL)
    offs = bh.to(tl.int64) * L * D + cols[:, None] * D + rd[None, :]
    ok = (cols < L)[:, None]
    # fp8 codes (`llama_cache`, scale 1) read back as q's dtype; the model's dtype as it is
    k = tl.load(k_ptr + offs, mask=ok, other=0.0).to(dt)
    v = tl.load(v_ptr + offs, mask=ok, other=0.0).to(dt)
    return k, v


@triton.jit
def attend_block(
    q_ptr, k_ptr, v_ptr, k, v, bh, lo, hi, pos, L, scale,
    G: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    """Group ``bh``'s G rows over positions ``lo .. hi−1`` of a block loaded before the wait (``k``, ``v``).

    The new position ``pos`` is read again (its K and V are the previous kernel's writes): its column of
    scores and its row of V go in apart, so the tiles as loaded feed the dots. Returns the rows' running max,
    sum and unnormalised output, as `llm_attention.attend_rows` does.
    """
    rg = tl.arange(0, 16)
    rd = tl.arange(0, D)
    cols = lo + tl.arange(0, BL)
    has = (pos >= lo) & (pos < lo + BL) & (pos < L)
    row = bh.to(tl.int64) * L * D + pos * D + rd
    kn = tl.load(k_ptr + row, mask=(rd < D) & has, other=0.0).to(k.dtype)
    vn = tl.load(v_ptr + row, mask=(rd < D) & has, other=0.0).to(k.dtype)
    q = tl.load(q_ptr + bh * G * D + rg[:, None] * D + rd[None, :], mask=(rg < G)[:, None], other=0.0)
    if DOT_F32:  # the interpreter (its bf16 dot is wrong): the same products in fp32
        q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k))
    s = tl.where((cols == pos)[None, :], tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1)[:, None], s)
    s = tl.where((cols < hi)[None, :], s * scale, float("-inf"))
    m_i = tl.max(s, 1)
    p = tl.exp(s - m_i[:, None]).to(v.dtype)
    v = tl.where(
        (cols < pos)[:, None], v, 0.0
    )  # later positions, whatever they hold (NaN too), count nothing
    p_new = tl.sum(tl.where((cols == pos)[None, :], p.to(tl.float32), 0.0), 1)
    acc = tl.dot(p, v) + p_new[:, None] * vn.to(tl.float32)[None, :]
    return m_i, tl.sum(p.to(tl.float32), 1), acc
