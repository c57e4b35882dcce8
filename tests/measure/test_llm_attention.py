"""The static decode step's attention kernel (`deepgap.measure.llm_attention`, issue 51).

On the CPU the kernel runs in Triton's interpreter; the GPU test holds the compiled kernel to the same
reference at Llama-3.1-8B's head shape.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from deepgap.core.errors import UsageError
from deepgap.measure import llm_attention
from deepgap.measure.llm_attention import (
    attend,
    chunked,
    decode_attention,
    describe,
    enabled,
    plan,
    reference,
)


def _qkv(b, nq, nkv, d, length, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, nq, 1, d, generator=g, device=device).bfloat16()
    k = torch.randn(b, nkv, length, d, generator=g, device=device).bfloat16()
    v = torch.randn(b, nkv, length, d, generator=g, device=device).bfloat16()
    return q, k, v


@pytest.mark.parametrize(
    "b,nq,nkv,d,length,pos",
    [(2, 8, 2, 32, 100, 0), (2, 8, 2, 32, 100, 70), (1, 4, 4, 16, 64, 63), (3, 12, 4, 64, 130, 129)],
    ids=["first-position", "mid-block", "one-block-full", "three-blocks-gqa3"],
)
def test_kernel_is_softmax_attention_over_the_written_positions(b, nq, nkv, d, length, pos):
    """Every group's query rows over K and V up to ``pos`` only: positions after it hold NaN and are not read."""
    q, k, v = _qkv(b, nq, nkv, d, length)
    want = reference(q, k, v, pos)
    k[:, :, pos + 1 :] = float("nan")
    v[:, :, pos + 1 :] = float("nan")
    got = decode_attention(q, k, v, torch.tensor([pos]))
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("last", [False, True], ids=["combine-kernel", "last-block"])
@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_split_kernel_is_the_reference_at_every_cut(chunks, last, monkeypatch):
    """Split KV over 128 positions in 1, 2 or 4 chunks (partials, then the combine kernel or the last program's
    merge): a position inside the first chunk, both sides of a chunk boundary and the last; NaN past pos, in
    the cache and in the chunks' scratch, is never read; the last-block counts are back at 0 after each call."""
    real = llm_attention.workspace
    nan = float("nan")
    monkeypatch.setattr(llm_attention, "workspace", lambda *a: tuple(t.fill_(nan) for t in real(*a)))
    monkeypatch.setattr(llm_attention, "_COUNTERS", {})
    q, k, v = _qkv(2, 8, 2, 16, 128)
    split = chunked(128, chunks)
    assert split.chunks == chunks and split.combine
    for pos in sorted({5, split.chunk - 1, min(split.chunk, 126), 127}):
        want = reference(q, k, v, pos)
        kn, vn = k.clone(), v.clone()
        kn[:, :, pos + 1 :] = float("nan")
        vn[:, :, pos + 1 :] = float("nan")
        got = attend(q, kn, vn, torch.tensor([pos]), split, last=last)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"pos {pos}")
        assert all(int(c.abs().sum()) == 0 for c in llm_attention._COUNTERS.values())
    assert len(llm_attention._COUNTERS) == int(last)  # made once, reused at every position


@pytest.mark.parametrize("combine", ["kernel", "last-block"])
def test_split_kernel_takes_each_sequences_own_position(combine, monkeypatch):
    """Through the op with DEEPGAP_DECODE_SPLIT_KV=on: 100 positions in two chunks of 64 (the last part full),
    each row read up to its own position: in the first chunk, at the boundary, at the last position; merged
    by the combine kernel or by the last program (DEEPGAP_DECODE_COMBINE)."""
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", "on")
    monkeypatch.setenv("DEEPGAP_DECODE_COMBINE", combine)
    q, k, v = _qkv(3, 8, 2, 32, 100)
    assert plan(3, 2, 100, 132, "on") == chunked(100, 2)  # four would hold under 32 positions each
    pos = torch.tensor([3, 64, 99])
    got = decode_attention(q, k, v, pos)
    for r, p in enumerate(pos.tolist()):
        want = reference(q[r : r + 1], k[r : r + 1], v[r : r + 1], p)
        torch.testing.assert_close(got[r : r + 1].float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "length,block", [(100, 128), (300, 128), (64, 64)], ids=["one-block", "three", "short"]
)
def test_wide_pass_loads_the_cache_past_pos_and_uses_none_of_it(length, block, monkeypatch):
    """DEEPGAP_DECODE_SPLIT_KV=wide: one pass in blocks of up to WIDE_BLOCK, walked to the cache's end whatever pos
    says: NaN past pos (loaded, masked) never reaches the output, at the first position, inside a block, at a
    block's edge, at the last; per-sequence positions too."""
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", "wide")
    split = plan(2, 2, length, 132, "wide")
    assert split.wide and not split.combine and split.block == block and split.chunk == length
    q, k, v = _qkv(2, 8, 2, 16, length)
    for pos in sorted({0, 37, block - 1, min(block, length - 1), length - 1}):
        kn, vn = k.clone(), v.clone()
        kn[:, :, pos + 1 :] = float("nan")
        vn[:, :, pos + 1 :] = float("nan")
        got = decode_attention(q, kn, vn, torch.tensor([pos]))
        torch.testing.assert_close(got.float(), reference(q, k, v, pos).float(), rtol=2e-2, atol=2e-2)
    got = decode_attention(q, k, v, torch.tensor([3, length - 1]))
    for r, p in enumerate((3, length - 1)):
        want = reference(q[r : r + 1], k[r : r + 1], v[r : r + 1], p)
        torch.testing.assert_close(got[r : r + 1].float(), want.float(), rtol=2e-2, atol=2e-2)


