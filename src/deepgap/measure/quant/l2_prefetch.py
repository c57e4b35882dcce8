"""The decode GEMVs' weight bands prefetched into L2 while the kernel waits for its predecessor (Hopper).

Why: at batch 1 a Llama-3.1-8B fp8 step reads 7.5 GB of weights in ~190 kernels. With programmatic dependent
launch (PDL) each kernel starts while its predecessor runs and waits (``griddepcontrol.wait``) before it reads
an activation; the weights do not depend on the predecessor, so `gemv_fused.fused_row_kernel` already loads
its first K step before the wait. The rest of the band waits. Between the GEMVs HBM idles: during the
attention and its merge (a few µs a layer, reading < 1 MB of K/V), and at each kernel's ramp up and down. On
one H200 the GEMVs reached 0.90× of a plain read of the same matrices, whose small ones (17-25 MB) read at
only 3.0-3.3 TB/s against 4.68 at 2 GB (results/h200/session21), and the step took 2.573 ms against the
weights' 1.76 ms plain read (session 23).

``DEEPGAP_DECODE_PREFETCH=l2`` (``off`` by default: measured slower, below): each program of a fused row GEMV that is
among its kernel's first ``CAP_BYTES`` of weights issues one ``cp.async.bulk.prefetch.L2`` for its whole band
(both bands of a SwiGLU or RoPE pair) before the wait. Programs resident while the predecessor runs (the o
projection's 512 during the attention) pull their bands into L2 then; the loads after the wait hit L2. The
cap keeps a kernel's early prefetches (gate_up's band is 117 MB) from evicting each other in the 50 MB L2.
The prefetch is a hint: no value changes, so the logits are bit-equal with it and without (the GPU test).

Measured on one H200 (session 23, bare loop replaying deepgap's step at batch 1, split KV, PDL on): 2.5269 ms
a step without it, 2.7231 with it (395.7 → 367.2 tokens/s). The early prefetches compete with the running
GEMV's reads for HBM instead of filling idle time, and a band fetched early and evicted is read twice.

Only under PDL (the wait is what the prefetch overlaps) and on compute capability 9.0 or later (the bulk
prefetch is sm_90's); the interpreter never sees it.

``DEEPGAP_DECODE_PREFETCH=attention`` (session 40; off by default: measured slower) aims at the one gap where
HBM has nothing else to do: the attention and its combine (~6.3 µs a layer on one H200, reading < 1 MB of K
and V) sit between qkv and o. The attention kernel's programs, once qkv has finished (after PDL's wait, so
nothing competes), ask L2 for the o projection's whole weight (16.8 MB at the 8B shape, a third of the L2),
each program its share (`spread`), so that o's GEMV, two kernels later, reads its weights from L2.
`llm_fused` passes o's codes to the attention op (`llm_attention.decode_attention`'s ``ahead``) where this
mode is set; the GEMVs' own prefetch stays off.

Measured on one H200 (session 40, results/h200/session40, bare loop, 8B fp8, batch 1, PDL, one process):
2.4244 ms a step without it, 2.5585 with it (412.5 → 390.9 tokens/s). On the step's critical path the attention
kernel grew from 4.65 to 9.54 µs a layer (its own K and V reads queue behind 16.8 MB of prefetches, about
3.5 µs of HBM at full rate: the attention now waits for them instead of HBM waiting for it), and o
shrank only from 8.21 to 7.65 µs: with its weights in L2, o is bound by its launch, its waits and its second
wave of programs, not by HBM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.core import switches

MODES = switches.choices("DEEPGAP_DECODE_PREFETCH")  # off, l2
CAP_BYTES = 24 << 20  # a kernel's prefetched bytes at most: about half an H200's (or H100's) 50 MB L2


def mode() -> str:
    """``DEEPGAP_DECODE_PREFETCH`` (`MODES`, ``off`` when unset); another value is a usage error."""
    return switches.read("DEEPGAP_DECODE_PREFETCH")


def bulk(device: torch.device) -> bool:
    """Whether ``device`` runs the bulk prefetch: a CUDA GPU of compute capability 9.0 or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def programs(device: torch.device, pdl: bool, band_bytes: int, grid: int) -> int:
    """How many leading programs of a ``grid`` prefetch their ``band_bytes``: 0 where it does not apply."""
    if not pdl or mode() != "l2" or not bulk(device):
        return 0
    return min(grid, CAP_BYTES // max(1, band_bytes))


def share(nbytes: int, programs: int) -> int:
    """Each of ``programs``' bytes of an ``nbytes`` region (`spread`): a multiple of 16, together covering it."""
    return -(-nbytes // (16 * programs)) * 16


def describe() -> str:
    """The decode row's note of it (before its tiles, `gemv.chosen`): empty when off."""
    return {
        "l2": f"L2 prefetch of the first {CAP_BYTES >> 20} MB of each GEMV's weights under PDL; ",
        "attention": "o's weights asked of L2 during the attention; ",
    }.get(mode(), "")


@triton.jit
def prefetch(ptr, nbytes):
    """One ``cp.async.bulk.prefetch.L2`` of ``nbytes`` (a multiple of 16) from ``ptr`` (16-byte aligned).

    Issued by the program's first thread only (a predicate on ``%tid.x``): one request per band, not one per
    thread. The asm returns a dummy so that Triton keeps it (``is_pure=False``).
    """
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def spread(ptr, nbytes, share, i, PIECE: tl.constexpr):  # noqa: N803 - Triton's capitals
    """Program ``i``'s `share` of the ``nbytes`` from ``ptr`` (bytes, 16-aligned), asked in ``PIECE``-byte parts."""
    lo = i * share
    hi = tl.minimum(lo + share, nbytes)
    for at in range(lo, hi, PIECE):
        prefetch(ptr + at, tl.minimum(hi - at, PIECE))


@triton.jit
def band(w_ptr, first, K, second, BN: tl.constexpr, PAIRED: tl.constexpr):  # noqa: N803 - Triton's capitals
    """`prefetch` of a weight band: BN whole rows of K codes from row ``first``, and its pair's (``PAIRED``).

    The pair lies ``second`` rows further (SwiGLU's up rows, RoPE's other half of the head). Shared by
    `gemv_fused.fused_row_kernel` (its first band under PDL) and `deepgap.measure.llm_whole` (its L2 lead).
    """
    prefetch(w_ptr + first * K, BN * K)
    if PAIRED:
        prefetch(w_ptr + (first + second) * K, BN * K)
