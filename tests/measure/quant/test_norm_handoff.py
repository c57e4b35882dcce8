"""The RMSNorm handed from the GEMV that writes a row to the one that reads it (`quant.norm_handoff`).

A writer's extra stores are the row ⊙ γ and its square sums, as torch computes them from the row it returns;
a reader given them gives the rows the folded norm gives (both within a bf16 step of the fp32 reference);
operands that cannot hold are refused; at sm_90 the reader compiles to the plain GEMV's 128 registers where the
fold took 178 (the cost the hand-off removes), and the writer to the same as without it. On CPU tensors the
kernels run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant import norm_handoff
from deepgap.measure.quant.gemv import FUSED_TILES, GemvTile
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv, reference
from deepgap.measure.quant.norm_handoff import GROUP, HandOff

TILES = (GemvTile(16, 64, 1, 4, 3), GemvTile(8, 64, 1, 4, 1, 0, 1))  # a block, or each step reduced


def _operands(k: int, n: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g).bfloat16()
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-120, 120).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g) + 0.5) / 200
    return g, x, codes, scale


@pytest.mark.parametrize("tile", TILES, ids=str)
def test_a_writer_hands_over_the_row_it_returns(tile):
    """o's or down's residual add: the row as without the hand-off, and its ⊙ γ and square sums exactly."""
    g, x, codes, scale = _operands(192, 96)
    residual = torch.randn(1, 96, generator=g).bfloat16()
    hand = HandOff.to((torch.rand(96, generator=g) + 0.5).bfloat16())
    row = fused_gemv(x, codes, scale, Fusion(residual=residual, hand=hand), tile)
    assert torch.equal(row, fused_gemv(x, codes, scale, Fusion(residual=residual), tile))
    scaled, squares = norm_handoff.reference(row, hand.gamma)
    # the interpreter rounds fp32 to bf16 toward zero where torch rounds to nearest: one step apart at most
    torch.testing.assert_close(hand.scaled.float(), scaled.float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(hand.squares, squares, rtol=1e-6, atol=0)
    assert hand.squares.shape == (96 // GROUP.value,)


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_a_reader_of_the_handed_norm_gives_the_folded_norms_rows(swiglu):
    """gate_up's shape of call: the scaled row and the sums in, the same rows as with the norm folded."""
    g, row, codes, scale = _operands(256, 64)
    gamma = (torch.rand(256, generator=g) + 0.5).bfloat16()
    scaled, squares = norm_handoff.reference(row, gamma)
    handed = Fusion(eps=1e-5, swiglu=swiglu, handed=squares)
    folded = Fusion(gamma, 1e-5, swiglu=swiglu)
    want = reference(row, codes, scale, folded).float()
    assert torch.equal(reference(scaled, codes, scale, handed), reference(scaled, codes, scale, handed))
    for tile in TILES:
        got = fused_gemv(scaled, codes, scale, handed, tile).float()
        torch.testing.assert_close(
            got, reference(scaled, codes, scale, handed).float(), rtol=2**-7, atol=1e-2
        )
        torch.testing.assert_close(got, want, rtol=2**-6, atol=2e-2)  # + the scaled row's bf16 rounding


def test_the_qkv_reader_takes_the_handed_norm_with_rope():
    """qkv's call: RoPE and the cache write with the norm handed over, as with it folded."""
    nq, nkv, d, k = 2, 1, 16, 64
    g, row, codes, scale = _operands(k, (nq + 2 * nkv) * d, seed=9)
    gamma = (torch.rand(k, generator=g) + 0.5).bfloat16()
    scaled, squares = norm_handoff.reference(row, gamma)
    angles = (torch.rand(d, generator=g).bfloat16(), torch.rand(d, generator=g).bfloat16())
    pos = torch.tensor([3])
    caches = [[torch.zeros(1, nkv, 8, d).bfloat16() for _ in range(2)] for _ in range(2)]
    q_handed = fused_gemv(
        scaled, codes, scale, Fusion(eps=1e-5, rope=RopeWrite(*angles, pos, *caches[0], nq), handed=squares)
    )
    q_folded = fused_gemv(
        row, codes, scale, Fusion(gamma, 1e-5, rope=RopeWrite(*angles, pos, *caches[1], nq))
    )
    torch.testing.assert_close(q_handed.float(), q_folded.float(), rtol=2**-6, atol=2e-2)
    for a, b in zip(caches[0], caches[1], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-6, atol=2e-2)
        assert a[0, :, 3].abs().sum() > 0


