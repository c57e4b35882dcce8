"""Batch-1 attention in the qkv GEMV's last programs (`deepgap.measure.llm_qkv_attention`, issue 51).

On the CPU the kernel runs in Triton's interpreter: its attention rows against `llm_attention.reference` over
the cache it wrote, its k and v rows against the plain RoPE GEMV's, the counters at 0 after every call; then
llama-tiny's fused layers with ``DEEPGAP_DECODE_ATTENTION=qkv`` against today's path, the switch, the row's
note and the sm_90 code. The GPU tests hold it to the split path in CUDA graphs, with PDL and without.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from deepgap.core.errors import UsageError
from deepgap.measure import llm_attention
from deepgap.measure.llm_qkv_attention import kv_group, rope_gemv_attend
from deepgap.measure.quant.gemv import GemvTile
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv
from deepgap.measure.quant.launch import interpreted

NQ, NKV, K, L = 4, 2, 64, 40  # llama-tiny's heads; a cache of 40 positions (one masked block of 64)


def _operands(d: int, nq=NQ, nkv=NKV, k=K, length=L, device="cpu"):
    g = torch.Generator(device=device).manual_seed(3)
    n = (nq + 2 * nkv) * d

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device)

    x = rand(1, k).bfloat16()
    codes = (rand(n, k) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g, device=device) + 0.5) / (40 * k**0.5)  # q, k and v ~ 1
    gamma = (torch.rand(k, generator=g, device=device) + 0.5).bfloat16()
    half = torch.rand(d // 2, generator=g, device=device) * 6  # HF's angles: a head's two halves share them
    cos, sin = (f(torch.cat([half, half])).bfloat16()[None] for f in (torch.cos, torch.sin))
    cache = (rand(1, nkv, length, d).bfloat16(), rand(1, nkv, length, d).bfloat16())
    return x, codes, scale, gamma, (cos, sin), cache


def _counts_at_rest() -> bool:
    # a meta launch's (benchmarks/sm90_cases.py, in the same process) holds no values
    return all(int(c.abs().sum()) == 0 for c in llm_attention._COUNTERS.values() if c.device.type != "meta")


@pytest.mark.parametrize(
    "d,tile",
    [(16, GemvTile(8, 64, 1, 4, 3)), (16, GemvTile(16, 32, 1, 4, 1, 0, 1)), (32, GemvTile(16, 64, 1, 4, 3))],
    ids=["half-head-band", "band-fitted-into-a-head", "d32-whole-half"],
)
def test_the_gemvs_last_programs_attend_over_the_cache_they_wrote(d, tile, monkeypatch):
    """At positions 0, 17 and 39 (the last): k and v rows bit-equal to the plain RoPE GEMV's, the attention rows
    the reference's over the cache so written (NaN past pos, never read), the counts at 0 after each call."""
    monkeypatch.setattr(llm_attention, "_COUNTERS", {})
    x, codes, scale, gamma, angles, (k0, v0) = _operands(d)
    for pos in (0, 17, L - 1):
        at = torch.tensor([pos])
        k1, v1, k2, v2 = k0.clone(), v0.clone(), k0.clone(), v0.clone()
        k2[:, :, pos + 1 :], v2[:, :, pos + 1 :] = float("nan"), float("nan")
        q = fused_gemv(x, codes, scale, Fusion(gamma, 1e-5, rope=RopeWrite(*angles, at, k1, v1, NQ)), tile)
        got = rope_gemv_attend(
            x, codes, scale, Fusion(gamma, 1e-5, rope=RopeWrite(*angles, at, k2, v2, NQ)), tile
        )
        for new, plain in ((k2, k1), (v2, v1)):
            assert torch.equal(new[:, :, : pos + 1], plain[:, :, : pos + 1])
        want = llm_attention.reference(q.view(1, NQ, 1, d), k1, v1, pos).reshape(1, -1)
        assert got.shape == (1, NQ * d) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"pos {pos}")
        assert _counts_at_rest() and len(llm_attention._COUNTERS) == 1  # made once, reused


@triton.jit
def _groups(out_ptr, nq, nkv, g: tl.constexpr):
    """Head ``program_id``'s group (`kv_group`) into ``out``."""
    h = tl.program_id(0)
    tl.store(out_ptr + h, kv_group(h, nq, nkv, g))


def test_each_heads_rows_count_for_the_group_that_reads_them():
    """`kv_group` over the qkv GEMV's heads (8 q heads, 2 KV heads: groups of 4): q heads 0-3 → 0, 4-7 → 1, then
    k heads 0, 1, then v heads 0, 1 (the interpreter runs programs in order, so only this shows a miscount)."""
    out = torch.full((12,), -1, dtype=torch.int32)
    interpreted(_groups)[(12,)](out, 8, 2, g=4)
    assert out.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1]


def test_it_attends_only_where_the_gemv_does_rope():
    x, codes, scale, gamma, _, _ = _operands(16)
    with pytest.raises(ValueError, match="RoPE only"):
        rope_gemv_attend(x, codes, scale, Fusion(gamma, 1e-5))


