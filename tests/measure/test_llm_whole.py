"""Every layer of a batch-1 decode step in one persistent kernel (`llm_whole`, `llm_whole_plan`) on the CPU.

In Triton's interpreter one program takes every item (a barrier of one passes at once). Each phase's output is
held to its own fp32 reference (`gemv_fused.reference`, `llm_attention.reference`) on the kernel's own inputs
to it, then llama-tiny's static steps with ``DEEPGAP_DECODE_WHOLE=on`` against the per-layer fused path. The
GPU tests replay the compiled, graphed step in each mode, hold one layer at the 8B shape to the same references,
and see two programs an SM refused.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.core.errors import UsageError
from deepgap.measure import llm_attention, llm_whole_plan
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, reference


def _tiny(precision: str = "fp8", whole: str = "on", monkeypatch=None):
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_WHOLE", whole)
    return LINEAR_SWAPS[precision](build_llama("llama-tiny", seed=0, device="cpu"))


def _close(got: torch.Tensor, want: torch.Tensor, steps: float = 1.0) -> bool:
    """Within ``steps`` bf16 steps of ``want`` (relative 2⁻⁷, at least 2⁻⁷ · 10⁻²)."""
    ulp = want.float().abs().clamp(min=1e-2) * 2**-7 * steps
    return bool(((got.float() - want.float()).abs() <= ulp).all())


def _check_phases(
    ops, nq: int, nkv: int, d: int, eps: float, tiles, device: str = "cpu", length: int = 16
) -> None:
    """One layer (``ops`` in the table's order) through the kernel, each phase held to its own reference.

    q and the cache rows (qkv, RoPE), the attention's row, the hidden row after the attention, the MLP's row and
    the output row, each within a bf16 step of the fp32 arithmetic of the per-layer kernels on what the kernel
    fed that phase. The hidden row after the attention is seen from a run whose down weights are zero (the
    output is then that row). The cache holds earlier positions, so the attention walks more than one row.
    """
    g = torch.Generator(device=device).manual_seed(5)
    pos, hidden = length - 7, ops[8].numel()
    x = torch.randn(1, hidden, generator=g, device=device).bfloat16()
    k0, v0 = (torch.randn(1, nkv, length, d, generator=g, device=device).bfloat16() for _ in range(2))
    angles = torch.rand(d, generator=g, device=device) * 6
    cos, sin = torch.cos(angles).bfloat16(), torch.sin(angles).bfloat16()
    at = torch.tensor([pos], device=device)
    qkv, qkv_s, o, o_s, gu, gu_s, dn, dn_s, n1, n2 = ops
    no_down = [*ops[:6], torch.zeros_like(dn.view(torch.int8)).view(dn.dtype), *ops[7:]]
    rows = {}
    for name, operands in (("h1", no_down), ("out", ops)):
        k, v = k0.clone(), v0.clone()
        rows[name] = llm_whole_plan.run(x, cos, sin, at, operands, [k], [v], nq, eps, tiles)
    # the kernel's own rows: the last run's (this test's scratch alone, `_SCRATCH` emptied by the caller)
    s = next(iter(llm_whole_plan._SCRATCH.values()))  # noqa: SLF001
    q, a, mid = s.rows[: nq * d], s.rows[nq * d : 2 * nq * d], s.rows[2 * nq * d :]
    kw, vw = k0.clone(), v0.clone()
    q_want = reference(x, qkv, qkv_s, Fusion(n1, eps, rope=RopeWrite(cos, sin, at, kw, vw, nq)))
    assert _close(q[None], q_want) and _close(k, kw) and _close(v, vw)
    assert k[0, :, pos].abs().sum() > 0 and torch.equal(k[0, :, :pos], k0[0, :, :pos])  # only row pos written
    a_want = llm_attention.reference(q.view(1, nq, 1, d), k, v, pos).reshape(1, -1)
    if device == "cpu":
        assert _close(a[None], a_want)
    else:  # the softmax's weights meet V in bf16 (the tensor cores' dot): the split kernel's GPU tolerance
        torch.testing.assert_close(a[None].float(), a_want.float(), rtol=2e-2, atol=2e-2)
    h1 = rows["h1"]
    assert _close(h1, reference(a[None], o, o_s, Fusion(residual=x)))
    assert _close(mid[None], reference(h1, gu, gu_s, Fusion(n2, eps, swiglu=True)))
    assert _close(rows["out"], reference(mid[None], dn, dn_s, Fusion(residual=h1)))
    assert s.counts.tolist() == [0] * (nkv + 3)  # merge counts, barrier, exit count, error flag: at rest


@pytest.mark.parametrize(
    ("precision", "whole", "bk"),
    [("fp8", "on", 0), ("int8", "on", 0), ("fp8", "ahead", 32), ("fp8", "on", 16)],
)
def test_each_phase_matches_its_reference_on_its_own_inputs(monkeypatch, precision, whole, bk):
    """llama-tiny's first layer through the kernel (`_check_phases`). Its K (64 and 128) is one step of the
    default tiles (x read and normalised once a phase); ``bk`` 16 or 32 walks K in 2–8 steps, with each step's
    weights loaded a step early (``ahead``) or not."""
    import dataclasses

    model = _tiny(precision, whole, monkeypatch=monkeypatch)
    monkeypatch.setattr(llm_whole_plan, "_SCRATCH", {})
    step, shape = model.whole_step, model.shape
    tiles = step.tiles
    if bk:
        tiles = dataclasses.replace(tiles, qkv=(4, bk), o=(4, bk), gate_up=(4, bk), down=(4, bk))
    layer = len(step.operands) // shape.layers  # the first layer alone: its rows stay in the scratch
    _check_phases(step.operands[:layer], shape.heads, shape.kv_heads, shape.head_dim, step.eps, tiles)


def _synthetic(hidden: int, ff: int, nq: int, nkv: int, d: int, precision: str, device: str) -> list:
    """One layer's operands in the table's order at a real shape: 8-bit codes, scales that keep rows O(1)."""
    g = torch.Generator(device=device).manual_seed(7)
    ops = []
    for n, k in (((nq + 2 * nkv) * d, hidden), (hidden, nq * d), (2 * ff, hidden), (hidden, ff)):
        raw = torch.randn(n, k, generator=g, device=device) * 40
        codes = raw.clamp(-120, 120).to(torch.float8_e4m3fn if precision == "fp8" else torch.int8)
        ops += [codes, (torch.rand(n, generator=g, device=device) + 0.5) / (40 * k**0.5)]
    return ops + [(torch.rand(hidden, generator=g, device=device) + 0.5).bfloat16() for _ in range(2)]


def _prefilled(monkeypatch):
    """llama-tiny in fp8 twice, with the whole step and without, both prefilled with 6 seeded tokens; the calls
    of `llm_whole_plan.run` counted. Returns (whole, plain, the next token, calls)."""
    from graphed_tiny import prefill_both

    whole = _tiny(monkeypatch=monkeypatch)
    plain = _tiny(whole="off", monkeypatch=monkeypatch)
    assert whole.whole_step is not None and plain.whole_step is None
    calls = []
    run = llm_whole_plan.run
    monkeypatch.setattr(llm_whole_plan, "run", lambda *a: calls.append(1) or run(*a))
    return whole, plain, prefill_both(whole, plain), calls


def test_static_steps_give_the_fused_layers_logits(monkeypatch):
    """llama-tiny in fp8: an eager step, then static steps at device positions 7 and 8 with every layer in the
    one kernel, against the same weights layer by layer; the caches' new rows agree too (the sums' order
    differs: the per-layer tiles on the CPU are the untimed first candidates)."""
    from deepgap.measure.llm_steps import make_step

    whole, plain, tok, calls = _prefilled(monkeypatch)
    with torch.inference_mode():
        for kind, position in (("eager", 6), ("static", 7), ("static", 8)):
            a, b = (make_step(m, kind)(tok, position).float() for m in (whole, plain))
            assert float((a - b).norm() / b.norm()) < 0.02, position
            assert int(a.argmax()) == int(b.argmax())
            for got, want in zip(whole.cache.k + whole.cache.v, plain.cache.k + plain.cache.v, strict=True):
                got, want = got[0, :, position].float(), want[0, :, position].float()
                assert float((got - want).norm() / want.norm()) < 0.02, position
            tok = b.argmax(-1, keepdim=True)
    assert len(calls) == 2  # the static steps only: the eager one (an int position) keeps the layers


def test_a_compiled_step_keeps_the_op(monkeypatch):
    """torch.compile (Inductor, here on the CPU) traces the step through the custom op, whose K and V lists it
    mutates, and gives the per-layer path's logits: what the GPU's compiled graph step is built from."""
    from deepgap.measure.llm_steps import make_step

    whole, plain, tok, calls = _prefilled(monkeypatch)
    with torch.inference_mode():
        a = make_step(whole, "compile", "default")(tok, 6).float()
        b = make_step(plain, "static")(tok, 6).float()
    assert float((a - b).norm() / b.norm()) < 0.02 and calls == [1]
    assert whole.cache.k[1][0, :, 6].abs().sum() > 0  # the compiled step wrote the last layer's row


def test_a_flagged_step_is_refused_not_stored(monkeypatch):
    """A wait that gave up sets the error flag (the programs were not all resident): the decode measurement
    then fails with the reason (`refuse_if_flagged`) instead of storing tokens and times from wrong rows."""
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.protocol import StatusError

    monkeypatch.setattr(llm_whole_plan, "_SCRATCH", {})
    whole, _, tok, _ = _prefilled(monkeypatch)
    with torch.inference_mode():
        make_step(whole, "static")(tok, 6)
    llm_whole_plan.refuse_if_flagged(whole)  # a clean launch: nothing to say
    assert not llm_whole_plan.flagged(whole.cache.k)
    with torch.inference_mode():  # the scratch was made in the step's inference mode
        next(iter(llm_whole_plan._SCRATCH.values())).counts[-1] = 1  # noqa: SLF001 - as a wait that gave up
    assert llm_whole_plan.flagged(whole.cache.k)
    with pytest.raises(StatusError, match="barrier gave up waiting") as e:
        llm_whole_plan.refuse_if_flagged(whole)
    assert e.value.status.value == "error"
    llm_whole_plan.reset_counters()  # what whole_decode_phases.py does before its next variant
    assert not llm_whole_plan.flagged(whole.cache.k)


def test_the_switch_and_who_takes_it(monkeypatch):
    monkeypatch.delenv("DEEPGAP_DECODE_WHOLE", raising=False)
    assert llm_whole_plan.mode() == "off"  # not yet timed on a GPU
    monkeypatch.setenv("DEEPGAP_DECODE_WHOLE", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_WHOLE"):
        llm_whole_plan.mode()
    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "qkv")  # the attention in the qkv GEMV: not with it
    assert _tiny(monkeypatch=monkeypatch).whole_step is None
    monkeypatch.delenv("DEEPGAP_DECODE_ATTENTION")
    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "mix")  # the kernel folds RoPE into qkv: not without it
    assert _tiny(monkeypatch=monkeypatch).whole_step is None
    monkeypatch.delenv("DEEPGAP_DECODE_ROPE")
    led = _tiny(whole="l2", monkeypatch=monkeypatch).whole_step.tiles
    assert led.lead_kb == llm_whole_plan.LEAD_KB  # the L2 lead (on a GPU)
    model = _tiny(monkeypatch=monkeypatch)
    assert not model.whole_step.tiles.lead_kb
    x = torch.zeros(1, 1, model.shape.hidden, dtype=torch.bfloat16)
    model.setup_cache(1, 8)
    assert model.whole_step.takes(x, model.cache, torch.tensor([3]))
    assert not model.whole_step.takes(x, model.cache, 3)  # eager: an int position
    assert not model.whole_step.takes(x.expand(2, 1, -1), model.cache, torch.tensor([3]))
    model.setup_cache(2, 8)
    assert not model.whole_step.takes(x, model.cache, torch.tensor([3]))  # a cache of two sequences


def test_a_batch_1_row_says_its_layers_ran_in_one_kernel(monkeypatch):
    """`llm_attention.describe` at batch 1 with a whole step, and `show`'s engine; the plan at a larger batch."""
    from types import SimpleNamespace

    from deepgap.commands.decode_view import _engine

    monkeypatch.delenv("DEEPGAP_DECODE_SPLIT_KV", raising=False)
    model = SimpleNamespace(
        static_attention=llm_attention.decode_attention,
        shape=SimpleNamespace(kv_heads=8),
        embed_tokens=SimpleNamespace(weight=torch.zeros(1)),
        layers=[],
        whole_step=object(),
    )
    said = llm_attention.describe(model, 1, 256)
    assert said == llm_attention.WHOLE_NOTE
    shown = _engine(
        {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": "on", "decode_attention": said}
    )
    assert shown == "quant (cuda-graph step, PDL, split KV, every layer in one kernel)"
    assert llm_attention.describe(model, 4, 256) == "split 4×64 (auto)"  # more sequences: layer by layer


def test_a_cache_at_a_freed_ones_address_gets_its_own_table(monkeypatch):
    """The table and scratch are kept per (pointers, cache shape): a shorter cache at the same address (the
    allocator reuses freed blocks) is split for its own length, not the old one's."""
    monkeypatch.setattr(llm_whole_plan, "_SCRATCH", {})
    long = torch.zeros(1, 2, 256, 16, dtype=torch.bfloat16)
    short = long.view(-1)[: 2 * 64 * 16].view(1, 2, 64, 16)  # the same address, a quarter the positions
    assert short.data_ptr() == long.data_ptr()
    ops = [torch.zeros(4)] * 10
    a = llm_whole_plan._scratch(ops, [long], [long], 4, 128)  # noqa: SLF001
    b = llm_whole_plan._scratch(ops, [short], [short], 4, 128)  # noqa: SLF001
    assert a is not b and a.split.chunks * a.split.chunk >= 256 and b.split.chunks * b.split.chunk < 256


def test_programs_an_sm_that_fit_at_once():
    """The residency check's arithmetic: the default kernel (sm_90: 128 registers, 22.5 KB, 16 warps) is one an
    SM; at 8 warps and 254 registers one too; small ones are bounded by the SM's 64 warps or its shared memory."""
    assert llm_whole_plan.per_sm_fit(128, 22528, 16) == 1
    assert llm_whole_plan.per_sm_fit(254, 22528, 8) == 1
    assert llm_whole_plan.per_sm_fit(64, 22528, 8) == 4
    assert llm_whole_plan.per_sm_fit(32, 100 << 10, 4) == 2
    assert llm_whole_plan.per_sm_fit(200, 1024, 16) == 0  # does not fit at all: refused before it launches


def test_a_row_names_the_one_kernel_tiles(monkeypatch):
    """`WholeStep.describe`: what a decode row's ``decode.tiles`` begins with where the step ran in one kernel."""
    said = _tiny("fp8", "ahead", monkeypatch=monkeypatch).whole_step.describe()
    assert said == "one-kernel step: qkv 4x64, o 4x64, gate_up 4x64, down 4x128, 16 warps x 1 an SM ahead; "
    said = _tiny("fp8", "l2", monkeypatch=monkeypatch).whole_step.describe()
    assert said.endswith("16 warps x 1 an SM L2 lead 64 KB; ")


def test_the_residency_check_compiles_what_the_launch_compiles(monkeypatch):
    """`_resident` on a GPU, its GPU calls stood in for: it compiles the launch's own specialization (with PDL's
    keywords inside `launch.pdl`, as the launcher adds them), loads it (Triton sets the registers only then),
    checks once per (device, grid, tiles), then launches; a grid that cannot all be resident never launches."""
    from types import SimpleNamespace

    from deepgap.measure import llm_whole
    from deepgap.measure.quant import launch

    seen, launched = [], []

    class Compiled:
        n_regs, metadata = 128, SimpleNamespace(shared=22528)

        def _init_handles(self):
            seen.append("loaded")

    monkeypatch.setattr(
        llm_whole.whole_decode_kernel, "warmup", lambda *a, grid, **kw: seen.append(kw) or Compiled()
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(llm_whole_plan._resident, "checked", set())  # noqa: SLF001
    ok = llm_whole_plan._resident(lambda *a, **kw: launched.append(kw), 132, llm_whole_plan.Tiles())  # noqa: SLF001
    with launch.pdl():
        ok(1, D=16, num_warps=16)
        ok(1, D=16, num_warps=16)
    assert seen == [{"D": 16, "num_warps": 16, "PDL": True, "launch_pdl": True}, "loaded"]  # checked once
    assert launched == [{"D": 16, "num_warps": 16}] * 2
    two = llm_whole_plan.Tiles(per_sm=2)
    with pytest.raises(ValueError, match="2 programs an SM .* 128 registers .* fit 1; ask for fewer"):
        llm_whole_plan._resident(lambda *a, **kw: launched.append(kw), 264, two)(1, num_warps=16)  # noqa: SLF001
    assert len(launched) == 2


def test_tiles_fit_the_shape_and_round_trip():
    t = llm_whole_plan.Tiles().fitted(hidden=4096, ff=14336, heads=32, kv_heads=8, head_dim=128)
    assert t.qkv == (4, 4096) and t.down == (4, 2048) and t.warps == 16 and not t.ahead
    ahead = llm_whole_plan.tiles_for("ahead")
    assert ahead.ahead and ahead.o == (4, 2048) and not llm_whole_plan.tiles_for("on").lead_kb
    tiny = llm_whole_plan.Tiles(qkv=(16, 4096)).fitted(hidden=64, ff=128, heads=4, kv_heads=2, head_dim=16)
    assert tiny.qkv == (8, 64) and tiny.down == (4, 128)  # a qkv band within half a head
    assert llm_whole_plan.Tiles.from_list(tiny.as_list()) == tiny
    led = llm_whole_plan.tiles_for("l2")
    assert led.lead_kb == 64 and llm_whole_plan.Tiles.from_list(led.as_list()) == led


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["on", "l2", "ahead"])
def test_graphed_whole_step_gives_the_fused_layers_logits(monkeypatch, mode):
    """The compiled, graphed fp8 step with every layer in one kernel against the per-layer path, 4 steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from graphed_tiny import fp8_graph_logits

    logits = {}
    for whole in ("off", mode):
        monkeypatch.setenv("DEEPGAP_DECODE_WHOLE", whole)
        logits[whole], model = fp8_graph_logits(logits.get("off"))
        assert (model.whole_step is not None) == (whole != "off")
    assert not llm_whole_plan.flagged(model.cache.k)
    for i in range(4):
        a, b = logits[mode][i], logits["off"][i]
        assert float((a - b).norm() / b.norm()) < 0.03, i


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("precision", "mode"), [("fp8", "on"), ("int8", "on"), ("fp8", "ahead"), ("fp8", "l2")]
)
def test_each_phase_at_the_8b_shape_on_a_gpu(monkeypatch, precision, mode):
    """One layer at Llama-3.1-8B's shape (the real tiles: 4 × 4096 bands, 16 warps, one program an SM) against
    each phase's reference, over a 2048-position cache."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(llm_whole_plan, "_SCRATCH", {})
    hidden, ff, nq, nkv, d = 4096, 14336, 32, 8, 128
    tiles = llm_whole_plan.tiles_for(mode).fitted(hidden, ff, nq, nkv, d)
    ops = _synthetic(hidden, ff, nq, nkv, d, precision, "cuda")
    _check_phases(ops, nq, nkv, d, 1e-5, tiles, "cuda", length=2048)


@pytest.mark.gpu
def test_two_programs_an_sm_are_refused_before_they_launch(monkeypatch):
    """At 16 warps and 128 registers one program fills an SM: two would never all be resident, and the barrier
    would wait for programs that cannot start. The launch is refused with the reason instead."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import dataclasses

    monkeypatch.setattr(llm_whole_plan, "_SCRATCH", {})
    tiles = dataclasses.replace(llm_whole_plan.Tiles(), per_sm=2).fitted(4096, 14336, 32, 8, 128)
    ops = _synthetic(4096, 14336, 32, 8, 128, "fp8", "cuda")
    cache = [torch.zeros(1, 8, 64, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    x = torch.zeros(1, 4096, dtype=torch.bfloat16, device="cuda")
    angle, pos = (
        torch.ones(128, dtype=torch.bfloat16, device="cuda"),
        torch.zeros(1, dtype=torch.int64, device="cuda"),
    )
    with pytest.raises(ValueError, match="2 programs an SM .* fit 1"):
        llm_whole_plan.run(x, angle, angle, pos, ops, cache[:1], cache[1:], 32, 1e-5, tiles)
