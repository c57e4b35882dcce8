"""The one-row GEMV's products summed within each thread every K step, across threads once (``reduce_each`` 2).

Here: the fused GEMV with such a tile gives the reduce-each tile's rows for every fold, and the plain row
kernel too; two tiles are named and offered to the tuner; at sm_90 the K loop of
down's tile has no warp shuffle left (22 with the per-step reduction), which is what it is for (`gemv.IN_THREAD`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

import pytest
import torch

pytest.importorskip("triton")

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
def test_in_thread_sums_give_the_reduce_each_rows(codes_dtype):
    """K = 128 in four steps of 32: every fold within a bf16 step of the reduce-each tile (the sum's order differs)."""
    g = torch.Generator().manual_seed(4)
    k, n = 128, 64
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-100, 100).to(codes_dtype)
    scale, x = torch.rand(n, generator=g) / 40, torch.randn(1, k, generator=g).bfloat16()
    tile = gemv.GemvTile(8, 32, 1, 4, 1, 0, 1)
    for name, fusion in _fusions(g, k, n).items():
        each = fused_gemv(x, codes, scale, fusion, tile).float()
        in_thread = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, reduce_each=2)).float()
        torch.testing.assert_close(in_thread, each, rtol=2**-7, atol=1e-3, msg=name)
    plain = gemv.fp8_gemv(x, codes, scale, None, tile).float()
    torch.testing.assert_close(gemv.fp8_gemv(x, codes, scale, None, dataclasses.replace(tile, reduce_each=2)).float(),
                               plain, rtol=2**-7, atol=1e-3)  # fmt: skip


def test_the_in_thread_tiles_are_named_and_offered():
    """Among the fused GEMVs' candidates since a GPU timed them (`gemv.IN_THREAD_TILES`, session 41)."""
    tiles = gemv.IN_THREAD_TILES
    assert [(t.bn, t.bk, t.num_warps) for t in tiles] == [(8, 2048, 8), (4, 2048, 4)]
    assert gemv.FUSED_TILES[-2:] == tiles and Fusion().tiles() == gemv.FUSED_TILES
    # a hand-off's writer keeps only bands of whole groups
    writer = Fusion(residual=torch.zeros(1, 16).bfloat16(), hand=HandOff.to(torch.ones(16).bfloat16()))
    assert [t for t in writer.tiles() if t.reduce_each == gemv.IN_THREAD.value] == [tiles[0]]
    assert tiles[0].describe() == "8x2048 s1 w8 st1 reduce-in-thread" and tiles[0].describe(
        short=True
    ).endswith(" rt")


def _loop_body(ptx: str) -> str:
    """The PTX between the K loop's header label and its backward branch."""
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"bra\s+(\$L__BB0_\d+);", line)
        if m:
            head = next(j for j, h in enumerate(lines) if h.startswith(m.group(1) + ":"))
            if head < i:
                return "\n".join(lines[head:i])
    raise AssertionError("no loop in the PTX")