def test_the_switch_is_read_from_the_environment(monkeypatch):
    """``DEEPGAP_DECODE_ATTENTION``: triton unless set (or empty), sdpa and qkv as named; another value is refused."""
    monkeypatch.delenv("DEEPGAP_DECODE_ATTENTION", raising=False)
    assert llm_attention.attention_mode() == "triton"
    for mode in ("", "triton", "sdpa", "qkv"):
        monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", mode)
        assert llm_attention.attention_mode() == (mode or "triton")
    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "fast")
    with pytest.raises(
        UsageError, match="DEEPGAP_DECODE_ATTENTION='fast'; set it to one of triton, sdpa, qkv"
    ):
        llm_attention.enabled(torch.zeros(1, 4, 1, 16).bfloat16())


def test_a_batch_1_row_says_the_qkv_gemv_attends(monkeypatch):
    """`describe`: "in the qkv GEMV's last programs" at batch 1 where the layers attend there (and `show` names
    it); the plan elsewhere."""
    from deepgap.commands.decode_view import _engine

    monkeypatch.delenv("DEEPGAP_DECODE_SPLIT_KV", raising=False)
    monkeypatch.delenv("DEEPGAP_DECODE_COMBINE", raising=False)
    layers = [SimpleNamespace(attends_in_qkv=True), SimpleNamespace(attends_in_qkv=True)]
    model = SimpleNamespace(
        static_attention=llm_attention.decode_attention,
        shape=SimpleNamespace(kv_heads=8),
        embed_tokens=SimpleNamespace(weight=torch.zeros(1)),
        layers=layers,
    )
    assert llm_attention.describe(model, 1, 256) == "in the qkv GEMV's last programs"
    row = {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": "on: forced"}
    shown = _engine(row | {"decode_attention": llm_attention.describe(model, 1, 256)})
    assert shown == "quant (cuda-graph step, PDL, attention in the qkv GEMV)"
    assert llm_attention.describe(model, 4, 256) == "split 4×64 (auto)"  # more than one sequence: the kernel
    for layer in layers:
        layer.attends_in_qkv = False
    assert llm_attention.describe(model, 1, 256) == "split 8×32 (auto)"


def test_fused_layers_attending_in_qkv_decode_as_today(monkeypatch):
    """llama-tiny in fp8, static steps at positions 6 and 7 (device tensors): ``DEEPGAP_DECODE_ATTENTION=qkv``
    (every layer's attention in its qkv GEMV) gives the logits of today's path (the RoPE GEMV, then attention
    over the cache it wrote); `llm_fused.configure` turns it off again on the same model."""
    from deepgap.measure import llm_fused

    models, calls = static_steps_against_triton(monkeypatch, "qkv", "rope_gemv_attend_op")
    assert all(not m.attends_in_qkv for m in models["triton"].layers)
    assert all(m.attends_in_qkv for m in models["qkv"].layers)
    assert len(calls) == 2 * models["qkv"].shape.layers
    assert _counts_at_rest()
    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "triton")
    llm_fused.configure(models["qkv"])
    assert not any(m.attends_in_qkv for m in models["qkv"].layers)


def static_steps_against_triton(monkeypatch, mode: str, op: str):
    """llama-tiny in fp8 built with ``DEEPGAP_DECODE_ATTENTION`` ``triton`` and ``mode``, each prefilled alike; two
    static steps (positions 6 and 7, device tensors) from the same tokens, ``mode``'s logits within 3% of triton's.

    Returns the two models by mode, and one entry a call of `llm_fused`'s ``op`` (the attention-in-qkv op).
    """
    from deepgap.measure import llm_fused
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.delenv("DEEPGAP_DECODE_ROPE", raising=False)
    models = {}
    for m in ("triton", mode):
        monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", m)
        models[m] = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    calls = []
    run = getattr(llm_fused, op)
    monkeypatch.setattr(llm_fused, op, lambda *a: calls.append(1) or run(*a))
    ids = prompts(models["triton"].shape.vocab, 1, 6, 0)
    with torch.inference_mode():
        for m in models.values():
            m.setup_cache(1, 12)
        tok = models["triton"].prefill(ids).argmax(-1, keepdim=True)
        models[mode].prefill(ids)
        for position in (6, 7):
            a, b = (make_step(models[m], "static")(tok, position).float() for m in (mode, "triton"))
            rel = float((a - b).norm() / b.norm())
            assert rel < 0.03, (position, rel)
            tok = b.argmax(-1, keepdim=True)  # the same next token for both
    return models, calls


