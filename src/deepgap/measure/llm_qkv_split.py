"""Batch-1 decode attention, split over the cache, in programs appended to the qkv GEMV's launch (issue 51).

Why: at batch 1 a layer's attention is two kernels (the split attention and its combine) between the qkv GEMV
and the o projection, reading < 1 MB. Each kernel boundary under programmatic dependent launch (PDL) costs the
wait for the whole previous grid to finish and flush, so the attention's place on the step's critical path is
three boundaries and three short dependent chains of loads. `deepgap.measure.llm_qkv_attention` moved the
attention into the qkv GEMV's last programs, but as one program per KV head walking the whole cache, and lost
(session 24: 380.6 against 392.0 tokens/s). Here the split stays: the launch is the GEMV's programs, then one
program per (KV head, chunk) of the cache, as `llm_attention.plan` cuts it, and no kernel boundary is left
between the qkv projection and the o projection.

How (`rope_split_attend_kernel`):

- **The GEMV's programs** (the first ``NG``) run `gemv_fused.fused_row_kernel` with RoPE (q to a row, k and v
  into the cache; a band lies in one head, `llm_qkv_attention.within_heads`), then count themselves done in
  their KV head group's counter (release, after a block barrier).
- **An attention program** (group g, chunk c) asks L2 for its chunk's K and V rows written by earlier steps
  (positions below ``pos``, sm_90's bulk prefetch) before PDL's wait, then waits until group g's count is
  complete (`whole_flow.wait_count`: an acquire; a wait that outlasts its polls sets the error flag instead of
  hanging), walks its chunk (`llm_attention.attend_rows`, reading q, K and V past L1: this launch wrote the
  step's), and stores its partials (`llm_attention.store_partials`). The chunk that counts itself last in its
  group's second counter merges the group's rows in one round of loads (`merge_group`) and puts both counts
  back to 0.

Why it cannot deadlock: the attention programs are the launch's last, so every GEMV program they wait for was
dispatched before them and runs without waiting. Counters: `llm_attention.counters` (``2 · kv_heads + 1``: the
groups', the chunks', the error flag), made before any capture and 0 at rest; `flagged` reads the flag.

Measured on one H100 (session 38, bare loop, 8B fp8, batch 1, PDL): **2.0% slower**, 317.4 against 323.9 tokens/s,
so off by default. The launch took 21.1 µs a layer on the critical path against 18.8 for the GEMV, attention and
combine apart. A group's attention waits for its v head's programs, the GEMV's last, so it still starts after the
whole GEMV. The spin and the serial last-chunk merge then cost more than two kernel boundaries under PDL.

``DEEPGAP_DECODE_ATTENTION=qkv-split`` (`llm_attention.attention_mode`) sends
`deepgap.measure.llm_fused.FusedLayer`'s one-sequence steps at a device-side position here
(`rope_gemv_attend_split_op`); everything else keeps its path. On CPU tensors the kernel runs in Triton's
interpreter (programs in order: the GEMV's first, so no wait ever polls twice), as the tests do.
"""

# ruff: noqa: N803

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deepgap.measure import llm_attention
from deepgap.measure.llm_attention import attend_rows, store_partials
from deepgap.measure.llm_merge import merge_group
from deepgap.measure.llm_qkv_attention import TAIL_STAGES, attend_operands, kv_group, tuned, within_heads
from deepgap.measure.quant import gemv, l2_prefetch
from deepgap.measure.quant.gemv_fused import Fusion, fused_row_kernel, launch_row
from deepgap.measure.quant.gemv_fused_ops import rope_op
from deepgap.measure.quant.whole_flow import wait_count


