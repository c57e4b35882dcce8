"""The quant decoder's batch-1 layer (`deepgap.measure.llm_fused`) and its fused GEMV (`quant.gemv_fused`).

On the CPU the kernel runs in Triton's interpreter; the GPU test decodes llama-tiny at batch 1 through the
compiled, graphed step and holds it to the plain layers' logits.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant.gemv_fused import Fusion, fused_gemv, reference


def _operands(k: int, n: int, seed: int = 3, int8: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 40).clamp(-120, 120)
    codes = w.round().to(torch.int8) if int8 else w.to(torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g) + 0.5) / 200
    return g, x, codes, scale


@pytest.mark.parametrize(
    "norm,swiglu,residual",
    [(False, False, False), (True, False, False), (True, True, False), (False, False, True)],
    ids=["plain", "norm", "norm-swiglu", "residual"],
)
def test_fused_gemv_is_its_reference(norm, swiglu, residual):
    """Each variant the layer uses, several K steps (tiles 16 × 64), against the same arithmetic in fp32.

    fp8 codes, int8 for the residual variant. The kernel rounds once, at the store, so each output is
    within one bf16 step of its reference.
    """
    from deepgap.measure.quant.gemv import GemvTile

    k, n = 192, 96
    g, x, codes, scale = _operands(k, n, int8=residual)
    no = n // 2 if swiglu else n
    fusion = Fusion(
        gamma=(torch.rand(k, generator=g) + 0.5).bfloat16() if norm else None,
        eps=1e-5,
        swiglu=swiglu,
        residual=torch.randn(1, no, generator=g).bfloat16() if residual else None,
    )
    want = reference(x, codes, scale, fusion)
    ulp = want.float().abs().clamp(min=1e-2) * 2**-7
    for tile in (GemvTile(16, 64, 1, 4, 3), GemvTile(16, 64, 1, 4, 1, 0, 1)):  # a block, or each step reduced
        got = fused_gemv(x, codes, scale, fusion, tile)
        assert got.shape == (1, no) and got.dtype == torch.bfloat16
        assert bool(((got.float() - want.float()).abs() <= ulp).all()), tile


def test_fused_gemv_norm_is_rmsnorm_then_product():
    """The folded norm is the model's RMSNorm followed by the plain product (up to bf16 rounding)."""
    from deepgap.measure.models.llama_net import RMSNorm

    k, n = 128, 64
    g, x, codes, scale = _operands(k, n, seed=5)
    norm = RMSNorm(k, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=g) + 0.5)
    norm = norm.bfloat16()
    got = fused_gemv(x, codes, scale, Fusion(gamma=norm.weight.detach(), eps=1e-5)).float()
    with torch.no_grad():
        want = reference(norm(x), codes, scale, Fusion()).float()
    assert float((got - want).norm() / want.norm()) < 2e-2


def test_fused_gemv_refuses_bad_operands():
    _, x, codes, scale = _operands(64, 32)
    with pytest.raises(ValueError, match="one contiguous bf16 row"):
        fused_gemv(torch.cat([x, x]), codes, scale, Fusion())
    with pytest.raises(ValueError, match="gamma"):
        fused_gemv(x, codes, scale, Fusion(gamma=torch.ones(32).bfloat16()))