@pytest.mark.parametrize("reduce_each", [1, 2])
def test_at_sm90_the_in_thread_loop_has_no_shuffle(reduce_each):
    """down's 8 × 2048 tile (8 warps) with the residual and the hand-off: shuffles in the loop only per-step."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", hand_gamma_ptr="*bf16", scaled_ptr="*bf16",
               hand_sums_ptr="*fp32")  # fmt: skip
    const = dict(NORM=False, SWIGLU=False, RESIDUAL=True, ROPE=False, REDUCE=reduce_each, PDL=True, PRE=1, BN=8,
                 BK=2048, HAND=True)  # fmt: skip
    compiled = compile_sm90(fused_row_kernel, sig, const, ("x_ptr", "w_ptr", "out_ptr", "K"), num_warps=8)
    shuffles = _loop_body(compiled.asm["ptx"]).count("shfl.sync")
    assert (shuffles == 0) if reduce_each == 2 else shuffles > 0
    usage = ptxas_usage(compiled)
    assert usage["spill_stores"] == 0 and usage["registers"] <= 128, usage


@pytest.mark.gpu
@pytest.mark.parametrize("codes_dtype", [torch.float8_e4m3fn, torch.int8])
def test_on_a_gpu_the_in_thread_tiles_give_the_reduce_each_rows_at_the_8b_shapes(codes_dtype):
    """down (14336 → 4096, the residual and the hand-off's writer) and gate_up (4096 → 2 × 14336, SwiGLU with the
    handed norm) on the GPU: each in-thread tile within a bf16 step of its reduce-each twin."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    gamma = (torch.rand(4096, device=dev, generator=g) + 0.5).bfloat16()
    shapes = {
        "down": (14336, 4096, Fusion(residual=torch.randn(1, 4096, device=dev).bfloat16(), hand=HandOff.to(gamma))),
        "gate_up": (4096, 28672, Fusion(eps=1e-5, swiglu=True,
                                        handed=reference(torch.randn(1, 4096, device=dev).bfloat16(), gamma)[1])),
    }  # fmt: skip
    for name, (k, n, fusion) in shapes.items():
        lim = 127 if codes_dtype == torch.int8 else 440
        codes = (torch.randn(n, k, device=dev, generator=g) * 40).clamp(-lim, lim).to(codes_dtype)
        scale, x = torch.rand(n, device=dev, generator=g) / 40, torch.randn(1, k, device=dev).bfloat16()
        for tile in (
            t for t in fusion.tiles() if t in gemv.IN_THREAD_TILES
        ):  # a hand-off writes whole groups
            each = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, reduce_each=1)).float()
            got = fused_gemv(x, codes, scale, fusion, tile).float()
            torch.testing.assert_close(got, each, rtol=2**-7, atol=2e-2, msg=f"{name} {tile.describe()}")


def test_steps_loaded_ahead_of_the_wait_give_the_same_bits():
    """``ahead``: under `launch.pdl` the first one or two of four K steps' weights load before PDL's wait, peeled from
    the loop (on the CPU without the wait), or none (0): the same products in the same order, so the same bits."""
    from deepgap.measure.quant import launch

    g = torch.Generator().manual_seed(5)
    k, n = 128, 64
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-100, 100).to(torch.float8_e4m3fn)
    scale, x = torch.rand(n, generator=g) / 40, torch.randn(1, k, generator=g).bfloat16()
    tile = gemv.GemvTile(8, 32, 1, 4, 1, 0, gemv.IN_THREAD.value)
    assert (
        dataclasses.replace(tile, ahead=9).fit(k, n).ahead == gemv.MAX_AHEAD == 2
        and tile.fit(k, n).ahead == 1
    )
    assert dataclasses.replace(tile, ahead=2).fit(32, n).ahead == 1  # one step: nothing more to load
    assert dataclasses.replace(tile, ahead=0).fit(k, n).ahead == 0
    assert dataclasses.replace(tile, ahead=2).describe(short=True).endswith(" rt a2")
    for name, fusion in _fusions(g, k, n).items():
        plain = fused_gemv(x, codes, scale, fusion, tile)  # outside `launch.pdl`: no step peeled
        for ahead in (0, 1, 2):
            with launch.pdl():
                got = fused_gemv(x, codes, scale, fusion, dataclasses.replace(tile, ahead=ahead))
            assert torch.equal(got, plain), (name, ahead)


