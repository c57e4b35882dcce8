"""Batch-1 decode attention done by the qkv GEMV's last programs: two kernels a layer fewer (issue 51).

Why: on one H200 (session 23) a batch-1 Llama-3.1-8B fp8 step took 2.53-2.57 ms, ~75 µs a layer, of which
the four GEMVs were ~62 µs and the split attention and its combine kernel, with their launch ramps, ~13 µs
while reading < 1 MB of K and V. With RoPE in the qkv GEMV (`gemv_fused.RopeWrite`, the default) that GEMV
already writes q and the step's k and v row into the cache; here the last of its programs that write a KV
head group's rows (its ``heads / kv_heads`` q heads, its k head and its v head) attends for the group, so the
attention kernel and the combine kernel leave the step.

How: `rope_attend_kernel` runs `gemv_fused.fused_row_kernel` (RoPE's epilogue: a program's band lies in one
head, `within_heads`), then each program, after a block barrier, counts itself done in the group's counter
(an acquire-release atomic add, as `llm_attention`'s last-block merge counts chunks). The program that sees
the group's count reach its last walks the cache ``0..pos`` in one pass with the online softmax
(`llm_attention.attend_rows`, the one pass's arithmetic; q, K and V read past L1, ``.cg``: other programs of
this launch wrote them), writes the group's output rows (`llm_attention.store_rows`) and puts the count back to
0 for the next launch. The counters are `llm_attention.counters`, made before any tuning or capture.

``DEEPGAP_DECODE_ATTENTION=qkv`` (`llm_attention.attention_mode`; off by default: on one H200, session 24, the bare loop
replaying deepgap's batch-1 fp8 step ran 380.6 tokens/s with it against 392.0 with the split attention
kernel, one program per KV head walking the cache costing more than the two launches saved) sends
`deepgap.measure.llm_fused.FusedLayer`'s one-sequence steps at a device-side position here
(`rope_gemv_attend_op`); everything else keeps its path. On CPU tensors the kernel runs in Triton's
interpreter, as the tests do.
"""

# ruff: noqa: N803

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from deepgap.measure import llm_attention
from deepgap.measure.llm_attention import attend_rows, store_rows
from deepgap.measure.quant import gemv
from deepgap.measure.quant.gemv_fused import Fusion, checked, fused_row_kernel, launch_row
from deepgap.measure.quant.gemv_fused_ops import rope_op
from deepgap.measure.quant.launch import check, halved_to_divide

TAIL_BLOCK = 64  # cache positions per step of the last program's walk
TAIL_STAGES = 1  # its software pipeline: 1 keeps the GEMV's registers and shared memory (sm_90 compile)


