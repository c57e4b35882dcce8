"""One decode token's attention over the static KV cache, reading only the positions written so far.

Why a kernel of its own: the static decode step (the one torch.compile and CUDA graphs capture) has a
fixed cache of ``max_len`` positions and a device-side position, so through SDPA it attends over the
whole cache with a mask. That reads every position, written or not (at 128 in / 128 out, a quarter more
KV bytes than the context holds), and on one H200 cuDNN's kernel took 11 µs per layer at batch 1 for
256 positions (results/h200/session18: 0.36 of 3.25 ms per token). Here one program per (sequence, KV
head) loads the group's query rows once (GQA: the ``heads / kv_heads`` query heads of a group share K
and V, so they are rows of one tile), walks the cache in blocks up to the position read from the device,
and keeps the softmax online (flash attention's rescaling), so K and V are read once and only where
written.

`decode_attention` is torch's custom op ``deepgap::decode_attention``: torch.compile keeps it as one call
and a CUDA graph captures it. On CPU tensors it runs in Triton's interpreter
(`deepgap.measure.quant.launch`), as the tests do; `reference` is the same arithmetic in torch.
``DEEPGAP_DECODE_ATTENTION=sdpa`` in the environment sends the static step back to SDPA (for comparison).
"""

# ruff: noqa: N803

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.kernels import pdl_enter
from deepgap.measure.quant.launch import check, launcher

BLOCK = 64  # cache positions per step of the walk
ROWS = 16  # query rows per tile (a group's rows, padded: the tensor cores' smallest M)


def enabled(q: torch.Tensor) -> bool:
    """Whether the static step uses this kernel: CUDA half-precision tensors, unless the environment says sdpa."""
    if os.environ.get("DEEPGAP_DECODE_ATTENTION", "triton") == "sdpa":
        return False
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def plug(model) -> None:
    """Set ``model.static_attention``: this kernel where it runs (`enabled`), else None (SDPA)."""
    model.static_attention = decode_attention if enabled(model.embed_tokens.weight) else None


@triton.jit
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, L, scale, NKV, POS_STRIDE,
    G: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """``out[bh] = softmax(q[bh] · K[bh, :pos+1]ᵀ · scale) · V[bh, :pos+1]`` for one (sequence, KV head).

    ``pos`` is one position for every sequence (``POS_STRIDE`` 0) or the sequence's own (1: continuous batching).
    """
    pdl_enter(PDL)  # launched inside `launch.pdl`: q, K and V are the previous kernels' writes
    bh = tl.program_id(0)
    rg = tl.arange(0, 16)
    rd = tl.arange(0, D)
    rl = tl.arange(0, BL)
    g_ok = rg < G
    q = tl.load(q_ptr + bh * G * D + rg[:, None] * D + rd[None, :], mask=g_ok[:, None], other=0.0)
    if DOT_F32:  # the interpreter (its bf16 dot is wrong): the same products in fp32
        q = q.to(tl.float32)
    pos = tl.load(pos_ptr + (bh // NKV) * POS_STRIDE)
    m_i = tl.full((16,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((16,), dtype=tl.float32)
    acc = tl.zeros((16, D), dtype=tl.float32)
    base = bh.to(tl.int64) * L * D
    for start in range(0, pos + 1, BL):
        cols = start + rl
        c_ok = cols <= pos
        offs = base + cols[:, None] * D + rd[None, :]
        k = tl.load(k_ptr + offs, mask=c_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs, mask=c_ok[:, None], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(c_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + bh * G * D + rg[:, None] * D + rd[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_ok[:, None],
    )


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    b, nq, s, d = q.shape
    _, nkv, length, _ = k.shape
    check(
        s == 1 and nq % nkv == 0 and nq // nkv <= ROWS, f"one token, at most {ROWS} query heads per KV head"
    )
    check(k.shape == v.shape and k.is_contiguous() and v.is_contiguous(), "K and V: the contiguous cache")
    check(d in (16, 32, 64, 128, 256), f"head_dim {d} (a power of two from 16 to 256)")
    check(pos.numel() in (1, b) and pos.is_contiguous(), f"pos: one position, or one per sequence ({b})")
    q = q.reshape(b, nkv, nq // nkv, d).contiguous()
    out = torch.empty_like(q)
    launcher(decode_attention_kernel, q.device)[(b * nkv,)](
        q, k, v, out, pos, length, 1.0 / math.sqrt(d), nkv, int(pos.numel() > 1),
        G=nq // nkv, D=d, BL=BLOCK, DOT_F32=q.device.type == "cpu", num_warps=4, num_stages=2,
    )  # fmt: skip
    return out.reshape(b, nq, 1, d)


@torch.library.custom_op("deepgap::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One token's attention: q ``(b, heads, 1, d)``, K and V ``(b, kv_heads, max_len, d)``, pos (1,) or (b,)."""
    return _launch(q, k, v, pos)


@decode_attention.register_fake
def _(q, k, v, pos):
    return torch.empty_like(q)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
    """The same attention in fp32 torch over positions ``0..pos``: what the kernel is held to."""
    b, nq, _, d = q.shape
    nkv = k.shape[1]
    qg = q.float().reshape(b, nkv, nq // nkv, d)
    keys, values = k[:, :, : pos + 1].float(), v[:, :, : pos + 1].float()
    w = torch.softmax(qg @ keys.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return (w @ values).reshape(b, nq, 1, d).to(q.dtype)