@triton.jit
def rope_split_attend_kernel(
    x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps,
    NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    REDUCE: tl.constexpr = False, PDL: tl.constexpr = False,
    cos_ptr=None, sin_ptr=None, pos_ptr=None, k_ptr=None, v_ptr=None, L=1, NQ=0, NKV=0, ROPE: tl.constexpr = False,
    D: tl.constexpr = 2, PF_PROGRAMS=0, PREFETCH: tl.constexpr = False,
    cnt_ptr=None, part_ptr=None, m_ptr=None, l_ptr=None, attn_ptr=None, sm_scale=1.0, NG=1, CHUNK=64, NCH=1,
    G: tl.constexpr = 1, BL: tl.constexpr = 64, SP: tl.constexpr = 2,
    STAGES: tl.constexpr = 1, FENCE: tl.constexpr = False, KV_L2: tl.constexpr = False,
    DOT_F32: tl.constexpr = False,
):  # fmt: skip
    """The qkv GEMV with RoPE in programs ``0 .. NG−1``, then the split attention (module docstring).

    ``cnt``: ``NKV`` group counts, ``NKV`` chunk counts, the error flag; ``part``, ``m``, ``l``: the chunks'
    partials (`llm_attention.attend`'s scratch); ``attn``: the attention's rows ``(1, NQ · D)``.
    """
    half: tl.constexpr = D // 2
    pid = tl.program_id(0)
    if pid < NG:
        fused_row_kernel(
            x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps, NORM, SWIGLU, RESIDUAL, BN, BK,
            REDUCE, PDL, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, L, NQ, NKV, ROPE, D, PF_PROGRAMS, PREFETCH,
        )  # fmt: skip
        tl.debug_barrier()  # every thread's q, k and v stores issued before the count says so
        tl.atomic_add(cnt_ptr + kv_group(pid * BN // half, NQ, NKV, G), 1, sem="release", scope="gpu")
    else:
        g = (pid - NG) // NCH
        c = (pid - NG) % NCH
        pos = tl.load(pos_ptr)  # written before the step's first kernel: no wait needed
        lo = c * CHUNK
        hi = tl.minimum(tl.minimum(lo + CHUNK, L), pos + 1)  # never past the cache, whatever pos says
        if KV_L2:  # noqa: SIM102 - earlier steps' rows (below pos) into L2 while the GEMV runs
            if pos > lo:  # a constexpr, then a runtime test
                first = (g.to(tl.int64) * L + lo) * D
                n = ((tl.minimum(hi, pos) - lo) * D * 2).to(tl.int32)  # the bulk prefetch's size is 32-bit
                l2_prefetch.prefetch(k_ptr + first, n)
                l2_prefetch.prefetch(v_ptr + first, n)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        wait_count(cnt_ptr + g, (G + 2) * (half // BN), cnt_ptr + 2 * NKV, FENCE)
        m_i, l_i, acc = attend_rows(
            out_ptr, k_ptr, v_ptr, g, lo, hi, L, sm_scale, G, D, BL, DOT_F32, ".cg", STAGES
        )
        store_partials(part_ptr, m_ptr, l_ptr, g, c, lo, pos, m_i, l_i, acc, NCH, G, D)
        tl.debug_barrier()  # every thread's partials issued before the count says so
        if tl.atomic_add(cnt_ptr + NKV + g, 1, sem="acq_rel", scope="gpu") == NCH - 1:
            merge_group(part_ptr, m_ptr, l_ptr, attn_ptr, g, pos, CHUNK, NCH, G, D, SP)
            tl.atomic_xchg(cnt_ptr + g, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt_ptr + NKV + g, 0, sem="relaxed", scope="gpu")


def counters(nkv: int, device: torch.device) -> torch.Tensor:
    """The launch's counts and error flag (`llm_attention.counters` of ``2 · nkv + 1``), 0 at rest."""
    return llm_attention.counters(2 * nkv + 1, device)


def flagged(nkv: int, device: torch.device) -> bool:
    """Whether a wait of this launch gave up (the flag stays set): its attention rows are not to be trusted."""
    return bool(counters(nkv, device)[2 * nkv].item())


def rope_gemv_attend_split(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    fusion: Fusion,
    tile: gemv.GemvTile | None = None,
) -> torch.Tensor:
    """`llm_qkv_attention.rope_gemv_attend`'s operands and result: the attention's rows ``(1, heads · head_dim)``.

    The cache is split as `llm_attention.plan` splits it at batch 1 with ``on`` (one chunk where it is too short).
    """
    no, r = attend_operands(x, codes, scale, fusion)
    nkv, length, d = r.k.shape[1], r.k.shape[2], r.k.shape[3]
    counts = counters(nkv, x.device)  # before any tuning or capture (made once, kept at 0)
    t = tile or tuned(rope_gemv_attend_split, x, codes, scale, fusion, "split")
    t = within_heads(t.fit(x.shape[1], no), d)
    split = llm_attention.plan(1, nkv, length, llm_attention.device_sms(x.device), "on")
    part, m, l = llm_attention.workspace(r.heads * split.chunks, d, x.device)  # noqa: E741
    q = torch.empty((1, r.heads * d), dtype=torch.bfloat16, device=x.device)
    out = torch.empty_like(q)
    g, cpu = r.heads // nkv, x.device.type == "cpu"
    # the K/V bulk prefetch is sm_90's (a meta launch, `benchmarks/sm90_cases.py`, compiles for sm_90)
    hopper = not cpu and (x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) >= (9, 0))
    launch_row(
        rope_split_attend_kernel, x, codes, scale, fusion, t, q, more=nkv * split.chunks,
        cnt_ptr=counts, part_ptr=part, m_ptr=m, l_ptr=l, attn_ptr=out, sm_scale=1.0 / math.sqrt(d), NG=no // t.bn,
        CHUNK=split.chunk, NCH=split.chunks, G=g, BL=split.block,
        SP=max(2, triton.next_power_of_2(split.chunks)), STAGES=TAIL_STAGES, FENCE=not cpu,
        KV_L2=hopper, DOT_F32=cpu,
    )  # fmt: skip
    return out


rope_gemv_attend_split_op = rope_op(
    "rope_gemv_attend_split",
    rope_gemv_attend_split,
    "`rope_gemv_attend_split` as a custom op: the attention's rows returned, k and v written into the cache.",
)
