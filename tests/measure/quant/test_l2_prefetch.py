"""The decode GEMVs' L2 prefetch under PDL (`quant.l2_prefetch`, ``DEEPGAP_DECODE_PREFETCH``) on the CPU.

Here: the switch, how many programs prefetch, the row's note, and the sm_90 code the fused row kernel compiles
to (ahead of time, no GPU): one bulk prefetch per band, before the wait. The GPU side (the same logits with it
and without, in the PDL graph) is `test_prefetch_keeps_the_pdl_graphs_logits` below.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import gemv, gemv_fused, l2_prefetch  # noqa: E402

CUDA = torch.device("cuda")


def test_mode_is_off_unless_set_and_refuses_other_values(monkeypatch):
    monkeypatch.delenv("DEEPGAP_DECODE_PREFETCH", raising=False)
    assert l2_prefetch.mode() == "off" and l2_prefetch.describe() == ""
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "l2")
    assert l2_prefetch.mode() == "l2" and l2_prefetch.describe().startswith("L2 prefetch of the first 24 MB")
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
    monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", "off")
    assert l2_prefetch.programs(CUDA, True, o_band, 512) == 0


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


@pytest.mark.gpu
def test_prefetch_keeps_the_pdl_graphs_logits(monkeypatch):
    """The fp8 decode graph at batch 1 with PDL: the same logits, bit for bit, with the L2 prefetch and without."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (bulk prefetch, programmatic dependent launch)")
    from graphed_tiny import fp8_graph_logits

    monkeypatch.setenv("DEEPGAP_DECODE_PDL", "on")
    logits = {}
    for mode in ("off", "l2"):
        monkeypatch.setenv("DEEPGAP_DECODE_PREFETCH", mode)
        logits[mode], _ = fp8_graph_logits()
    assert torch.equal(logits["l2"], logits["off"])