def test_wide_takes_autos_plan_past_its_longest_cache():
    """A cache over WIDE_MAX is split as ``auto`` splits it (one pass bound by its length would walk it alone)."""
    assert plan(1, 8, llm_attention.WIDE_MAX + 1, 132, "wide") == plan(
        1, 8, llm_attention.WIDE_MAX + 1, 132, "auto"
    )
    assert plan(1, 8, 256, 132, "wide") == llm_attention.Split(1, 256, 128, combine=False, wide=True)


def test_split_is_chosen_from_shapes_and_the_switch(monkeypatch):
    """auto splits only where b × kv_heads fills under half the SMs, into one wave at most; off never."""
    assert plan(1, 8, 256, 132, "auto") == chunked(256, 8)  # Llama-3.1-8B, batch 1: 64 programs
    assert plan(4, 8, 256, 132, "auto") == chunked(256, 4)
    assert not plan(16, 8, 256, 132, "auto").combine  # 128 programs already
    assert plan(16, 8, 256, 132, "on") == chunked(256, 2)
    assert not plan(1, 8, 256, 132, "off").combine
    assert not plan(1, 8, 40, 132, "on").combine  # two chunks would hold under 32 positions each
    assert chunked(300, 8) == chunked(300, 7)  # chunks of 48: seven cover 300
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", "yes")
    with pytest.raises(
        UsageError, match="DEEPGAP_DECODE_SPLIT_KV='yes'; set it to one of auto, on, off, wide"
    ):
        decode_attention(*_qkv(1, 4, 4, 16, 64), torch.tensor([0]))


def test_a_decode_row_says_which_attention_its_step_ran(monkeypatch):
    """`describe` (the row's ``decode.attention``) is the plan the op makes, and `show` names a split."""
    from types import SimpleNamespace

    from deepgap.commands.decode_view import _engine

    model = SimpleNamespace(
        static_attention=decode_attention,
        shape=SimpleNamespace(kv_heads=8),
        embed_tokens=SimpleNamespace(weight=torch.zeros(1)),
    )
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", "off")
    assert describe(model, 1, 256) == "one pass (off)"
    monkeypatch.delenv("DEEPGAP_DECODE_SPLIT_KV")  # auto, the default since session 22's H200 timing
    assert describe(model, 1, 256) == "split 8×32 (auto)" and describe(model, 16, 256) == "one pass (auto)"
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", "wide")
    assert describe(model, 1, 256) == "one pass in blocks of 128, bound by the cache (wide)"
    assert describe(model, 1, 1024) == "split 16×64 (wide)"  # past WIDE_MAX: auto's plan
    monkeypatch.delenv("DEEPGAP_DECODE_SPLIT_KV")
    monkeypatch.setenv("DEEPGAP_DECODE_COMBINE", "last-block")
    assert describe(model, 1, 256) == "split 8×32 (auto, last-block merge)"
    monkeypatch.setenv("DEEPGAP_DECODE_COMBINE", "both")
    with pytest.raises(
        UsageError, match="DEEPGAP_DECODE_COMBINE='both'; set it to one of kernel, last-block"
    ):
        describe(model, 1, 256)
    model.static_attention = None
    assert describe(model, 1, 256) == "sdpa"
    row = {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": "on: forced"}
    assert (
        _engine(row | {"decode_attention": "split 8×32 (auto)"}) == "quant (cuda-graph step, PDL, split KV)"
    )
    assert _engine(row | {"decode_attention": "one pass (auto)"}) == "quant (cuda-graph step, PDL)"
    wide = {"decode_attention": "one pass in blocks of 128, bound by the cache (wide)"}
    assert _engine(row | wide) == "quant (cuda-graph step, PDL, attention walks the whole cache)"


def test_only_a_gpus_half_precision_step_takes_it(monkeypatch):
    q = torch.zeros(1, 4, 1, 16)
    assert not enabled(q) and not enabled(q.bfloat16())  # a CPU tensor: SDPA
    if torch.cuda.is_available():
        assert enabled(q.cuda().bfloat16()) and not enabled(q.cuda())
        monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "sdpa")
        assert not enabled(q.cuda().bfloat16())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["auto", "wide"])
