"""The register-capped one-step tiles for the GEMVs that fold the RMSNorm (`gemv.NORM_TILES`, session 38).

The tuner's candidates where the norm is folded (`Fusion.tiles`) include them, and only there; a capped tile
gives the same rows on the CPU (the cap is a GPU launch option only); a decode row names its cap; at sm_90 the
168 cap compiles without spills for gate_up's and qkv's folds and holds the registers to the cap.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant import gemv
from deepgap.measure.quant.gemv_fused import FUSED_TILES, Fusion, fused_gemv, reference


def test_the_capped_tiles_are_candidates_only_where_the_norm_is_folded():
    """Without the norm the cap changes no code (128 registers or fewer): the tuner would time a tile twice."""
    gamma = torch.ones(16).bfloat16()
    assert Fusion(gamma, 1e-5, swiglu=True).tiles() == FUSED_TILES + gemv.NORM_TILES
    assert (
        Fusion(residual=torch.zeros(1, 16).bfloat16()).tiles() == FUSED_TILES == Fusion(swiglu=True).tiles()
    )
    assert all(t.maxnreg and t.bk == 4096 and t.reduce_each for t in gemv.NORM_TILES)
    assert not any(t.maxnreg for t in gemv.ROW_TILES + gemv.DOT_TILES)  # the plain GEMV's keep the compiler's


@pytest.mark.parametrize("tile", gemv.NORM_TILES, ids=str)
def test_a_capped_tile_gives_the_references_rows_on_the_cpu(tile):
    """K 256 in one step (the tile fitted), the norm and SwiGLU folded: within a bf16 step of the fp32 reference."""
    g = torch.Generator().manual_seed(1)
    k, n = 256, 64
    x = torch.randn(1, k, generator=g).bfloat16()
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    scale = torch.rand(n, generator=g) / 40
    fusion = Fusion((torch.rand(k, generator=g) + 0.5).bfloat16(), 1e-5, swiglu=True)
    got, want = fused_gemv(x, codes, scale, fusion, tile).float(), reference(x, codes, scale, fusion).float()
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-2)


def test_a_decode_row_names_the_cap(monkeypatch):
    monkeypatch.setattr(
        gemv, "_TUNED", {("fused", (True, True, False, False), 4096, 28672, "cuda"): gemv.NORM_TILES[0]}
    )
    assert gemv.chosen().endswith("fused norm+swiglu 4096x28672: 4x4096 s1 w4 st1 reduce-each maxnreg 168")


@pytest.mark.parametrize("fold", ["swiglu", "rope"])
def test_the_168_cap_compiles_for_hopper_without_spills(fold):
    """gate_up's fold (norm, SwiGLU) and qkv's (norm, RoPE) at 4 × 4096, PDL on: 168 registers at most, none
    spilled (178 without the cap: 2 programs of 4 warps an SM, 3 with it)."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    t = gemv.NORM_TILES[0]
    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", cos_ptr="*bf16", sin_ptr="*bf16", pos_ptr="*i64",
               k_ptr="*bf16", v_ptr="*bf16", L="i32", NQ="i32", NKV="i32")  # fmt: skip
    const = dict(NORM=True, SWIGLU=fold == "swiglu", RESIDUAL=False, BN=t.bn, BK=t.bk, REDUCE=True, PDL=True, PRE=1,
                 ROPE=fold == "rope", D=128)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "gamma_ptr", "scale_ptr", "NO", "k_ptr", "v_ptr")
    compiled = compile_sm90(
        fused_row_kernel, sig, const, aligned, num_warps=4, num_stages=1, maxnreg=t.maxnreg
    )
    usage = ptxas_usage(compiled)
    assert usage["registers"] <= t.maxnreg and usage["spill_stores"] == 0, usage
