"""Batch-1 attention split over the cache in programs appended to the qkv GEMV (`deepgap.measure.llm_qkv_split`).

On the CPU the kernel runs in Triton's interpreter: its rows against `llm_attention.reference` over the cache it
wrote (one chunk and several; G a power of two and not), its k and v rows against the plain RoPE GEMV's, the
counts and the error flag at 0 after every call; llama-tiny's graphed-path switch and the row's note; the
sm_90 code. The GPU tests hold it to the split path in CUDA graphs, with PDL and without.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_llm_qkv_attention import (
    _operands,
    graphed_against_triton,
    replay_against_split,
    static_steps_against_triton,
)

from deepgap.measure import llm_attention, llm_qkv_split
from deepgap.measure.llm_qkv_split import rope_gemv_attend_split
from deepgap.measure.quant.gemv import GemvTile
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv


def _at_rest() -> bool:
    # a meta launch's (benchmarks/sm90_cases.py, in the same process) holds no values
    return all(int(c.abs().sum()) == 0 for c in llm_attention._COUNTERS.values() if c.device.type != "meta")


@pytest.mark.parametrize(
    "nq,nkv,d,length,positions",
    [(4, 2, 16, 40, (0, 17, 39)), (4, 2, 16, 160, (0, 47, 48, 100, 159)), (6, 2, 32, 96, (0, 33, 95))],
    ids=["one-chunk", "four-chunks", "three-heads-a-group"],
)
def test_its_rows_are_the_reference_over_the_cache_it_wrote(nq, nkv, d, length, positions, monkeypatch):
    """k and v rows bit-equal to the plain RoPE GEMV's; the rows the reference's (NaN past pos, never read)."""
    monkeypatch.setattr(llm_attention, "_COUNTERS", {})
    x, codes, scale, gamma, angles, (k0, v0) = _operands(d, nq, nkv, 64, length)
    tile = GemvTile(8, 64, 1, 4, 3)
    chunks = llm_attention.plan(1, nkv, length, llm_attention.CPU_SMS, "on").chunks
    assert chunks == {40: 1, 160: 4, 96: 2}[length]  # the cases cover one chunk and several
    for pos in positions:
        at = torch.tensor([pos])
        k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
        k2[:, :, pos + 1 :], v2[:, :, pos + 1 :] = float("nan"), float("nan")
        q = fused_gemv(x, codes, scale, Fusion(gamma, 1e-5, rope=RopeWrite(*angles, at, k1, v1, nq)), tile)
        fusion = Fusion(gamma, 1e-5, rope=RopeWrite(*angles, at, k2, v2, nq))
        got = rope_gemv_attend_split(x, codes, scale, fusion, tile)
        for new, plain in ((k2, k1), (v2, v1)):
            assert torch.equal(new[:, :, : pos + 1], plain[:, :, : pos + 1])
        want = llm_attention.reference(q.view(1, nq, 1, d), k1, v1, pos).reshape(1, -1)
        assert got.shape == (1, nq * d) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"pos {pos}")
        assert _at_rest() and not llm_qkv_split.flagged(nkv, x.device)


def test_it_attends_only_where_the_gemv_does_rope():
    x, codes, scale, gamma, _, _ = _operands(16)
    with pytest.raises(ValueError, match="RoPE only"):
        rope_gemv_attend_split(x, codes, scale, Fusion(gamma, 1e-5))


def test_the_switch_names_it_and_the_row_says_so(monkeypatch):
    """``DEEPGAP_DECODE_ATTENTION=qkv-split``: a batch-1 row reads "in the qkv GEMV's last programs, split C×P"
    and `show` adds "attention in the qkv GEMV, split"; more than one sequence keeps the kernel's plan."""
    from deepgap.commands.decode_view import _engine

    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "qkv-split")
    monkeypatch.delenv("DEEPGAP_DECODE_SPLIT_KV", raising=False)
    assert llm_attention.attention_mode() == "qkv-split"
    layers = [SimpleNamespace(attends_in_qkv=True, attend="qkv-split")]
    model = SimpleNamespace(
        static_attention=llm_attention.decode_attention,
        shape=SimpleNamespace(kv_heads=8),
        embed_tokens=SimpleNamespace(weight=torch.zeros(1)),
        layers=layers,
    )
    note = llm_attention.describe(model, 1, 256)
    assert note == "in the qkv GEMV's last programs, split 8×32"
    row = {
        "engine": "quant",
        "decode_step": "cuda-graph",
        "decode_pdl": "on: forced",
        "decode_attention": note,
    }
    assert _engine(row) == "quant (cuda-graph step, PDL, attention in the qkv GEMV, split)"
    assert llm_attention.describe(model, 4, 256) == "split 4×64 (auto)"


