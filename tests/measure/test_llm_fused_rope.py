"""RoPE and the K/V cache write folded into the batch-1 qkv GEMV (`quant.gemv_fused`'s ROPE variant).

On the CPU the kernel runs in Triton's interpreter: its q and cache rows against the same arithmetic in fp32,
then llama-tiny's decode steps with ``DEEPGAP_DECODE_ROPE=fused`` against the plain layers. The GPU test holds
the compiled, graphed step to the default path's logits.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant.gemv import GemvTile
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv, reference

NQ, NKV, D, K, L = 4, 2, 16, 128, 8  # llama-tiny's heads; K two steps of the tiles below


def _operands(pos: int):
    g = torch.Generator().manual_seed(3)
    n = (NQ + 2 * NKV) * D
    x = torch.randn(1, K, generator=g).bfloat16()
    codes = (torch.randn(n, K, generator=g) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g) + 0.5) / 200
    gamma = (torch.rand(K, generator=g) + 0.5).bfloat16()
    half = torch.rand(D // 2, generator=g) * 6  # HF's angles: the two halves of a head share them
    cos, sin = (f(torch.cat([half, half])).bfloat16()[None] for f in (torch.cos, torch.sin))
    return x, codes, scale, gamma, cos, sin, torch.tensor([pos])


def _fusion(gamma, cos, sin, pos):
    cache = [torch.zeros(1, NKV, L, D).bfloat16() for _ in range(2)]
    return Fusion(gamma, 1e-5, rope=RopeWrite(cos, sin, pos, cache[0], cache[1], NQ)), cache


def test_rope_gemv_writes_q_and_the_cache_rows_of_its_reference():
    """q, and the cache's k and v rows at ``pos``, each within one bf16 step of the fp32 arithmetic.

    Two tiles: a block one whose program's channels are half a head, and a reduce-each one of 16 channels that
    span two heads. Every other cache row stays empty.
    """
    x, codes, scale, gamma, cos, sin, pos = _operands(5)
    fusion, (k_want, v_want) = _fusion(gamma, cos, sin, pos)
    q_want = reference(x, codes, scale, fusion)
    assert k_want[0, :, 5].abs().sum() > 0 and v_want[0, :, 5].abs().sum() > 0
    for tile in (GemvTile(8, 64, 1, 4, 3), GemvTile(16, 64, 1, 4, 1, 0, 1)):
        fusion, (k, v) = _fusion(gamma, cos, sin, pos)
        q = fused_gemv(x, codes, scale, fusion, tile)
        assert q.shape == (1, NQ * D) and q.dtype == torch.bfloat16
        for got, want in ((q, q_want), (k, k_want), (v, v_want)):
            ulp = want.float().abs().clamp(min=1e-2) * 2**-7
            assert bool(((got.float() - want.float()).abs() <= ulp).all()), tile


def test_rope_reference_is_the_models_rotation():
    """The reference's rotation is `llama_net.rotate` on the plain product's heads (up to bf16 rounding)."""
    from deepgap.measure.models.llama_net import rotate

    x, codes, scale, gamma, cos, sin, pos = _operands(2)
    fusion, (k, _) = _fusion(gamma, cos, sin, pos)
    q = reference(x, codes, scale, fusion).float()
    heads = reference(x, codes, scale, Fusion(gamma, 1e-5)).float().reshape(-1, D)
    want = rotate(heads, cos.float(), sin.float())
    assert torch.allclose(q.reshape(NQ, D), want[:NQ], rtol=2e-2, atol=2e-2)
    assert torch.allclose(k[0, :, 2].float(), want[NQ : NQ + NKV], rtol=2e-2, atol=2e-2)


def test_rope_gemv_refuses_a_cache_that_does_not_fit():
    x, codes, scale, gamma, cos, sin, pos = _operands(0)
    bad = torch.zeros(1, NKV + 1, L, D).bfloat16()
    with pytest.raises(ValueError, match="heads"):
        fused_gemv(x, codes, scale, Fusion(gamma, 1e-5, rope=RopeWrite(cos, sin, pos, bad, bad.clone(), NQ)))


def test_rope_mode_is_read_from_the_environment(monkeypatch):
    from deepgap.core.errors import UsageError
    from deepgap.measure.llm_fused import rope_mode

    monkeypatch.delenv("DEEPGAP_DECODE_ROPE", raising=False)
    assert rope_mode() == "fused"  # the default since session 22's H200 timing
    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "mix")
    assert rope_mode() == "mix"
    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "fused")
    assert rope_mode() == "fused"
    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_ROPE"):
        rope_mode()


def test_rope_fused_decode_steps_give_the_plain_layers_logits(monkeypatch):
    """llama-tiny in fp8, ``DEEPGAP_DECODE_ROPE=fused``: an eager step at position 6 (an int), a static one at 7
    (a device tensor) that reads the first's k and v from the cache the kernel wrote, against the same weights
    through the plain layers.
    """
    from graphed_tiny import prefill_both

    from deepgap.measure import llm_fused
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "fused")
    fused = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    assert all(m.rope for m in fused.layers)
    plain = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    for m in plain.layers:
        m.forward = m.layer.forward
    calls = []
    op = llm_fused.rope_gemv_op
    monkeypatch.setattr(llm_fused, "rope_gemv_op", lambda *a: calls.append(1) or op(*a))
    tok = prefill_both(fused, plain)
    with torch.inference_mode():
        for kind, position in (("eager", 6), ("static", 7)):
            a, b = (make_step(m, kind)(tok, position).float() for m in (fused, plain))
            rel = float((a - b).norm() / b.norm())
            assert rel < 0.03, (position, rel)
            tok = b.argmax(-1, keepdim=True)  # the same next token for both
    assert len(calls) == 2 * fused.shape.layers  # every layer's step took the RoPE GEMV


@pytest.mark.gpu
def test_rope_fused_graphed_step_gives_the_default_paths_logits(monkeypatch):
    """The compiled, graphed batch-1 fp8 step with ``DEEPGAP_DECODE_ROPE=fused`` against the default path, 4 steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from graphed_tiny import fp8_graph_logits

    logits = {}
    for mode in ("mix", "fused"):
        monkeypatch.setenv("DEEPGAP_DECODE_ROPE", mode)
        # the default path's tokens for both: the steps compare the same inputs
        logits[mode], model = fp8_graph_logits(logits.get("mix"))
        assert all(m.rope == (mode == "fused") for m in model.layers)
    for i in range(4):
        a, b = logits["fused"][i], logits["mix"][i]
        assert float((a - b).norm() / b.norm()) < 0.03, i