@pytest.mark.parametrize("norm", ["handoff", "fold"])
def test_fused_layers_decode_as_the_plain_ones(monkeypatch, norm, precision="fp8"):
    """llama-tiny with 8-bit Linears: its layers wrapped, a one-row step through the fused GEMVs.

    The same weights unfused give the reference: the prefill (many rows) is the plain path in both, so
    the caches agree; the batch-1 decode steps then differ only by bf16 roundings. With each norm folded
    into its reader, or handed over by the row's writer (`norm_handoff`; layer to layer too).
    """
    from deepgap.measure import llm_fused
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_NORM", norm)
    fused = LINEAR_SWAPS[precision](build_llama("llama-tiny", seed=0, device="cpu"))
    assert all(isinstance(m, llm_fused.FusedLayer) for m in fused.layers)
    handed = []  # the layers' outputs: a `Handed` row from every layer but the last with the hand-off
    for m in fused.layers:
        m.register_forward_hook(lambda _m, _a, out: handed.append(isinstance(out, llm_fused.Handed)))
    plain = LINEAR_SWAPS[precision](build_llama("llama-tiny", seed=0, device="cpu"))
    for m in plain.layers:  # the same seeded weights and codes, the plain path
        m.forward = m.layer.forward
    ids = prompts(fused.shape.vocab, 1, 6, 0)
    with torch.inference_mode():
        for m in (fused, plain):
            m.setup_cache(1, 12)
        a, b = fused.prefill(ids), plain.prefill(ids)
        assert torch.equal(a, b)  # rows > 1: the wrapped layer itself
        # one decode step (its k/v go to the cache and are read back in the same step): a second one, in
        # Triton's interpreter, cost ~2 CPU-s more and checked the same layers again
        tok = a.argmax(-1, keepdim=True)
        a, b = fused.decode_step(tok, 6), plain.decode_step(tok, 6)
    rel = float((a.float() - b.float()).norm() / b.float().norm())
    assert 0 < rel < 0.03, rel  # 0 would mean the fused path never ran
    layers = len(fused.layers)
    assert handed[-layers:] == [norm == "handoff"] * (layers - 1) + [False]


