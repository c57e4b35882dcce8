"""The decode GEMVs' L2 prefetch (`quant.l2_prefetch`, ``DEEPGAP_DECODE_PREFETCH``) on the CPU.

Here: the switch, how many programs prefetch, the row's note, and the sm_90 code the fused row kernel compiles
to (ahead of time, no GPU): one bulk prefetch per band, before the wait. ``attention``: the attention kernel's
shares of o's weights, asked after the wait, and the fused layer handing them over. The GPU side (the same
logits with it and without, in the PDL graph) is `test_prefetch_keeps_the_pdl_graphs_logits` below.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure import llm_attention  # noqa: E402
from deepgap.measure.quant import gemv, gemv_fused, l2_prefetch  # noqa: E402

CUDA = torch.device("cuda")


def test_mode_is_off_unless_set_and_refuses_other_values(monkeypatch):
    monkeypatch.delenv("DEEPGAP_DECODE_PREFETCH", raising=False)
    assert l2_prefetch.mode() == "off" and l2_prefetch.describe() == ""
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "l2")
    assert l2_prefetch.mode() == "l2" and l2_prefetch.describe().startswith("L2 prefetch of the first 24 MB")
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "attention")
    assert l2_prefetch.describe() == "o's weights asked of L2 during the attention; "
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "always")
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_PREFETCH"):
        l2_prefetch.mode()


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_leading_programs_prefetch_up_to_the_cap_under_pdl_on_hopper(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "l2")
    hopper = capability >= (9, 0)
    o_band, down_band = 8 * 4096, 8 * 14336  # bytes: the o and down projections' 8-row fp8 bands
    assert l2_prefetch.programs(CUDA, True, o_band, 512) == (512 if hopper else 0)  # all 16 MB
    assert l2_prefetch.programs(CUDA, True, down_band, 512) == ((24 << 20) // down_band if hopper else 0)
    assert l2_prefetch.programs(CUDA, False, o_band, 512) == 0  # no wait to overlap
    assert l2_prefetch.programs(torch.device("cpu"), True, o_band, 512) == 0
    for other in ("off", "attention"):  # the GEMVs' own prefetch is l2's only
        monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", other)
        assert l2_prefetch.programs(CUDA, True, o_band, 512) == 0


@pytest.mark.parametrize(
    ("nbytes", "programs"), [(4096 * 4096, 64), (2048 * 2048, 64), (16 * 7, 3), (4096, 1)]
)
def test_the_programs_shares_are_16_byte_multiples_that_cover_the_region(nbytes, programs):
    share = l2_prefetch.share(nbytes, programs)
    assert share % 16 == 0 and share * programs >= nbytes > share * (programs - 1) - 16
    covered = [range(i * share, min((i + 1) * share, nbytes)) for i in range(programs)]
    assert sum(len(r) for r in covered) == nbytes  # each byte once, none past the region


def _attention_ptx(ahead: bool) -> str:
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*fp32", "m_ptr": "*fp32",
           "l_ptr": "*fp32", "pos_ptr": "*i64", "L": "i32", "scale": "fp32", "NKV": "i32", "POS_STRIDE": "i32",
           "CHUNK": "i32", "NCH": "i32"}  # fmt: skip
    if ahead:
        sig |= {"ahead_ptr": "*u8", "AHEAD_BYTES": "i32", "AHEAD_SHARE": "i32"}
    const = dict(G=4, D=128, BL=32, DOT_F32=False, SPLIT=True, PDL=True, AHEAD=ahead)
    aligned = ("q_ptr", "k_ptr", "v_ptr", "out_ptr") + ("ahead_ptr", "AHEAD_SHARE") * ahead
    return compile_sm90(llm_attention.decode_attention_kernel, sig, const, aligned, num_warps=4).asm["ptx"]


def test_the_attention_asks_l2_for_the_next_weights_after_its_wait():
    """sm_90 code: with ``AHEAD`` the bulk prefetch is in a loop after ``griddepcontrol.wait``; without, none."""
    ptx = _attention_ptx(True)
    wait = ptx.index("griddepcontrol.wait")
    issued = [i for i in range(len(ptx)) if ptx.startswith("cp.async.bulk.prefetch.L2.global", i)]
    assert len(issued) == 1 and issued[0] > wait  # one instruction, in the loop over the program's pieces
    assert "cp.async.bulk.prefetch" not in _attention_ptx(False)


def test_the_attention_op_takes_the_weights_as_a_hint_only(monkeypatch):
    """On the CPU (no bulk prefetch) ``ahead`` changes nothing; the kernel's arguments carry the shares."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(*s, generator=g).to(torch.bfloat16)
        for s in ((1, 4, 1, 16), (1, 2, 40, 16), (1, 2, 40, 16))
    )
    pos = torch.tensor([17])
    w = torch.zeros(64, 64, dtype=torch.int8)
    assert torch.equal(
        llm_attention.decode_attention(q, k, v, pos, w), llm_attention.decode_attention(q, k, v, pos)
    )
    args = llm_attention._ahead(w, 8)
    assert args["AHEAD"] and args["AHEAD_BYTES"] == 4096 and args["AHEAD_SHARE"] == 512
    assert llm_attention._ahead(None, 8) == {}


