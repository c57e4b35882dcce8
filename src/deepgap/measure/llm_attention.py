"""One decode token's attention over the static KV cache, reading only the positions written so far.

Why a kernel of its own: the static decode step (the one CUDA graphs capture) has a fixed cache of ``max_len``
positions and a device-side position, so SDPA attends over the whole cache with a mask, reading every position
(at 128 in / 128 out a quarter more KV bytes than the context holds; cuDNN's kernel took 11 µs a layer at
batch 1 for 256 positions on one H200, results/h200/session18). Here one program per (sequence, KV head) loads
the group's query rows once (GQA: a group's ``heads / kv_heads`` query heads share K and V, so they are rows of
one tile), walks the cache in blocks up to the position read from the device, and keeps the softmax online
(flash attention's rescaling): K and V read once and only where written.

`decode_attention` is torch's custom op ``deepgap::decode_attention`` (torch.compile keeps it one call, a CUDA
graph captures it); on CPU tensors it runs in Triton's interpreter, as the tests do; `reference` is the same
arithmetic in torch. ``DEEPGAP_DECODE_ATTENTION`` (`attention_mode`): ``triton`` (this kernel, the default) or
``sdpa`` (SDPA, for comparison).

Split KV (flash decoding, ``DEEPGAP_DECODE_SPLIT_KV=auto|on|off``, ``auto`` by default since session 22): at
batch 1 of Llama-3.1-8B the one pass is 8 programs on 132 SMs. Split, program (sequence, KV head, chunk)
walks one chunk of the cache and writes its softmax's partials (max, sum, unnormalised output) to an fp32
scratch; `combine_kernel` merges them per query row. The chunks are fixed over the cache's length (`plan`,
from shapes only), so a CUDA graph captured once replays at every device-side position: chunks past it
write nothing and are not read.

``wide`` (session 55): one pass whose walk is bound by the cache's length, not the position, in blocks of up to
`WIDE_BLOCK` positions, for caches of at most `WIDE_MAX`. Why: the split's chain is two kernels a layer, each
paying its launch and PDL wait, and each split program's loads wait for the position's load (the walk's bound).
Here the first block's K and V loads leave with the position's and q's, one round trip, and no combine kernel.
Positions past ``pos`` are loaded and masked (scores to −inf, V to 0, so what lies there is never used).
Longer caches take ``auto``'s plan.
"""

# ruff: noqa: N803

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepgap.core import switches
from deepgap.measure.llm_merge import combine_kernel, merge_group
from deepgap.measure.models.llama_cache import FP8_CODES
from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.launch import check, launcher

BLOCK = 64  # cache positions per step of the walk
ROWS = 16  # query rows per tile (a group's rows, padded: the tensor cores' smallest M)
SPLIT_MODES = switches.choices("DEEPGAP_DECODE_SPLIT_KV")  # auto, on, off
ATTENTION_MODES = switches.choices("DEEPGAP_DECODE_ATTENTION")  # triton, sdpa
COMBINE_MODES = switches.choices(
    "DEEPGAP_DECODE_COMBINE"
)  # kernel, last-block: how a split's chunks are merged
MIN_CHUNK = 32  # the fewest cache positions a split program walks
CPU_SMS = 132  # on the CPU (the interpreter) the split is planned as for an H200's SMs
WIDE_BLOCK = 128  # ``wide``: the most positions a step of the walk loads (73 KB of shared memory at sm_90)
WIDE_MAX = 512  # ``wide``: the longest cache walked in one pass; a longer one takes ``auto``'s plan


def attention_mode() -> str:
    """``DEEPGAP_DECODE_ATTENTION`` (`ATTENTION_MODES`, ``triton`` when unset; the module docstring says each).

    Another value is a usage error.
    """
    return switches.read("DEEPGAP_DECODE_ATTENTION")


def enabled(q: torch.Tensor) -> bool:
    """Whether the static step uses this kernel: CUDA half-precision tensors, unless the environment says sdpa."""
    if attention_mode() == "sdpa":
        return False
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def plug(model) -> None:
    """Set ``model.static_attention``: this kernel where it runs (`enabled`), else None (SDPA)."""
    model.static_attention = decode_attention if enabled(model.embed_tokens.weight) else None


@dataclass(frozen=True)
class Split:
    """How the cache is cut: ``chunks`` programs per (sequence, KV head), each over ``chunk`` positions.

    Without ``combine``, the one-pass kernel; with it, `combine_kernel` merges the chunks' partials. The cut is
    over the cache's length, never ``pos`` (on the device: a graph replays at every position).
    """

    chunks: int
    chunk: int  # positions per chunk: a multiple of block
    block: int  # positions per step of a program's walk
    combine: bool = True  # partials to scratch, then the combine kernel (False: one pass)
    wide: bool = False  # one pass bound by the cache's length, not the position (the module says why)