def test_fused_layers_take_it_at_a_device_position(monkeypatch):
    """llama-tiny in fp8, static steps at positions 6 and 7: ``qkv-split`` gives today's logits (within 3%),
    every layer through its op; `llm_fused.configure` turns it off again."""
    from deepgap.measure import llm_fused

    models, calls = static_steps_against_triton(monkeypatch, "qkv-split", "rope_gemv_attend_split_op")
    assert all(m.attend == "qkv-split" and m.attends_in_qkv for m in models["qkv-split"].layers)
    assert len(calls) == 2 * models["triton"].shape.layers and _at_rest()
    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "triton")
    llm_fused.configure(models["qkv-split"])
    assert not any(m.attends_in_qkv for m in models["qkv-split"].layers)


@pytest.mark.parametrize("tile", [GemvTile(8, 512, 1, 4, 4), GemvTile(4, 4096, 1, 8, 1, 0, 1)], ids=str)
def test_it_compiles_for_hopper_without_spills(tile):
    """sm_90 at Llama-3.1-8B's heads (8 chunks of 32), PDL on: no spills; the counts release and acquire-release
    atomics at GPU scope, the resets relaxed; q, K and V read past L1; the K/V bulk prefetch before the wait."""
    from sm90 import compile_sm90, ptxas_spills

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", cos_ptr="*bf16", sin_ptr="*bf16", pos_ptr="*i64",
               k_ptr="*bf16", v_ptr="*bf16", L="i32", NQ="i32", NKV="i32", PF_PROGRAMS="i32", cnt_ptr="*i32",
               part_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32", attn_ptr="*bf16", sm_scale="fp32", NG="i32",
               CHUNK="i32", NCH="i32")  # fmt: skip
    const = dict(NORM=True, SWIGLU=False, RESIDUAL=False, BN=tile.bn, BK=tile.bk, REDUCE=bool(tile.reduce_each),
                 PDL=True, ROPE=True, D=128, PREFETCH=False, G=4, BL=32, SP=8, STAGES=1, FENCE=True,
                 KV_L2=True, DOT_F32=False)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "k_ptr", "v_ptr", "attn_ptr", "part_ptr")
    compiled = compile_sm90(
        llm_qkv_split.rope_split_attend_kernel, sig, const, aligned, num_warps=tile.num_warps, num_stages=1
    )
    ptx = compiled.asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "atom.global.gpu.relaxed.exch" in ptx
    assert "red.global.gpu.release.add" in ptx or "atom.global.gpu.release.add" in ptx
    assert "ld.global.cg" in ptx and "griddepcontrol.wait" in ptx and "cp.async.bulk.prefetch.L2" in ptx
    assert ptxas_spills(compiled) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_it_is_the_split_path_in_a_graph_at_every_position():
    """`replay_against_split` (8B's qkv over 256 positions, graphs with PDL and without); the flag never set."""
    replay_against_split(rope_gemv_attend_split)
    assert not llm_qkv_split.flagged(8, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pdl", ["off", "on"])
def test_on_the_gpu_the_graphed_step_gives_the_split_paths_logits(monkeypatch, pdl):
    """`graphed_against_triton` with ``qkv-split``: llama-tiny's graphed step, 4 steps, within 3% of the kernel's."""
    graphed_against_triton(monkeypatch, pdl, "qkv-split")