def test_handoff_operands_are_checked():
    """A handed norm with γ too, a writer of pairs, buffers of the wrong width: one ValueError naming it."""
    g, x, codes, scale = _operands(64, 32)
    sums = torch.ones(64 // GROUP.value)
    with pytest.raises(ValueError, match="pass no gamma"):
        fused_gemv(x, codes, scale, Fusion(torch.ones(64).bfloat16(), 1e-5, handed=sums))
    with pytest.raises(ValueError, match="handed: fp32 of shape"):
        fused_gemv(x, codes, scale, Fusion(eps=1e-5, handed=torch.ones(3)))
    with pytest.raises(ValueError, match="a plain row's writer"):
        fused_gemv(x, codes, scale, Fusion(swiglu=True, hand=HandOff.to(torch.ones(16).bfloat16())))
    with pytest.raises(ValueError, match="hand: γ"):
        fused_gemv(x, codes, scale, Fusion(residual=x[:, :32], hand=HandOff.to(torch.ones(16).bfloat16())))


def test_a_writer_takes_bands_of_whole_groups():
    """The tuner's candidates for a hand-off: every band a multiple of GROUP; readers keep every tile."""
    hand = HandOff.to(torch.ones(32).bfloat16())
    tiles = Fusion(residual=torch.zeros(1, 32).bfloat16(), hand=hand).tiles()
    assert tiles and all(t.bn % GROUP.value == 0 for t in tiles)
    assert set(tiles) < set(FUSED_TILES)
    assert Fusion(eps=1e-5, swiglu=True, handed=torch.ones(4)).tiles() == FUSED_TILES


def _sm90_usage(const: dict, extra_sig: dict, warps: int) -> dict[str, int]:
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", cos_ptr="*bf16", sin_ptr="*bf16", pos_ptr="*i64",
               k_ptr="*bf16", v_ptr="*bf16", L="i32", NQ="i32", NKV="i32")  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "gamma_ptr", "scale_ptr", "NO", "k_ptr", "v_ptr")
    base = dict(NORM=False, SWIGLU=False, RESIDUAL=False, ROPE=False, REDUCE=True, PDL=True, PRE=1, D=128)
    compiled = compile_sm90(
        fused_row_kernel, sig | extra_sig, base | const, aligned, num_warps=warps, num_stages=1
    )
    return ptxas_usage(compiled)


@pytest.mark.parametrize("pairs", ["SWIGLU", "ROPE"])
def test_at_sm90_the_reader_keeps_the_plain_gemvs_registers(pairs):
    """gate_up's and qkv's best plain tile (4 × 4096, 4 warps) at 128 registers with the norm handed over; 168 or
    more with it folded (session 38: half the programs an SM)."""
    tile = dict(BN=4, BK=4096, **{pairs: True})
    plain = _sm90_usage(tile, {}, 4)
    handed = _sm90_usage(tile | dict(HANDED=True, PARTS=512), {"sums_ptr": "*fp32"}, 4)
    folded = _sm90_usage(tile | dict(NORM=True), {}, 4)
    assert handed["registers"] == plain["registers"] <= 128 < folded["registers"], (plain, handed, folded)
    assert handed["spill_stores"] == 0


def test_at_sm90_the_writers_hand_off_costs_no_registers():
    """o's and down's tile (8 × 2048, 8 warps, session 38's choice): the same registers with the extra stores."""
    tile = dict(BN=8, BK=2048, RESIDUAL=True)
    bufs = {"hand_gamma_ptr": "*bf16", "scaled_ptr": "*bf16", "hand_sums_ptr": "*fp32"}
    assert _sm90_usage(tile | dict(HAND=True), bufs, 8) == _sm90_usage(tile, {}, 8)


@pytest.mark.gpu
def test_on_the_gpu_the_chain_gives_the_folded_rows():
    """8B's o → gate_up at full width on the GPU (tuned tiles, PDL where the GPU has it): the hand-off's rows
    against the fold's, and the writer's sums against torch's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from deepgap.measure.quant import launch

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(1, 4096, device=dev, generator=g).bfloat16()
    o = (torch.randn(4096, 4096, device=dev, generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
    gu = (torch.randn(28672, 4096, device=dev, generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
    o_s = torch.rand(4096, device=dev, generator=g) / 2000
    gu_s = torch.rand(28672, device=dev, generator=g) / 2000
    h = torch.randn(1, 4096, device=dev, generator=g).bfloat16()
    gamma = (torch.rand(4096, device=dev, generator=g) + 0.5).bfloat16()
    hand = HandOff.to(gamma)
    pdl = launch.pdl() if torch.cuda.get_device_capability() >= (9, 0) else torch.no_grad()
    with pdl:
        x1 = fused_gemv(a, o, o_s, Fusion(residual=h, hand=hand))
        got = fused_gemv(hand.scaled, gu, gu_s, Fusion(eps=1e-5, swiglu=True, handed=hand.squares))
        want = fused_gemv(x1, gu, gu_s, Fusion(gamma, 1e-5, swiglu=True))
    torch.cuda.synchronize()
    scaled, squares = norm_handoff.reference(x1, gamma)
    assert torch.equal(hand.scaled, scaled)
    torch.testing.assert_close(hand.squares, squares, rtol=1e-5, atol=0)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2e-2)
