"""RoPE's epilogue of the batch-1 qkv GEMV (`gemv_fused`, ``rope``): q rotated out, k and v into the static cache.

Why apart from `gemv_fused`: the cache's rows are written here as the cache holds them, bf16 or fp8 codes
(`deepgap.measure.models.llama_cache`), and the codes need a rounding of their own in Triton's interpreter
(`e4m3_rne`).
"""

# ruff: noqa: N803

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.launch import check


@dataclasses.dataclass(frozen=True)
class RopeWrite:
    """RoPE's epilogue (`rope_store`): the step's angles and device position, the layer's K/V cache.

    ``cos``, ``sin``: ``head_dim`` values each at the step's position; ``pos``: ``(1,)`` int64 on the device;
    ``k``, ``v``: the contiguous cache ``(1, kv_heads, max_len, head_dim)``; ``heads``: the query heads.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    pos: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int


@triton.jit
def rope_store(
    y, y2, rn, out_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, L, NQ, NKV, D: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """RoPE's epilogue: rotate a q or k head's channel pair (c, c + D/2); q to ``out``, k and v into the cache.

    HF's half-split rotation ``x·cos + rotate_half(x)·sin`` on the pair: ``(y·cos − y₂·sin, y₂·cos + y·sin)``
    with the step's angles (``cos_ptr``, ``sin_ptr``: D each). The cache is ``(1, NKV, L, D)``; the row
    written is at the position read from the device (``pos_ptr``), after the wait for the previous kernel.
    k and v are stored as the cache holds them: bf16, or fp8 codes of the bf16 values (`llama_cache`); ``RNE``
    (Triton's interpreter) rounds them to e4m3 in fp32 first (`e4m3_rne`). The loads come here, after the K
    loop; `rope_angles` and `rope_q` then `rope_kv` are the same steps for a caller that loads them earlier.
    """
    cos, cos2, sin, sin2 = rope_angles(rn, cos_ptr, sin_ptr, D)
    r, r2 = rope_q(y, y2, rn, cos, cos2, sin, sin2, out_ptr, NQ, NKV, D)
    rope_kv(r, r2, rn, tl.load(pos_ptr), k_ptr, v_ptr, L, NQ, NKV, D, RNE)


@triton.jit
def rope_angles(rn, cos_ptr, sin_ptr, D: tl.constexpr):
    """The angles of channel pair ``rn``'s two halves, in fp32: cos, cos₂, sin, sin₂ (`rope_store`)."""
    half: tl.constexpr = D // 2
    c = rn % half
    cos, cos2 = tl.load(cos_ptr + c).to(tl.float32), tl.load(cos_ptr + half + c).to(tl.float32)
    sin, sin2 = tl.load(sin_ptr + c).to(tl.float32), tl.load(sin_ptr + half + c).to(tl.float32)
    return cos, cos2, sin, sin2


@triton.jit
def rope_q(y, y2, rn, cos, cos2, sin, sin2, out_ptr, NQ, NKV, D: tl.constexpr):
    """The pair rotated (q and k heads; v's as they are) in bf16, q's stored to ``out`` (`rope_store`)."""
    half: tl.constexpr = D // 2
    head = rn // half
    c = rn % half
    rotated = head < NQ + NKV  # q and k heads; v's are written as they are
    r = tl.where(rotated, y * cos - y2 * sin, y).to(tl.bfloat16)
    r2 = tl.where(rotated, y2 * cos2 + y * sin2, y2).to(tl.bfloat16)
    is_q = head < NQ
    tl.store(out_ptr + head * D + c, r, mask=is_q)
    tl.store(out_ptr + head * D + half + c, r2, mask=is_q)
    return r, r2


@triton.jit
def rope_kv(r, r2, rn, pos, k_ptr, v_ptr, L, NQ, NKV, D: tl.constexpr, RNE: tl.constexpr):
    """The rotated k pair and the v pair into the cache row at position ``pos`` (`rope_store`)."""
    half: tl.constexpr = D // 2
    head = rn // half
    c = rn % half
    is_k = (head < NQ + NKV) & (head >= NQ)
    kv_head = tl.where(is_k, head - NQ, head - NQ - NKV)
    row = (kv_head.to(tl.int64) * L + pos) * D + c
    is_v = head >= NQ + NKV
    if k_ptr.dtype.element_ty != tl.bfloat16:  # fp8 codes at scale 1, saturating (`llama_cache.encode`)
        r, r2 = tl.clamp(r.to(tl.float32), -448.0, 448.0), tl.clamp(r2.to(tl.float32), -448.0, 448.0)
        if RNE:
            r, r2 = e4m3_rne(r), e4m3_rne(r2)
        r, r2 = r.to(k_ptr.dtype.element_ty), r2.to(k_ptr.dtype.element_ty)
    tl.store(k_ptr + row, r, mask=is_k)
    tl.store(k_ptr + row + half, r2, mask=is_k)
    tl.store(v_ptr + row, r, mask=is_v)
    tl.store(v_ptr + row + half, r2, mask=is_v)


@triton.jit
def e4m3_rne(a):
    """fp32 values within ±448 rounded to their nearest e4m3 value, ties to even, still fp32.

    Why: Triton's interpreter casts fp32 to e4m3 wrongly where rounding carries into the exponent (124.5 gives
    64, 31 gives 16) and rounds ties away from zero; a GPU's ``cvt.rn.satfinite`` is right. Cast after this,
    an interpreter run stores the codes a GPU stores. Subnormals share 2⁻⁶'s step (2⁻⁹).
    """
    m = tl.abs(a)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(m, 2.0**-10))), -6.0)
    step = tl.exp2(e - 3.0)  # 3 mantissa bits: 8 steps an octave
    q = m / step  # exact: a power of two
    r = tl.floor(q)
    up = (q - r > 0.5) | ((q - r == 0.5) & (r % 2 == 1))
    m = tl.where(up, r + 1.0, r) * step
    return tl.where(a < 0, -m, m)


def check_rope(r: RopeWrite, n: int) -> None:
    """RoPE's operands: a cache of one sequence, heads that fill N, the angles and position of one step."""
    check(r.k.dim() == 4 and r.k.shape[0] == 1, "the K/V cache: (1, kv_heads, max_len, head_dim)")
    _, nkv, _, d = r.k.shape
    same = r.v.shape == r.k.shape and r.k.dtype == r.v.dtype in (torch.bfloat16, torch.float8_e4m3fn)
    check(same and r.k.is_contiguous() and r.v.is_contiguous(), "K and V: the contiguous bf16 or fp8 cache")
    check(n == (r.heads + 2 * nkv) * d and d % 2 == 0, f"N={n}: (heads + 2 · kv_heads) · head_dim")
    check(r.cos.numel() == d == r.sin.numel(), f"cos, sin: {d} values, the step's angles")
    check(r.cos.is_contiguous() and r.sin.is_contiguous(), "cos, sin: contiguous")
    check(r.pos.numel() == 1 and r.pos.dtype == torch.int64, "pos: one int64 position on the device")