@pytest.mark.parametrize("tile", [GemvTile(8, 512, 1, 4, 4), GemvTile(4, 4096, 1, 8, 1, 0, 1)], ids=str)
def test_it_compiles_for_hopper_without_spills(tile):
    """Ahead-of-time sm_90 compile (no GPU) at Llama-3.1-8B's heads, PDL on: no spills, the group's count an
    acquire-release atomic at GPU scope, its reset relaxed, and q, K and V read past L1 (``ld.global.cg``)."""
    from sm90 import compile_sm90, ptxas_spills

    from deepgap.measure import llm_qkv_attention as m

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", cos_ptr="*bf16", sin_ptr="*bf16", pos_ptr="*i64",
               k_ptr="*bf16", v_ptr="*bf16", L="i32", NQ="i32", NKV="i32", PF_PROGRAMS="i32", cnt_ptr="*i32",
               attn_ptr="*bf16", sm_scale="fp32")  # fmt: skip
    const = dict(NORM=True, SWIGLU=False, RESIDUAL=False, BN=tile.bn, BK=tile.bk, REDUCE=bool(tile.reduce_each),
                 PDL=True, ROPE=True, D=128, PREFETCH=False, G=4, BL=m.TAIL_BLOCK, STAGES=m.TAIL_STAGES,
                 DOT_F32=False)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "k_ptr", "v_ptr", "attn_ptr")
    compiled = compile_sm90(
        m.rope_attend_kernel, sig, const, aligned, num_warps=tile.num_warps, num_stages=tile.num_stages
    )
    ptx = compiled.asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "atom.global.gpu.relaxed.exch" in ptx
    assert "ld.global.cg" in ptx and "griddepcontrol.wait" in ptx
    assert ptxas_spills(compiled) == 0


def _split_path(x, codes, scale, fusion, tile):
    """Today's step: the RoPE GEMV, then the attention kernel as the step plans it (split at 8B's heads)."""
    r = fusion.rope
    q = fused_gemv(x, codes, scale, fusion, tile)
    return llm_attention.decode_attention(q.view(1, r.heads, 1, r.k.shape[3]), r.k, r.v, r.pos).reshape(1, -1)


def _pdl_modes():
    return (False, True) if torch.cuda.get_device_capability() >= (9, 0) else (False,)


def replay_against_split(attend) -> None:
    """Llama-3.1-8B's qkv (K 4096, 32/8 heads of 128) over a 256-position cache, one tile for both: ``attend`` (an
    attending qkv GEMV) captured once in a CUDA graph with the split path (with PDL on Hopper, and without),
    replayed at positions 0, 31, 32, 200, 255; the rows within the attention tests' tolerance of the split
    path's, k and v bit-equal, the counts at 0 after."""
    from deepgap.measure.quant import launch

    x, codes, scale, gamma, angles, (k0, v0) = _operands(128, 32, 8, 4096, 256, "cuda")
    tile = GemvTile(8, 512, 1, 4, 4)
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    caches = [(k0.clone(), v0.clone()) for _ in range(2)]
    fusions = [Fusion(gamma, 1e-5, rope=RopeWrite(*angles, pos, k, v, 32)) for k, v in caches]
    for pdl in _pdl_modes():
        ctx = launch.pdl if pdl else contextlib.nullcontext
        with ctx():  # compiled (the PDL specialization too) and the counters made before the capture
            _split_path(x, codes, scale, fusions[0], tile), attend(x, codes, scale, fusions[1], tile)
        graph = torch.cuda.CUDAGraph()
        with ctx(), torch.cuda.graph(graph):
            want = _split_path(x, codes, scale, fusions[0], tile)
            got = attend(x, codes, scale, fusions[1], tile)
        for p in (0, 31, 32, 200, 255):
            pos.fill_(p)
            graph.replay()
            torch.testing.assert_close(
                got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"pdl {pdl}, pos {p}"
            )
            assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
        torch.cuda.synchronize()
        assert _counts_at_rest()


def graphed_against_triton(monkeypatch, pdl: str, mode: str):
    """llama-tiny in fp8, the compiled and graphed batch-1 step, 4 steps, with ``DEEPGAP_DECODE_ATTENTION=mode``
    against ``triton`` (the attention kernel's one pass at this 40-position cache), ``DEEPGAP_DECODE_PDL=pdl``
    (on: Hopper only): each step's relative L2 distance below 3%, the counts at 0; the model."""
    if pdl == "on" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("PDL needs Hopper")
    from graphed_tiny import fp8_graph_logits

    monkeypatch.setenv("DEEPGAP_DECODE_PDL", pdl)
    logits = {}
    for attention in ("triton", mode):
        monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", attention)
        logits[attention], model = fp8_graph_logits(logits.get("triton"))
    for i in range(4):
        a, b = logits[mode][i], logits["triton"][i]
        assert float((a - b).norm() / b.norm()) < 0.03, i
    assert _counts_at_rest()
    return model


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_it_is_the_split_path_in_a_graph_at_every_position():
    replay_against_split(rope_gemv_attend)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pdl", ["off", "on"])
def test_on_the_gpu_the_graphed_step_gives_the_split_paths_logits(monkeypatch, pdl):
    """`graphed_against_triton` with ``qkv``; the row says where it attends."""
    model = graphed_against_triton(monkeypatch, pdl, "qkv")
    assert llm_attention.describe(model, 1, 40) == "in the qkv GEMV's last programs"