@triton.jit
def rope_attend_kernel(
    x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps,
    NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    REDUCE: tl.constexpr = False, PDL: tl.constexpr = False,
    cos_ptr=None, sin_ptr=None, pos_ptr=None, k_ptr=None, v_ptr=None, L=1, NQ=0, NKV=0, ROPE: tl.constexpr = False,
    D: tl.constexpr = 2, PF_PROGRAMS=0, PREFETCH: tl.constexpr = False,
    cnt_ptr=None, attn_ptr=None, sm_scale=1.0, G: tl.constexpr = 1, BL: tl.constexpr = 64,
    STAGES: tl.constexpr = 1, DOT_F32: tl.constexpr = False,
):  # fmt: skip
    """`fused_row_kernel` with RoPE (q into ``out``, k and v into the cache), then its group's attention if last.

    Program ``i``'s band is one head's (``BN`` divides ``D/2``): a q head ``h`` counts for group ``h // G``,
    k head ``NQ + g`` and v head ``NQ + NKV + g`` for group ``g``; a group is ``(G + 2) · D/2 / BN`` programs.
    ``attn``: the attention's rows ``(1, NQ · D)``; ``cnt``: one int32 a group, 0 at rest.
    """
    fused_row_kernel(
        x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps, NORM, SWIGLU, RESIDUAL, BN, BK,
        REDUCE, PDL, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, L, NQ, NKV, ROPE, D, PF_PROGRAMS, PREFETCH,
    )  # fmt: skip
    half: tl.constexpr = D // 2
    head = tl.program_id(0) * BN // half
    group = kv_group(head, NQ, NKV, G)
    tl.debug_barrier()  # every thread's q, k and v stores issued before the count says so
    if tl.atomic_add(cnt_ptr + group, 1, sem="acq_rel", scope="gpu") == (G + 2) * (half // BN) - 1:
        hi = tl.minimum(tl.load(pos_ptr) + 1, L)  # never past the cache, whatever pos says
        _, l_i, acc = attend_rows(
            out_ptr, k_ptr, v_ptr, group, 0, hi, L, sm_scale, G, D, BL, DOT_F32, ".cg", STAGES
        )
        store_rows(attn_ptr, group, acc, l_i, G, D)
        tl.atomic_xchg(cnt_ptr + group, 0, sem="relaxed", scope="gpu")


@triton.jit
def kv_group(head, NQ, NKV, G: tl.constexpr):
    """The KV head group whose attention needs ``head``'s rows (the count it joins).

    q head ``h`` → ``h // G`` (HF's GQA); k and v heads (after the ``NQ`` q heads, ``NKV`` each) → their own.
    """
    return tl.where(head < NQ, head // G, tl.where(head < NQ + NKV, head - NQ, head - NQ - NKV))


def within_heads(t: gemv.GemvTile, d: int) -> gemv.GemvTile:
    """``t`` with BN halved until a program's band lies within one half of a head (``BN`` divides ``d/2``)."""
    return dataclasses.replace(t, bn=halved_to_divide(t.bn, d // 2, 1))


def rope_gemv_attend(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    fusion: Fusion,
    tile: gemv.GemvTile | None = None,
) -> torch.Tensor:
    """The qkv GEMV with the norm and RoPE (`fused_gemv`'s operands), k and v into the cache, then attention.

    Returns the attention's rows ``(1, heads · head_dim)`` bf16 over the cache ``0..pos`` (the step's own k
    and v included), where `gemv_fused.fused_gemv` returns q.
    """
    no, r = attend_operands(x, codes, scale, fusion)
    nkv, d = r.k.shape[1], r.k.shape[3]
    counts = llm_attention.counters(nkv, x.device)  # before any tuning or capture (made once, kept at 0)
    t = within_heads((tile or tuned(rope_gemv_attend, x, codes, scale, fusion, True)).fit(x.shape[1], no), d)
    q = torch.empty((1, r.heads * d), dtype=torch.bfloat16, device=x.device)
    out = torch.empty_like(q)
    launch_row(
        rope_attend_kernel, x, codes, scale, fusion, t, q, cnt_ptr=counts, attn_ptr=out, sm_scale=1.0 / math.sqrt(d),
        G=r.heads // nkv, BL=TAIL_BLOCK, STAGES=TAIL_STAGES, DOT_F32=x.device.type == "cpu",
    )  # fmt: skip
    return out


def attend_operands(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion):
    """`gemv_fused.checked`, and a RoPE-only fusion whose groups fit the attention's tile; (programs' width, rope)."""
    r = fusion.rope
    check(
        r is not None and not fusion.swiglu and fusion.residual is None and fusion.handed is None,
        "attention in the qkv GEMV: RoPE only (the norm folded, not handed over)",
    )
    no = checked(x, codes, scale, fusion)
    nkv, rows = r.k.shape[1], llm_attention.ROWS
    check(r.heads % nkv == 0 and r.heads // nkv <= rows, f"{r.heads} query heads: ≤ {rows} per KV head")
    llm_attention.check_head_dim(r.k.shape[3])
    return no, r


def tuned(
    run, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion, tag
) -> gemv.GemvTile:
    """The fastest of `Fusion.tiles` for ``run`` with its attention (`gemv.fastest`; keyed by ``tag``, not RoPE's)."""
    k, n, d = x.shape[1], codes.shape[0], fusion.rope.k.shape[3]
    return gemv.fastest(
        ("fused", (*fusion.key(), tag), k, n, str(x.device)),
        x.device,
        (within_heads(c.fit(k, n // 2), d) for c in fusion.tiles()),
        lambda t: run(x, codes, scale, fusion, t),
        decode=True,
    )


rope_gemv_attend_op = rope_op(
    "rope_gemv_attend",
    rope_gemv_attend,
    "`rope_gemv_attend` as a custom op: the attention's rows returned, k and v written into the cache.",
)
