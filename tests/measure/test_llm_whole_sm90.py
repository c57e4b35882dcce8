"""The one-kernel decode step's sm_90 code (`llm_whole.whole_decode_kernel`), compiled here with no GPU.

What the interpreter cannot show: the L2 lead (`Tiles.lead_kb`) is bulk prefetches asked by one thread a
program, none without it; and the 8B shape's default tiles fit 16 warps an SM's registers with no spill.
"""

from __future__ import annotations

import functools

import pytest

triton = pytest.importorskip("triton")

from sm90 import compile_sm90, ptxas_usage  # noqa: E402

from deepgap.measure import llm_whole  # noqa: E402

POINTERS = {
    "x_ptr": "*bf16", "h_ptr": "*bf16", "table_ptr": "*i64", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
    "pos_ptr": "*i64", "q_ptr": "*bf16", "a_ptr": "*bf16", "mid_ptr": "*bf16", "ws_ptr": "*fp32",
    "cnt_ptr": "*i32", "bar_ptr": "*i32", "times_ptr": "*i64",
}  # fmt: skip
SIZES = ("LAYERS", "H", "F", "NQ", "NKV", "L", "CHUNK", "NCH")


@functools.cache  # a compile is seconds on two cores: each test's is shared
def _compiled(lead_kb: int):
    """The kernel at the 8B shape (fp8, 16 warps, PDL, the one-thread barrier) with ``lead_kb`` of L2 lead."""
    sig = POINTERS | dict.fromkeys(SIZES, "i32") | {"eps": "fp32", "scale": "fp32"}
    const = dict(
        D=128, GQ=4, INT8=False, BN_QKV=4, BK_QKV=4096, BN_O=4, BK_O=4096, BN_GU=4, BK_GU=4096, BN_DN=4,
        BK_DN=2048, AHEAD=False, ONE=7, BL=64, SP=16, BARRIER=1, FENCE=True, LEAD_KB=lead_kb, DOT_F32=False,
        PDL=True, TIMES=False,
    )  # fmt: skip
    aligned = (
        *POINTERS,
        "LAYERS",
        "H",
        "F",
        "NQ",
        "L",
        "CHUNK",
        "NCH",
    )  # as the launch finds them (8B, 2048 positions)
    return compile_sm90(llm_whole.whole_decode_kernel, sig, const, aligned, num_warps=16)


def test_the_l2_lead_is_bulk_prefetches_from_one_thread_and_none_without_it():
    ptx = _compiled(64).asm["ptx"]
    asked = ptx.count("cp.async.bulk.prefetch.L2.global")
    # the lead-ins (layer 0's qkv, o before the attention, gate_up, down, the next layer's qkv) and each
    # GEMV phase's band-by-band ask: a pair's (qkv's, gate_up's) two bands are two
    assert asked >= 9
    assert ptx.count("setp.eq.u32 p, t, 0; @p cp.async.bulk.prefetch") == asked  # one thread a program asks
    assert "cp.async.bulk.prefetch" not in _compiled(0).asm["ptx"]


@pytest.mark.parametrize("lead_kb", [0, 64])
def test_sixteen_warps_fit_the_registers_over_a_runtime_layer_count(lead_kb):
    """128 registers a thread (16 warps: all an SM has), and a few values saved once a phase, not hundreds.

    Why: the layer loop's count is a runtime value (32 at 8B), and with Triton hoisting each phase's invariant
    offsets out of it the kernel spilled 348-404 B a thread (session 36); the loop's ``disable_licm`` keeps them
    inside, 16-24 B. (Compiled with one layer, the loop is gone and nothing spills: what session 35 saw.)
    """
    usage = ptxas_usage(_compiled(lead_kb))
    assert usage["registers"] <= 128 and usage["spill_stores"] <= 64