@pytest.mark.parametrize("batch,pos", [(1, 0), (1, 200), (64, 255)])
def test_kernel_on_the_gpu_at_llama_8b_heads(batch, pos, mode, monkeypatch):
    """The op as planned (``auto``, ``wide``: NaN past pos loaded and never used) at 8B's heads over 256 positions."""
    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", mode)
    q, k, v = _qkv(batch, 32, 8, 128, 256, "cuda")
    want = reference(q, k, v, pos)
    k[:, :, pos + 1 :] = float("nan")
    v[:, :, pos + 1 :] = float("nan")
    got = decode_attention(q, k, v, torch.tensor([pos], device="cuda"))
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("last", [False, True], ids=["combine-kernel", "last-block"])
@pytest.mark.parametrize("batch", [1, 4])
def test_split_on_the_gpu_is_the_one_pass_and_sdpa_at_every_position(batch, last):
    """Llama-3.1-8B's heads over a 300-position cache: split (as ``on`` plans it; merged by the combine kernel
    or the last program), one pass and SDPA agree at each position; the split captured once in a CUDA graph
    (with PDL on Hopper) replays right at others, and the last-block counts are back at 0 after."""
    from deepgap.measure.llm_attention import device_sms
    from deepgap.measure.quant import launch

    q, k, v = _qkv(batch, 32, 8, 128, 300, "cuda")
    split, one = plan(batch, 8, 300, device_sms(q.device), "on"), plan(batch, 8, 300, 1, "off")
    assert split.chunks > 1
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    for p in range(300):
        pos.fill_(p)
        got, base = attend(q, k, v, pos, split, last=last), attend(q, k, v, pos, one)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k[:, :, : p + 1], v[:, :, : p + 1], enable_gqa=True
        )
        torch.testing.assert_close(got.float(), base.float(), rtol=1e-2, atol=1e-2, msg=f"pos {p}")
        torch.testing.assert_close(got.float(), sdpa.float(), rtol=2e-2, atol=2e-2, msg=f"pos {p}")

    def pdl():
        return launch.pdl() if torch.cuda.get_device_capability() >= (9, 0) else contextlib.nullcontext()

    with pdl():
        attend(q, k, v, pos, split, last=last)  # compiled (its PDL specialization) before the capture
    graph = torch.cuda.CUDAGraph()
    with pdl(), torch.cuda.graph(graph):
        out = attend(q, k, v, pos, split, last=last)
    for p in (0, split.chunk - 1, split.chunk, 200, 299):  # a chunk boundary among them
        pos.fill_(p)
        graph.replay()
        want = reference(q, k, v, p)
        torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2, msg=f"graph, pos {p}")
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for c in llm_attention._COUNTERS.values())


def test_the_static_step_with_the_kernel_decodes_as_with_sdpa():
    """llama-tiny in bf16, the static step's attention plugged as the worker plugs it: the same logits as SDPA's."""
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    model = build_llama("llama-tiny", seed=0, device="cpu").to(torch.bfloat16)
    step = make_step(model, "static")
    assert model.static_attention is None  # a CPU model: SDPA, unless plugged
    ids = prompts(model.shape.vocab, 2, 6, 0)

    def run():
        tok = model.prefill(ids).argmax(-1, keepdim=True)
        return torch.stack([step(tok, 6 + i).float() for i in range(3)])

    outs = _sdpa_then_kernel(model, 2, 10, run)
    torch.testing.assert_close(outs[1], outs[0], rtol=3e-2, atol=3e-2)


def test_kernel_takes_each_sequences_own_position():
    """Continuous batching's slot step: one position per sequence, each row read up to its own."""
    q, k, v = _qkv(3, 8, 2, 32, 100)
    pos = torch.tensor([0, 70, 99])
    got = decode_attention(q, k, v, pos)
    for r, p in enumerate(pos.tolist()):
        want = reference(q[r : r + 1], k[r : r + 1], v[r : r + 1], p)
        torch.testing.assert_close(got[r : r + 1].float(), want.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="one per sequence"):
        decode_attention(q, k, v, torch.tensor([1, 2]))


def test_the_slot_step_with_the_kernel_decodes_as_with_sdpa():
    """llama-tiny in bf16: `decode_slots` at per-row positions, the kernel plugged, gives SDPA's logits."""
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    model = build_llama("llama-tiny", seed=0, device="cpu").to(torch.bfloat16)
    lens = torch.tensor([3, 6, 5])
    ids = prompts(model.shape.vocab, 3, 6, 0)

    def run():
        first = model.prefill_slots(ids, torch.arange(3), lens).argmax(-1, keepdim=True)
        return model.decode_slots(first, lens.clone()).float()

    outs = _sdpa_then_kernel(model, 3, 12, run)
    torch.testing.assert_close(outs[1], outs[0], rtol=3e-2, atol=3e-2)
    assert not torch.equal(outs[1], outs[0])  # the kernel ran (its fp32 products round apart from SDPA's)


def _sdpa_then_kernel(model, batch: int, max_len: int, run) -> list:
    """``run()``'s logits with SDPA's attention, then with the kernel plugged, each on a fresh cache."""
    outs = []
    for plug in (None, decode_attention):
        model.static_attention = plug
        model.setup_cache(batch, max_len)
        with torch.inference_mode():
            outs.append(run())
    return outs