def test_the_norm_switch_chains_the_fused_layers(monkeypatch):
    """``DEEPGAP_DECODE_NORM``: each layer's down hands its row to the next layer's qkv (the last to none), and
    o's to gate_up; with ``fold`` none; a value outside fold/handoff is a usage error."""
    from deepgap.core.errors import UsageError
    from deepgap.measure import llm_fused
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.models.llama_net import build_llama

    model = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    layers = list(model.layers)
    nexts = [m.layer.input_layernorm for m in layers[1:]]
    assert all(m.handoff for m in layers) and [m.next_norm[0] for m in layers[:-1]] == nexts
    assert layers[-1].next_norm == () and not any("next_norm" in n for n, _ in model.named_modules())
    monkeypatch.setenv("DEEPGAP_DECODE_NORM", "fold")
    llm_fused.configure(model)
    assert not any(m.handoff or m.next_norm for m in layers)
    monkeypatch.setenv("DEEPGAP_DECODE_NORM", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_NORM"):
        llm_fused.configure(model)


def test_fuse_leaves_other_models_alone():
    """Only layers whose four projections are weight-only 8-bit Linears are wrapped (bf16 ones are not)."""
    from deepgap.measure import llm_fused
    from deepgap.measure.models.llama_net import build_llama

    m = build_llama("llama-tiny", seed=0, device="cpu")
    assert llm_fused.fuse(m) == 0 and llm_fused.fuse(torch.nn.Linear(4, 4)) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_fused_decode_compiled_and_graphed(precision):
    """The batch-1 quant decode step as the sweep runs it (compiled, one CUDA graph) against the plain layers."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    fused = LINEAR_SWAPS[precision](build_llama("llama-tiny", seed=0, device="cuda"))
    ids = prompts(fused.shape.vocab, 1, 16, 0).cuda()
    with torch.inference_mode():
        fused.setup_cache(1, 40)
        tok = fused.prefill(ids).argmax(-1, keepdim=True)
        step = make_step(fused, "cuda-graph", "default", compiled=True)
        got = step(tok, 16).float().clone()
        for m in fused.layers:  # the same weights and cache position, the plain path (eager)
            m.forward = m.layer.forward
        want = fused.decode_step(tok, 16).float()
    assert float((got - want).norm() / want.norm()) < 0.03


def test_decode_pdl_mode_is_read_from_the_environment(monkeypatch):
    """DEEPGAP_DECODE_PDL=off captures the plain graph only; a value outside auto/on/off is a usage error."""
    from deepgap.core.errors import UsageError
    from deepgap.measure.quant.pdl_choice import decode_modes

    monkeypatch.setenv("DEEPGAP_DECODE_PDL", "off")
    assert decode_modes(torch.device("cpu")) == (False,)
    monkeypatch.setenv("DEEPGAP_DECODE_PDL", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_PDL"):
        decode_modes(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4])
def test_pdl_graph_gives_the_plain_graphs_logits(monkeypatch, batch):
    """The fp8 decode graph with programmatic dependent launch: the same logits, bit for bit, step after step.

    At batch 1 the fused GEMVs read their first weights before the wait; at 4 the tensor-core GEMV waits
    first. A kernel that read an activation before its wait would differ here (or at random steps).
    """
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (programmatic dependent launch)")
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    model = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cuda"))
    ids = prompts(model.shape.vocab, batch, 16, 0).cuda()
    logits = {}
    for mode in ("off", "on", "auto"):
        monkeypatch.setenv("DEEPGAP_DECODE_PDL", mode)
        with torch.inference_mode():
            model.setup_cache(batch, 40)
            tok = model.prefill(ids).argmax(-1, keepdim=True)
            step = make_step(model, "cuda-graph", "default", compiled=True)
            out = []
            for i in range(4):
                out.append(step(tok, 16 + i).float().clone())
                tok = out[-1].argmax(-1, keepdim=True)  # logits (batch, vocab): each row's greedy token
            logits[mode] = torch.stack(out)
        kept = step.pdl.split(":")[0]  # auto says which it kept, and the two timings
        assert kept == mode if mode != "auto" else kept in ("on", "off") and "timed" in step.pdl
    assert torch.equal(logits["on"], logits["off"]) and torch.equal(logits["auto"], logits["off"])


def test_show_names_a_pdl_graph_and_export_says_why():
    """`show` marks a decode row whose graph kept PDL; a kept-plain or unstated row says nothing of it."""
    from deepgap.commands.decode_view import _engine

    row = {"engine": "quant", "decode_step": "cuda-graph"}
    assert (
        _engine(row | {"decode_pdl": "on: timed 2.67 ms with PDL, 2.82 without"})
        == "quant (cuda-graph step, PDL)"
    )
    assert (
        _engine(row | {"decode_pdl": "off: timed 11.57 ms with PDL, 11.21 without"})
        == "quant (cuda-graph step)"
    )
    assert _engine({"engine": "eager", "decode_step": "eager", "decode_pdl": ""}) == "eager"
    late = (
        "on: timed 2.30 ms with PDL (each kernel's trigger after its wait), 2.45 without"  # `llm_steps._kept`
    )
    assert _engine(row | {"decode_pdl": late}) == "quant (cuda-graph step, PDL, trigger after the wait)"


def test_a_decode_rows_pdl_verdict_says_the_kernels_order_and_the_view_reads_it(monkeypatch):
    """`llm_steps.pdl_order`: the trigger after the wait (late), the constants before it (ahead); show's words."""
    from deepgap.commands.decode_view import _engine
    from deepgap.measure.llm_steps import pdl_order

    row = {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": ""}
    said = {}
    for trigger, constants in [("late", "after"), ("late", "ahead"), ("early", "ahead"), ("early", "after")]:
        monkeypatch.setenv("DEEPGAP_PDL_TRIGGER", trigger)
        monkeypatch.setenv("DEEPGAP_PDL_CONSTANTS", constants)
        said[trigger, constants] = pdl_order()
    assert said == {
        ("late", "after"): " (each kernel's trigger after its wait)",
        ("late", "ahead"): " (each kernel's trigger after its wait, its constants before it)",
        ("early", "ahead"): " (each kernel's constants before its wait)",
        ("early", "after"): "",
    }
    views = {
        k: _engine(row | {"decode_pdl": f"on: timed 2.30 ms with PDL{v}, 2.45 without"})
        for k, v in said.items()
    }
    assert views == {
        ("late", "after"): "quant (cuda-graph step, PDL, trigger after the wait)",
        ("late", "ahead"): "quant (cuda-graph step, PDL, trigger after the wait, constants before it)",
        ("early", "ahead"): "quant (cuda-graph step, PDL, constants before it)",
        ("early", "after"): "quant (cuda-graph step, PDL)",
    }


def test_a_decode_row_says_which_gemv_tiles_the_worker_chose(monkeypatch):
    """`gemv.chosen` names each timed GEMV shape and its tile (plain and fused keys, not the fused Linear's
    tiles that share its table); export carries it as is."""
    from deepgap.analysis.decode import figures
    from deepgap.measure.quant import gemv
    from deepgap.measure.quant.tiles import TileConfig

    monkeypatch.setattr(gemv, "_TUNED", {})
    assert gemv.chosen() == ""
    gemv._TUNED[(1, 4096, 1024, "cuda:0")] = gemv.GemvTile(4, 4096, 1, 8, 1, 0, 1)
    rope = ("fused", (True, False, False, True), 4096, 6144, "cuda:0")
    gemv._TUNED[rope] = gemv.GemvTile(8, 512, 1, 4, 4, 1)
    gemv._TUNED[("fp8_linear", 256, 768, 3072, True, True, "cuda:0")] = TileConfig(
        128, 128, 64
    )  # not a GEMV's
    assert gemv.chosen() == (
        "1 row(s) 4096x1024: 4x4096 s1 w8 st1 reduce-each; fused norm+rope 4096x6144: 8x512 s1 w4 st4 prefetch"
    )
    assert "decode_tiles" in figures({"status": "skipped"})  # kept on every row, like decode_pdl
    from deepgap.measure.quant.gemv_fused import QKV_TILE

    monkeypatch.setattr(gemv, "PINNED", {rope: QKV_TILE.fit(4096, 3072)})  # qkv's tile, set untimed
    assert not gemv.chosen().endswith("untimed)")  # a turn that forced another tile (the loop's `--tiles`)
    gemv._TUNED[rope] = QKV_TILE.fit(4096, 3072)
    assert gemv.chosen().endswith(
        "fused norm+rope 4096x6144: 4x1024 s1 w4 st1 reduce-in-thread (qkv's tile pinned, untimed)"
    )


def test_qkv_takes_its_pinned_tile_unless_told_to_time_it(monkeypatch):
    """The fused GEMV with RoPE in its epilogue (qkv) offers `gemv_fused.QKV_TILE` alone;
    ``DEEPGAP_DECODE_QKV_TILE=tuned`` gives it the other fused GEMVs' candidates. The GEMVs without RoPE keep theirs
    either way."""
    from deepgap.measure.quant import gemv
    from deepgap.measure.quant.gemv_fused import QKV_TILE, Fusion

    qkv, o = Fusion(rope=object(), handed=torch.ones(512)), Fusion(residual=torch.zeros(1, 16).bfloat16())
    assert qkv.tiles() == (QKV_TILE,) and o.tiles() == gemv.FUSED_TILES
    assert QKV_TILE.describe() == "4x1024 s1 w4 st1 reduce-in-thread"
    monkeypatch.setenv("DEEPGAP_DECODE_QKV_TILE", "tuned")
    assert qkv.tiles() == gemv.FUSED_TILES and o.tiles() == gemv.FUSED_TILES


def test_gemv_tiles_are_timed_under_pdl_where_a_decode_graph_may_use_it(monkeypatch):
    """`gemv.fastest` times a decode GEMV's candidates under PDL where the decode graph may use it, else plainly.

    The timer is a stand-in that favours one tile alone and another under PDL; the choice is made once per
    key, whichever launch mode the first caller is in, so the PDL and plain graphs share it.
    """
    from types import SimpleNamespace

    from deepgap.measure.quant import gemv, launch

    alone, overlapped = gemv.GemvTile(4, 4096), gemv.GemvTile(8, 512)
    timed = []

    def fake_ms(call, calls: int = 20) -> float:
        t = call.__defaults__[0]  # the candidate bound by `fastest`'s lambda
        timed.append(launch.pdl_on())
        return 1.0 if (t == overlapped) == launch.pdl_on() else 2.0

    monkeypatch.setattr(gemv, "_graph_ms", fake_ms)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cuda = SimpleNamespace(type="cuda")
    for capable, decode, best in ((True, True, overlapped), (False, True, alone), (True, False, alone)):
        monkeypatch.setattr(gemv, "_TUNED", {})
        monkeypatch.setattr(gemv, "timed_under_pdl", lambda device, c=capable: c)
        timed.clear()
        assert gemv.fastest(("k",), cuda, [alone, overlapped], lambda t: None, decode=decode) == best
        assert timed == [capable and decode] * 2  # not a decode GEMV (a fused Linear's tile): plainly
        with launch.pdl():  # a PDL caller later: the one choice, not timed again
            assert gemv.fastest(("k",), cuda, [alone, overlapped], lambda t: None, decode=decode) == best
        assert len(timed) == 2 and not launch.pdl_on()
