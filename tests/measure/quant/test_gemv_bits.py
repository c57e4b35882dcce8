"""The one-row GEMV's codes made fp32 by integer ops on their words (`quant.gemv_bits`, ``GemvTile.bits``).

Here: every fp8 and int8 code's fp32 is exact; a fused GEMV with a bits tile gives the plain tile's rows (the
products are the same, only the order of the sum differs); the tuner offers each one-step tile both ways; the
tiles compile for sm_90 without spills. On a GPU: the same at Llama-3.1-8B's shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from deepgap.measure.quant import gemv, gemv_bits  # noqa: E402
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv  # noqa: E402
from deepgap.measure.quant.launch import launcher  # noqa: E402
from deepgap.measure.quant.norm_handoff import HandOff, reference  # noqa: E402

CODES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


@triton.jit
def _codes_kernel(w_ptr, out_ptr, N: tl.constexpr, INT8: tl.constexpr):  # noqa: N803 - Triton's capitals
    """``out[4j + i]``: byte i of word j as `gemv_bits.code` makes it."""
    rw = tl.arange(0, N // 4)
    w = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + rw)
    for i in tl.static_range(4):
        tl.store(out_ptr + rw * 4 + i, gemv_bits.code(w, i, INT8))


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_every_code_is_exact(kind):
    """All 256 bytes: int8's value, or fp8's × 2⁻¹²⁰ (e4m3fn's two NaN bytes aside), subnormals included."""
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = raw.view(CODES[kind])
    out = torch.empty(256)
    launcher(_codes_kernel, codes.device)[(1,)](codes, out, N=256, INT8=kind == "int8")
    want = codes.float() if kind == "int8" else codes.float() * 2.0**-120
    ok = ~want.isnan()
    assert int(ok.sum()) == (256 if kind == "int8" else 254)
    assert torch.equal(out[ok], want[ok])


def _operands(k: int, n: int, kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "int8":
        codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    else:
        codes = (torch.randn(n, k, generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
    x = torch.randn(1, k, generator=g).bfloat16()
    return g, x, codes, torch.rand(n, generator=g) / 40


def _fusions(g, k: int, n: int) -> dict[str, Fusion]:
    gamma = (torch.rand(k, generator=g) + 0.5).bfloat16()
    rope = RopeWrite(torch.ones(1, 16).bfloat16(), torch.zeros(1, 16).bfloat16(), torch.tensor([3]),
                     torch.zeros(1, 1, 8, 16).bfloat16(), torch.zeros(1, 1, 8, 16).bfloat16(), 2)  # fmt: skip
    return {
        "plain": Fusion(),
        "norm+swiglu": Fusion(gamma, 1e-5, swiglu=True),
        "handed+swiglu": Fusion(
            eps=1e-5, swiglu=True, handed=reference(torch.randn(1, k).bfloat16(), gamma)[1]
        ),
        "residual+hand": Fusion(
            residual=torch.randn(1, n, generator=g).bfloat16(), hand=HandOff.to(gamma[:n])
        ),
        "rope": Fusion(rope=rope),
    }


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_a_bits_tile_gives_the_plain_tiles_rows(kind):
    """Every fold (the norm folded or handed over, SwiGLU, the residual and hand-off, RoPE): within a bf16 step."""
    k, n = 128, 64
    g, x, codes, scale = _operands(k, n, kind)
    for name, fusion in _fusions(g, k, n).items():
        for tile in (gemv.GemvTile(8, 64, 1, 4, 1, 0, 1), gemv.GemvTile(8, 128, 1, 8, 1, 0, 1)):
            plain = fused_gemv(x, codes, scale, fusion, tile).float()
            bits = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, bits=1)).float()
            torch.testing.assert_close(bits, plain, rtol=2**-7, atol=1e-3, msg=f"{name} {tile}")


def test_the_tuner_offers_each_one_step_tile_with_bits_too():
    one_step = [t for t in gemv.FUSED_TILES if t.reduce_each and not t.bits]
    assert {dataclasses.replace(t, bits=1) for t in one_step} == {t for t in gemv.FUSED_TILES if t.bits}
    assert "bits" in gemv.FUSED_TILES[-1].describe() and not any(t.bits for t in gemv.ROW_TILES)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_at_sm90_the_bits_tiles_compile_without_spills(kind):
    """gate_up's 4 × 4096 tile with the norm handed over and SwiGLU (168 registers with bits against 128 without,
    on Triton 3.6) and the writers' 8 × 2048 with the hand-off."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv" if kind == "fp8" else "*i8", scale_ptr="*fp32", gamma_ptr="*bf16",
               res_ptr="*bf16", out_ptr="*bf16", NO="i32", K="i32", eps="fp32", sums_ptr="*fp32")  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "scale_ptr", "NO")
    base = dict(
        NORM=False, RESIDUAL=False, ROPE=False, REDUCE=True, PDL=True, BITS=True, HANDED=True, PARTS=512
    )
    for const, warps in ((dict(BN=4, BK=4096, SWIGLU=True), 4), (dict(BN=8, BK=2048, SWIGLU=False), 8)):
        usage = ptxas_usage(compile_sm90(fused_row_kernel, sig, base | const, aligned, num_warps=warps))
        assert usage["spill_stores"] == 0 and usage["registers"] <= 168, (const, usage)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_bits_tiles_on_the_gpu_at_llama_8b_shapes(kind):
    """gate_up (SwiGLU, the norm handed over), down (residual and hand-off) and qkv (RoPE): bits against plain."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for k, n, tile in ((4096, 28672, gemv.GemvTile(4, 4096, 1, 4, 1, 0, 1)),
                       (14336, 4096, gemv.GemvTile(8, 2048, 1, 8, 1, 0, 1))):  # fmt: skip
        g, x, codes, scale = _operands(k, n, kind)
        for name, fusion in _fusions(g, k, n).items():
            if name == "rope" or (name == "residual+hand") != (k == 14336):
                continue
            fusion = Fusion(**{f.name: _cuda(getattr(fusion, f.name)) for f in dataclasses.fields(fusion)})
            args = (x.cuda(), codes.cuda(), scale.cuda(), fusion)
            plain = fused_gemv(*args, tile).float()
            bits = fused_gemv(*args, dataclasses.replace(tile, bits=1)).float()
            torch.testing.assert_close(bits, plain, rtol=2**-7, atol=1e-2, msg=f"{kind} {name}")


def _cuda(v):
    """A fusion field on the GPU: tensors moved, a hand-off's tensors too, the rest as it is."""
    if isinstance(v, torch.Tensor):
        return v.cuda()
    if isinstance(v, HandOff):
        return HandOff.to(v.gamma.cuda())
    return v
