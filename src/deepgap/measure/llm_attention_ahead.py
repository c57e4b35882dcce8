"""The decode attention with a KV head's whole cache loaded before PDL's wait: one pass, no combine kernel.

Why (issue 51, batch 1): on one H100 the split attention and its combine sat on the step's critical path for 6.9 µs
a layer (session 48's timeline), a chain of latencies: PDL's wait for the qkv GEMV, the cache's K and V read from
HBM, the softmax, the partials stored, the combine kernel's own wait, launch and loads. Only the new position's K
and V come from the kernel before (the qkv GEMV writes them, or torch's ``index_copy_`` just before); every earlier
position was written in an earlier step, whose kernels had all finished before this step's began (the steps are
separate launches in stream order). So here one program per (sequence, KV head) loads its whole cache, up to
``BL`` positions, while the GEMV before it still runs, then waits, reads q and the one new row, and finishes in
registers: one HBM round trip and one kernel fewer on the critical path.

It fits only where the cache is short: K and V of one KV head in one program's registers (`fits`:
``AHEAD_BYTES``), 256 positions of 128 bf16 channels; longer caches take the split (`llm_attention.plan`).
Positions past ``pos`` are loaded too (the position lives on the device and may come from a kernel of the same
graph, so it is read after the wait) and masked: whatever they hold, NaN included, never reaches the output.
"""

# ruff: noqa: N803

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.launch import launcher

AHEAD_BYTES = 128 * 1024  # K and V of one KV head, loaded at once: 64 registers a thread at `AHEAD_WARPS`
AHEAD_WARPS = 16


def block(length: int) -> int:
    """The positions one program loads: ``length`` rounded up to a power of two (at least 16, the dot's K)."""
    return max(16, triton.next_power_of_2(length))


def fits(length: int, row_bytes: int) -> bool:
    """Whether a KV head's K and V (``row_bytes`` a position each: head_dim × the cache's itemsize) fit one program."""
    return 2 * block(length) * row_bytes <= AHEAD_BYTES


@triton.jit
def ahead_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, L, scale, NKV, POS_STRIDE,
    G: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """``out[bh] = softmax(q[bh] · K[bh, :pos+1]ᵀ · scale) · V[bh, :pos+1]`` with K and V read before the wait."""
    bh = tl.program_id(0)
    rd = tl.arange(0, D)
    rl = tl.arange(0, BL)
    rg = tl.arange(0, 16)
    dt = q_ptr.dtype.element_ty
    offs = bh.to(tl.int64) * L * D + rl[:, None] * D + rd[None, :]
    in_cache = (rl < L)[:, None]
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # fp8 codes (`llama_cache`, scale 1) read back as q's dtype; the model's dtype as it is
    k = tl.load(k_ptr + offs, mask=in_cache, other=0.0).to(dt)
    v = tl.load(v_ptr + offs, mask=in_cache, other=0.0).to(dt)
    if PDL:
        tl.extra.cuda.gdc_wait()  # q and K, V at pos: the previous kernel's writes
    pos = tl.load(pos_ptr + (bh // NKV) * POS_STRIDE)
    row = bh.to(tl.int64) * L * D + pos * D + rd  # the new position: its K and V read again, after the wait
    kn = tl.load(k_ptr + row, mask=rd < D * (pos < L), other=0.0).to(dt)
    vn = tl.load(v_ptr + row, mask=rd < D * (pos < L), other=0.0).to(dt)
    q = tl.load(q_ptr + bh * G * D + rg[:, None] * D + rd[None, :], mask=(rg < G)[:, None], other=0.0)
    if DOT_F32:  # the interpreter (its bf16 dot is wrong): the same products in fp32
        q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
    # the tiles as loaded feed the dots; the new position's column of scores and row of V are put in apart
    s = tl.dot(q, tl.trans(k))
    s = tl.where((rl == pos)[None, :], tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1)[:, None], s)
    s = tl.where((rl <= pos)[None, :] & (rl < L)[None, :], s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None]).to(v.dtype)
    v = tl.where((rl < pos)[:, None], v, 0.0)  # later positions, whatever they hold (NaN too), count nothing
    p_new = tl.sum(tl.where((rl == pos)[None, :], p.to(tl.float32), 0.0), 1)
    acc = tl.dot(p, v) + p_new[:, None] * vn.to(tl.float32)[None, :]
    l_i = tl.sum(p.to(tl.float32), 1)
    tl.store(
        out_ptr + bh * G * D + rg[:, None] * D + rd[None, :],
        (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
        mask=(rg < G)[:, None],
    )


def attend_ahead(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The one pass with the cache loaded ahead: q ``(b, kv_heads, group, d)`` contiguous; the caller checks shapes."""
    b, nkv, g, d = q.shape
    length = k.shape[2]
    out = torch.empty_like(q)
    launcher(ahead_kernel, q.device)[(b * nkv,)](
        q, k, v, out, pos, length, 1.0 / math.sqrt(d), nkv, int(pos.numel() > 1),
        G=g, D=d, BL=block(length), DOT_F32=q.device.type == "cpu", num_warps=AHEAD_WARPS, num_stages=1,
    )  # fmt: skip
    return out