def chunked(length: int, chunks: int) -> Split:
    """``length`` positions in at most ``chunks`` chunks of a multiple of 16, walked in blocks of 64, 32 or 16."""
    chunk = -(-length // (16 * chunks)) * 16  # ⌈length / chunks⌉ rounded up to 16
    block = next(n for n in (BLOCK, 32, 16) if chunk % n == 0)
    return Split(-(-length // chunk), chunk, block)


def split_mode() -> str:
    """``DEEPGAP_DECODE_SPLIT_KV`` (``auto`` by default: +2–4% decode tokens/s at batch 1 on one H200, session 22)."""
    return switches.read("DEEPGAP_DECODE_SPLIT_KV")


def combine_mode() -> str:
    """``DEEPGAP_DECODE_COMBINE``: the split's merge in `combine_kernel` (the default) or ``last-block``.

    ``last-block``: the attention kernel's last program of each (sequence, KV head) merges, one launch a layer
    fewer; slower on one H200 (session 25: 362.3 against 393.7 tokens/s, the counters and serial merge), so off.
    """
    return switches.read("DEEPGAP_DECODE_COMBINE")


def plan(b: int, nkv: int, length: int, sms: int, mode: str) -> Split:
    """One pass, or the cache split so that b × kv_heads × chunks fills at most one wave of ``sms`` SMs.

    Why: one program per (sequence, KV head) is 8 programs at batch 1 of Llama-3.1-8B on 132 SMs, each bound by
    latency. ``auto`` splits only where the one pass would fill less than half the SMs; ``on`` wherever a chunk
    keeps ``MIN_CHUNK`` positions; ``wide`` walks a cache of at most `WIDE_MAX` in one pass bound by its length
    (else as ``auto``). Shapes only: the same choice at every position.
    """
    if mode == "wide" and length <= WIDE_MAX:
        return Split(1, length, min(WIDE_BLOCK, triton.next_power_of_2(length)), combine=False, wide=True)
    mode = "auto" if mode == "wide" else mode
    programs = b * nkv
    if mode == "off" or (mode == "auto" and 2 * programs > sms) or length < 2 * MIN_CHUNK:
        return Split(1, length, BLOCK, combine=False)
    chunks = 2
    while programs * chunks * 2 <= sms and length // (chunks * 2) >= MIN_CHUNK:
        chunks *= 2
    return chunked(length, chunks)


def describe(model, batch: int, length: int) -> str:
    """What a static step of ``batch`` over a cache of ``length`` attends with, as its row says.

    "sdpa", "one pass (mode)" or "split C×P (mode)": C chunks of P positions (`plan` at the model's shape and
    device, the mode ``DEEPGAP_DECODE_SPLIT_KV``).
    """
    sms = device_sms(model.embed_tokens.weight.device)
    if model.static_attention is None:
        return "sdpa"
    mode = split_mode()
    s = plan(batch, model.shape.kv_heads, length, sms, mode)
    if s.wide:
        return f"one pass in blocks of {s.block}, bound by the cache ({mode})"
    if not s.combine:
        return f"one pass ({mode})"
    last = ", last-block merge" if combine_mode() == "last-block" else ""
    return f"split {s.chunks}×{s.chunk} ({mode}{last})"


@functools.cache
def device_sms(device: torch.device) -> int:
    """The SMs a plan fills: the GPU's, or on the CPU an H200's (`CPU_SMS`)."""
    if device.type != "cuda":
        return CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, l_ptr, pos_ptr, L, scale, NKV, POS_STRIDE, CHUNK, NCH,
    G: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, DOT_F32: tl.constexpr, SPLIT: tl.constexpr = False,
    PDL: tl.constexpr = False, cnt_ptr=None, fin_ptr=None, SP: tl.constexpr = 2, LAST: tl.constexpr = False,
    WIDE: tl.constexpr = False,
):  # fmt: skip
    """``out[bh] = softmax(q[bh] · K[bh, :pos+1]ᵀ · scale) · V[bh, :pos+1]`` for one (sequence, KV head).

    ``pos`` is one position for every sequence (``POS_STRIDE`` 0) or the sequence's own (1: continuous batching).
    With ``SPLIT``, program (bh, c) walks chunk c and writes its rows' partials for `combine_kernel`
    (`store_chunk`); with ``LAST`` too, the last of the NCH to count itself in ``cnt_ptr[bh]`` merges them.
    With ``WIDE`` the walk ends at the chunk's end, not at ``pos + 1``: its loads need not wait for pos's.
    """
    pdl_enter(PDL)  # launched inside `launch.pdl`: q, K and V are the previous kernels' writes
    bh = tl.program_id(0)
    c = tl.program_id(1)
    pos = tl.load(pos_ptr + (bh // NKV) * POS_STRIDE)
    lo = c * CHUNK
    end = tl.minimum(lo + CHUNK, L)  # never past the cache, whatever pos says
    hi = tl.minimum(end, pos + 1)
    m_i, l_i, acc = attend_rows(q_ptr, k_ptr, v_ptr, bh, lo, end if WIDE else hi, hi, L, scale, G, D, BL,
                                DOT_F32, WIDE)  # fmt: skip
    if SPLIT:
        store_chunk(out_ptr, m_ptr, l_ptr, cnt_ptr, fin_ptr, bh, c, lo, pos, m_i, l_i, acc, CHUNK, NCH, G, D, SP,
                    LAST)  # fmt: skip
    else:
        store_rows(out_ptr, bh, acc, l_i, G, D)


@triton.jit
def store_chunk(
    out_ptr, m_ptr, l_ptr, cnt_ptr, fin_ptr, bh, c, lo, pos, m_i, l_i, acc, CHUNK, NCH,
    G: tl.constexpr, D: tl.constexpr, SP: tl.constexpr, LAST: tl.constexpr,
):  # fmt: skip
    """Chunk ``c``'s partials (none past ``pos``); with ``LAST`` the group's last chunk merges."""
    store_partials(out_ptr, m_ptr, l_ptr, bh, c, lo, pos, m_i, l_i, acc, NCH, G, D)
    if LAST:
        tl.debug_barrier()  # every thread's partials issued before the count says so
        if tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel", scope="gpu") == NCH - 1:
            merge_group(out_ptr, m_ptr, l_ptr, fin_ptr, bh, pos, CHUNK, NCH, G, D, SP)
            tl.atomic_xchg(cnt_ptr + bh, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_partials(
    out_ptr, m_ptr, l_ptr, bh, c, lo, pos, m_i, l_i, acc, NCH, G: tl.constexpr, D: tl.constexpr
):
    """Chunk ``c`` of group ``bh``: its rows' running max, sum and unnormalised output, unless it starts past pos."""
    rg = tl.arange(0, 16)
    rd = tl.arange(0, D)
    row = (bh * G + rg) * NCH + c  # (sequence, query head, chunk)
    ok = (rg < G) & (lo <= pos)
    tl.store(m_ptr + row, m_i, mask=ok)
    tl.store(l_ptr + row, l_i, mask=ok)
    tl.store(out_ptr + row[:, None] * D + rd[None, :], acc, mask=ok[:, None])


@triton.jit
def attend_rows(
    q_ptr, k_ptr, v_ptr, bh, lo, end, hi, L, scale,
    G: tl.constexpr, D: tl.constexpr, BL: tl.constexpr, DOT_F32: tl.constexpr, MASK_V: tl.constexpr = False,
):  # fmt: skip
    """Group ``bh``'s G query rows (one tile of 16) over its cache positions ``lo .. hi−1``, softmax kept online.

    The walk covers ``lo .. end−1`` (``end`` ≥ ``hi``): positions from ``hi`` on are loaded and masked, their
    scores −inf and, with ``MASK_V``, their values 0 (whatever they hold; ``end`` = ``hi`` needs neither).

    Returns the rows' running max, sum and unnormalised output (fp32), for the one pass and the split alike
    (`decode_attention_kernel`).
    """
    rg = tl.arange(0, 16)
    rd = tl.arange(0, D)
    rl = tl.arange(0, BL)
    q_offs = bh * G * D + rg[:, None] * D + rd[None, :]
    q = tl.load(q_ptr + q_offs, mask=(rg < G)[:, None], other=0.0)
    if DOT_F32:  # the interpreter (its bf16 dot is wrong): the same products in fp32
        q = q.to(tl.float32)
    m_i = tl.full((16,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((16,), dtype=tl.float32)
    acc = tl.zeros((16, D), dtype=tl.float32)
    base = bh.to(tl.int64) * L * D
    for start in tl.range(lo, end, BL):
        cols = start + rl
        c_ok = cols < hi
        offs = base + cols[:, None] * D + rd[None, :]
        held = cols < end  # what is loaded: up to hi, or (MASK_V) the cache's chunk, whatever pos says
        # fp8 codes (`llama_cache`, scale 1) read back as q's dtype; the model's dtype as it is
        k = tl.load(k_ptr + offs, mask=held[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_ptr + offs, mask=held[:, None], other=0.0).to(q.dtype)
        if MASK_V:  # loaded past hi: a NaN there would survive p = 0 in the product
            v = tl.where(c_ok[:, None], v, 0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(c_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def store_rows(out_ptr, bh, acc, l_i, G: tl.constexpr, D: tl.constexpr):
    """The one pass's output: group ``bh``'s G rows normalised (``acc / l``), in ``out``'s dtype."""
    rg = tl.arange(0, 16)
    rd = tl.arange(0, D)
    tl.store(
        out_ptr + bh * G * D + rg[:, None] * D + rd[None, :],
        (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
        mask=(rg < G)[:, None],
    )


def workspace(rows: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split's fp32 partials (outputs ``rows × d``, maxima, sums): one allocation by the op, never zeroed."""
    s = torch.empty(rows * (d + 2), dtype=torch.float32, device=device)
    return s[: rows * d], s[rows * d : rows * (d + 1)], s[rows * (d + 1) :]


def check_head_dim(d: int) -> None:
    """A head_dim the attention's tile takes (the dot's and `attend_rows`' D): a power of two, 16 to 256."""
    check(d in (16, 32, 64, 128, 256), f"head_dim {d} (a power of two from 16 to 256)")


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor,
    split: Split,
    last: bool = False,
) -> torch.Tensor:
    """The kernel's attention with the cache cut as ``split`` says (`plan`; the tests name it).

    ``last``: a split's chunks merged by the attention kernel's last program per (sequence, KV head)
    (`combine_mode`), not by `combine_kernel`.
    """
    b, nq, s, d = q.shape
    _, nkv, length, _ = k.shape
    check(
        s == 1 and nq % nkv == 0 and nq // nkv <= ROWS, f"one token, at most {ROWS} query heads per KV head"
    )
    check(k.shape == v.shape and k.is_contiguous() and v.is_contiguous(), "K and V: the contiguous cache")
    check(k.dtype == v.dtype and k.dtype in (q.dtype, FP8_CODES), f"K and V: {q.dtype} or fp8 codes")
    check_head_dim(d)
    check(pos.numel() in (1, b) and pos.is_contiguous(), f"pos: one position, or one per sequence ({b})")
    check(split.chunks * split.chunk >= length, f"chunks of {split.chunk} cover {length} positions")
    q = q.reshape(b, nkv, nq // nkv, d).contiguous()
    out = torch.empty_like(q)
    g, stride, cpu = nq // nkv, int(pos.numel() > 1), q.device.type == "cpu"
    if not split.combine:
        block = split.block if split.wide else BLOCK
        warps = 8 if block >= 256 else 4  # 256 positions in four warps spill (ptxas at sm_90: 88 B)
        launcher(decode_attention_kernel, q.device)[(b * nkv, 1)](
            q, k, v, out, q, q, pos, length, 1.0 / math.sqrt(d), nkv, stride, length, 1,
            G=g, D=d, BL=block, DOT_F32=cpu, WIDE=split.wide, num_warps=warps, num_stages=2,
        )  # fmt: skip
        return out.reshape(b, nq, 1, d)
    rows = b * nq * split.chunks
    part, m, l = workspace(rows, d, q.device)  # noqa: E741
    sp = max(2, triton.next_power_of_2(split.chunks))
    extra = dict(cnt_ptr=counters(b * nkv, q.device), fin_ptr=out, SP=sp, LAST=True) if last else {}
    launcher(decode_attention_kernel, q.device)[(b * nkv, split.chunks)](
        q, k, v, part, m, l, pos, length, 1.0 / math.sqrt(d), nkv, stride, split.chunk, split.chunks,
        G=g, D=d, BL=split.block, DOT_F32=cpu, SPLIT=True, num_warps=4, num_stages=2, **extra,
    )  # fmt: skip
    if not last:
        launcher(combine_kernel, q.device)[(b * nq,)](
            part, m, l, out, pos, nq, stride, split.chunk, split.chunks, D=d, SP=sp, num_warps=4
        )  # fmt: skip
    return out.reshape(b, nq, 1, d)


_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def counters(n: int, device: torch.device) -> torch.Tensor:
    """``n`` int32 counts, 0 at rest, made once per (device, n) in warm-up, before any capture; users reset them.

    Why kept: a fresh zeroed buffer in a CUDA graph is a memset node a layer, the launch the merge saves.
    """
    key = (str(device), n)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _COUNTERS[key]


@torch.library.custom_op("deepgap::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One token's attention: q ``(b, heads, 1, d)``, K and V ``(b, kv_heads, max_len, d)``, pos (1,) or (b,).

    One pass, or split over the cache (`plan`, from the shapes and ``DEEPGAP_DECODE_SPLIT_KV``).
    """
    split = plan(q.shape[0], k.shape[1], k.shape[2], device_sms(q.device), split_mode())
    return attend(q, k, v, pos, split, last=combine_mode() == "last-block")


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
