"""The fused row GEMV's K loop with the next step's weights loaded ahead (`quant.gemv_steps.ahead`).

Here: a tile with ``prefetch`` sums the same steps in the same order as without, so every fold gives the same bits;
the tuner offers the two such tiles, the attention-in-qkv kernels (which run the row kernel without it) do not;
at sm_90 the first step's loads stay before PDL's wait and nothing spills.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from deepgap.measure import llm_qkv_attention  # noqa: E402
from deepgap.measure.quant import gemv  # noqa: E402
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv  # noqa: E402
from deepgap.measure.quant.norm_handoff import HandOff, reference  # noqa: E402


def _fusions(g, k: int, n: int) -> dict[str, Fusion]:
    gamma = (torch.rand(k, generator=g) + 0.5).bfloat16()
    cache = [torch.zeros(1, 1, 8, 16).bfloat16() for _ in range(2)]
    rope = RopeWrite(torch.rand(1, 16, generator=g).bfloat16(), torch.rand(1, 16, generator=g).bfloat16(),
                     torch.tensor([3]), *cache, 2)  # fmt: skip
    return {
        "plain": Fusion(),
        "norm+swiglu": Fusion(gamma, 1e-5, swiglu=True),
        "handed+swiglu": Fusion(
            eps=1e-5, swiglu=True, handed=reference(torch.randn(1, k).bfloat16(), gamma)[1]
        ),
        "residual+hand": Fusion(
            residual=torch.randn(1, n, generator=g).bfloat16(), hand=HandOff.to(gamma[:n])
        ),
        "norm+rope": Fusion(gamma, 1e-5, rope=rope),
    }


@pytest.mark.parametrize("codes_dtype", [torch.float8_e4m3fn, torch.int8])
def test_the_next_step_ahead_gives_the_same_bits_for_every_fold(codes_dtype):
    """K = 128 in four steps of 32: the loop with the next step ahead against the plain loop, bit for bit."""
    g = torch.Generator().manual_seed(3)
    k, n = 128, 64
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-100, 100).to(codes_dtype)
    scale, x = torch.rand(n, generator=g) / 40, torch.randn(1, k, generator=g).bfloat16()
    tile = gemv.GemvTile(8, 32, 1, 4, 1, 0, 1)
    for name, fusion in _fusions(g, k, n).items():
        plain = fused_gemv(x, codes, scale, fusion, tile)
        ahead = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, prefetch=1))
        assert torch.equal(ahead, plain), name


def test_the_tuner_offers_two_tiles_with_the_next_step_ahead():
    ahead = [t for t in gemv.FUSED_TILES if t.prefetch]
    assert [(t.bn, t.bk, t.num_warps, t.reduce_each) for t in ahead] == [(8, 2048, 8, 1), (4, 2048, 4, 1)]
    rope = Fusion(
        rope=RopeWrite(*(torch.zeros(1, 16),) * 2, torch.zeros(1), *(torch.zeros(1, 1, 8, 16),) * 2, 2)
    )
    assert not any(
        t.prefetch for t in llm_qkv_attention.tiles(rope)
    )  # their kernels run the row kernel without


def test_at_sm90_the_first_step_is_read_before_the_wait_and_nothing_spills():
    """down's tile with the residual add and the hand-off (K = 14336: seven steps of 2048, 8 warps)."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", hand_gamma_ptr="*bf16", scaled_ptr="*bf16",
               hand_sums_ptr="*fp32")  # fmt: skip
    const = dict(NORM=False, SWIGLU=False, RESIDUAL=True, ROPE=False, REDUCE=True, PDL=True, BN=8, BK=2048,
                 HAND=True, AHEAD=True)  # fmt: skip
    compiled = compile_sm90(fused_row_kernel, sig, const, ("x_ptr", "w_ptr", "out_ptr", "K"), num_warps=8)
    ptx = compiled.asm["ptx"]
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")  # the first step's weights before it
    usage = ptxas_usage(compiled)
    assert usage["spill_stores"] == 0 and usage["registers"] <= 128, usage


@pytest.mark.gpu
@pytest.mark.parametrize("codes_dtype", [torch.float8_e4m3fn, torch.int8])
def test_the_next_step_ahead_on_the_gpu_at_llama_8b_shapes(codes_dtype):
    """down (K = 14336 in seven steps, residual and hand-off) and gate_up (two steps of 2048, the norm handed over,
    SwiGLU): bit for bit against the plain loop, under PDL where the GPU has it (the first step before the wait)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from deepgap.measure.quant import launch

    g = torch.Generator().manual_seed(5)
    pdl = launch.pdl if torch.cuda.get_device_capability() >= (9, 0) else contextlib.nullcontext
    for k, n, make in (
        (14336, 4096, lambda gamma: Fusion(residual=torch.randn(1, 4096, generator=g).bfloat16().cuda(),
                                           hand=HandOff.to(gamma[:4096]))),
        (4096, 28672, lambda gamma: Fusion(eps=1e-5, swiglu=True,
                                           handed=reference(torch.randn(1, 4096).bfloat16().cuda(), gamma)[1])),
    ):  # fmt: skip
        codes = (torch.randn(n, k, generator=g) * 40).clamp(-100, 100).to(codes_dtype).cuda()
        scale, x = (torch.rand(n, generator=g) / 40).cuda(), torch.randn(1, k, generator=g).bfloat16().cuda()
        fusion = make((torch.rand(k, generator=g) + 0.5).bfloat16().cuda())
        tile = gemv.GemvTile(8, 2048, 1, 8, 1, 0, 1)
        with pdl():
            plain = fused_gemv(x, codes, scale, fusion, tile)
            ahead = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, prefetch=1))
        torch.cuda.synchronize()
        assert torch.equal(ahead, plain), (k, n)