def test_at_sm90_two_steps_ahead_fit_the_registers_of_one():
    """o's 8 × 2048 tile (8 warps, the residual and the hand-off) with both its K steps' weights in flight before
    PDL's wait: twice one step's loads before it, no spills, 80 registers a thread (64 with one step: ptxas at sm_90,
    Triton 3.6), so three programs an SM where one step fits four; with none ahead, no load before the wait."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", hand_gamma_ptr="*bf16", scaled_ptr="*bf16",
               hand_sums_ptr="*fp32")  # fmt: skip
    const = dict(NORM=False, SWIGLU=False, RESIDUAL=True, ROPE=False, REDUCE=2, PDL=True, BN=8, BK=2048,
                 HAND=True)  # fmt: skip
    before = {}
    for pre in (0, 1, 2):
        compiled = compile_sm90(
            fused_row_kernel, sig, const | {"PRE": pre}, ("x_ptr", "w_ptr", "out_ptr", "K"), num_warps=8
        )
        ptx = compiled.asm["ptx"]
        before[pre] = ptx[: ptx.index("griddepcontrol.wait")].count("ld.global")
        usage = ptxas_usage(compiled)
        assert usage["spill_stores"] == 0 and usage["registers"] <= 128, usage
    assert before[2] == 2 * before[1] > 0 == before[0], before


@pytest.mark.gpu
@pytest.mark.parametrize("trigger", ["early", "late"])
def test_on_a_gpu_steps_ahead_of_the_wait_give_the_same_bits_at_the_8b_shapes(trigger, monkeypatch):
    """qkv (RoPE into the cache), o, gate_up and down at the 8B shapes, and the head's plain row GEMV, launched in a
    CUDA graph after a kernel that writes x: without PDL, and with it, none, one and two steps ahead, the trigger
    before or after the wait (``DEEPGAP_PDL_TRIGGER``): the same bits."""
    from deepgap.measure.quant import launch

    monkeypatch.setenv("DEEPGAP_PDL_TRIGGER", trigger)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(9)
    gamma = (torch.rand(4096, device=dev, generator=g) + 0.5).bfloat16()
    handed = reference(torch.randn(1, 4096, device=dev).bfloat16(), gamma)[1]
    cache = [torch.zeros(1, 8, 16, 128, device=dev).bfloat16() for _ in range(2)]
    angles = [torch.rand(1, 128, device=dev, generator=g).bfloat16() for _ in range(2)]
    rope = RopeWrite(*angles, torch.tensor([5], device=dev), *cache, 32)
    shapes = {
        "qkv": (4096, 6144, Fusion(eps=1e-5, rope=rope, handed=handed), 8),
        "o": (
            4096,
            4096,
            Fusion(residual=torch.randn(1, 4096, device=dev).bfloat16(), hand=HandOff.to(gamma)),
            8,
        ),
        "gate_up": (4096, 28672, Fusion(eps=1e-5, swiglu=True, handed=handed), 4),
        "down": (
            14336,
            4096,
            Fusion(residual=torch.randn(1, 4096, device=dev).bfloat16(), hand=HandOff.to(gamma)),
            8,
        ),
        "head": (4096, 16384, None, 4),
    }
    for name, (k, n, fusion, bn) in shapes.items():
        codes = (torch.randn(n, k, device=dev, generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
        scale, src = torch.rand(n, device=dev, generator=g) / 40, torch.randn(1, k, device=dev).bfloat16()
        x = torch.empty_like(src)
        outs = []
        for pdl, ahead in [(False, 1), (True, 0), (True, 1), (True, 2)][: 2 if fusion is None else 4]:
            tile = gemv.GemvTile(bn, 2048, 1, bn, 1, 0, gemv.IN_THREAD.value, ahead=ahead)
            graph = torch.cuda.CUDAGraph()
            with launch.pdl() if pdl else contextlib.nullcontext(), torch.cuda.graph(graph):
                x.copy_(src)  # x is written right before the GEMV reads it
                if fusion is None:  # the plain row kernel (the head's): its first step before the wait
                    out = gemv.fp8_gemv(x, codes, scale, None, gemv.GemvTile(bn, 1024, 1, 4, 1, 0, 1))
                else:
                    out = fused_gemv(x, codes, scale, fusion, tile)
            x.zero_()
            graph.replay()
            torch.cuda.synchronize()
            outs.append(out.clone())
        assert all(torch.equal(outs[0], o) for o in outs[1:]), name