def test_the_rows_tiles_note_says_prefetch_first(monkeypatch):
    monkeypatch.setattr(gemv, "_TUNED", {(1, 4096, 1024, "cuda:0"): gemv.GemvTile(4, 4096, 1, 8, 1, 0, 1)})
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "l2")
    assert gemv.chosen() == (
        "L2 prefetch of the first 24 MB of each GEMV's weights under PDL; "
        "1 row(s) 4096x1024: 4x4096 s1 w8 st1 reduce-each"
    )


def _fused_ptx(prefetch: bool, rope: bool = False) -> str:
    sig = {
        n: t
        for n, t in zip(
            ("x_ptr", "w_ptr", "scale_ptr", "gamma_ptr", "res_ptr", "out_ptr"),
            ("*bf16", "*fp8e4nv", "*fp32", "*fp32", "*bf16", "*bf16"),
            strict=True,
        )
    }
    sig |= {"NO": "i32", "K": "i32", "eps": "fp32", "PF_PROGRAMS": "i32"}
    const = dict(NORM=True, SWIGLU=not rope, RESIDUAL=False, BN=8, BK=512, REDUCE=False, PDL=True,
                 ROPE=rope, D=128, PREFETCH=prefetch)  # fmt: skip
    # the RoPE operands are typed either way (a None argument does not compile ahead of time)
    sig |= {
        n: t
        for n, t in zip(
            ("cos_ptr", "sin_ptr", "pos_ptr", "k_ptr", "v_ptr"),
            ("*bf16", "*bf16", "*i64", "*bf16", "*bf16"),
            strict=True,
        )
    }
    sig |= {"L": "i32", "NQ": "i32", "NKV": "i32"}
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K")
    return compile_sm90(gemv_fused.fused_row_kernel, sig, const, aligned, num_warps=4).asm["ptx"]


@pytest.mark.parametrize("rope", [False, True])
def test_each_band_is_one_bulk_prefetch_issued_before_the_wait(rope):
    """sm_90 code: a pair's two bands are two ``cp.async.bulk.prefetch.L2``, both before ``griddepcontrol.wait``."""
    ptx = _fused_ptx(True, rope)
    wait = ptx.index("griddepcontrol.wait")
    issued = [i for i in range(len(ptx)) if ptx.startswith("cp.async.bulk.prefetch.L2.global", i)]
    assert len(issued) == 2 and max(issued) < wait
    assert "%tid.x; setp.eq.u32" in ptx  # one thread per program asks
    assert "cp.async.bulk.prefetch" not in _fused_ptx(False, rope)


def _tiny_static_step(monkeypatch, mode: str, seen: list) -> torch.Tensor:
    """llama-tiny fp8's static step at position 16 with ``DEEPGAP_DECODE_PREFETCH=mode``, in the interpreter; the
    attention kernel (plugged in as on a GPU) records what each layer hands it as ``ahead``."""
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", mode)
    model = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    with torch.inference_mode():
        model.setup_cache(1, 40)
        tok = model.prefill(prompts(model.shape.vocab, 1, 16, 0)).argmax(-1, keepdim=True)
        # make_step plugs the attention (none on the CPU), so the kernel is plugged after it
        step = make_step(model, "static")
        model.static_attention = lambda q, k, v, pos, ahead=None: (
            seen.append(ahead) or llm_attention.decode_attention(q, k, v, pos, ahead)
        )
        return step(tok, 16).float()


def test_the_fused_layer_hands_os_weights_to_the_attention(monkeypatch):
    """``attention``: each layer's attention gets its o projection's codes (square, fp8), and the step the same
    logits as without (the interpreter has no bulk prefetch: the hint is dropped, the arithmetic is one)."""
    seen_off, seen_on = [], []
    off = _tiny_static_step(monkeypatch, "off", seen_off)
    on = _tiny_static_step(monkeypatch, "attention", seen_on)
    assert torch.equal(on, off)
    assert seen_off and all(a is None for a in seen_off)
    assert len(seen_on) == len(seen_off) and all(
        a is not None and a.dtype == torch.float8_e4m3fn for a in seen_on
    )
    width = seen_on[0].shape[1]
    assert all(a.shape == (width, width) and a.is_contiguous() for a in seen_on)


@pytest.mark.gpu
def test_prefetch_keeps_the_pdl_graphs_logits(monkeypatch):
    """The fp8 decode graph at batch 1 with PDL: the same logits, bit for bit, with the L2 prefetch and without."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (bulk prefetch, programmatic dependent launch)")
    from graphed_tiny import fp8_graph_logits

    monkeypatch.setenv("DEEPGAP_DECODE_PDL", "on")
    logits = {}
    for mode in ("off", "l2", "attention"):
        monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", mode)
        logits[mode], _ = fp8_graph_logits()
    assert torch.equal(logits["l2"], logits["off"])
    assert torch.equal(logits["attention"], logits["off"])
