"""Each kernel's epilogue constants before PDL's wait (``DEEPGAP_PDL_CONSTANTS=ahead``, `launch.constants_ahead`).

A convolution's α and β, a decode GEMV's per-channel scales and the next norm's γ are written by no kernel, so
under PDL they can load before the wait for the previous kernel instead of after the K loop, where each is one
memory round trip on the kernel's critical path. The numbers are the same numbers: here, in Triton's interpreter,
both orders give the same bits (the convolution whole and split, with and without its early residual; every fused
GEMV fold); at sm_90 the loads sit before ``griddepcontrol.wait`` and the epilogue loads nothing more; on a GPU,
both orders give the same bits in a CUDA graph under PDL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from test_gemv_in_thread import _fusions  # noqa: E402
from test_quant_split_k import BASE, CASES, _run  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import gemv, launch  # noqa: E402
from deepgap.measure.quant.gemv_fused import fused_gemv  # noqa: E402


@contextlib.contextmanager
def constants(value: str):
    """Inside: launches under `launch.pdl` with ``DEEPGAP_PDL_CONSTANTS`` = ``value``."""
    with mock.patch.dict(os.environ, {"DEEPGAP_PDL_CONSTANTS": value}), launch.pdl():
        yield


def test_the_switch_acts_under_pdl_only_and_a_bad_value_stops():
    with mock.patch.dict(os.environ, {"DEEPGAP_PDL_CONSTANTS": "ahead"}):
        assert not launch.constants_ahead()  # no PDL wait to load ahead of
    with constants("ahead"):
        assert launch.constants_ahead()
    with constants("after"):
        assert not launch.constants_ahead()
    with pytest.raises(UsageError, match="DEEPGAP_PDL_CONSTANTS"), constants("before"):
        launch.constants_ahead()


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=["k3res-split6", "k1res-split4"])
@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
def test_a_convolution_gives_the_same_bits_with_its_constants_ahead(qfmt, case):
    """Whole and split tiles, the residual loaded early or not: α and β before the wait change no bit."""
    conv, split, _, _ = _run(qfmt, case)
    for cfg in (BASE, dataclasses.replace(BASE, early_res=True), split):
        with constants("after"):
            after = conv(cfg)
        with constants("ahead"):
            assert torch.equal(conv(cfg), after), cfg.label


def test_every_fused_gemv_fold_gives_the_same_bits_with_its_constants_ahead():
    """Scales (and SwiGLU's, RoPE's second), γ for the hand-off and the residual: the same row, cache rows and sums."""
    g = torch.Generator().manual_seed(6)
    k, n = 128, 64
    codes = (torch.randn(n, k, generator=g) * 40).clamp(-100, 100).to(torch.float8_e4m3fn)
    scale, x = torch.rand(n, generator=g) / 40, torch.randn(1, k, generator=g).bfloat16()
    tile = gemv.GemvTile(8, 32, 1, 4, 1, 0, gemv.IN_THREAD.value)
    for name, fusion in _fusions(g, k, n).items():
        outs = {}
        for value in ("after", "ahead"):
            with constants(value):
                row = fused_gemv(x, codes, scale, fusion, tile)
            written = [t.clone() for t in _written(fusion)]
            outs[value] = (row, written)
        assert torch.equal(outs["after"][0], outs["ahead"][0]), name
        assert all(map(torch.equal, outs["after"][1], outs["ahead"][1])), name


def _written(fusion) -> list[torch.Tensor]:
    """What a fold writes beside its row: the hand-off's scaled row and sums, RoPE's cache rows."""
    out = []
    if fusion.hand is not None:
        out += [fusion.hand.scaled, fusion.hand.squares]
    if fusion.rope is not None:
        out += [fusion.rope.k, fusion.rope.v]
    return out


def _conv_ptx(ahead: bool) -> str:
    from sm90 import compile_sm90

    from deepgap.measure.quant import kernels

    sig = dict(x_ptr="*fp8e4nv", w_ptr="*fp8e4nv", out_ptr="*fp8e4nv", alpha_ptr="*fp32", beta_ptr="*fp32",
               res_ptr="*fp8e4nv", gamma="fp32", M="i32", N="i32", C="i32", H="i32", W="i32", OH="i32",
               OW="i32", ws_ptr="*fp32", cnt_ptr="*i32")  # fmt: skip
    const = dict(KH=1, KW=1, STRIDE=1, PAD=0, RELU=True, HAS_RES=False, OUT_KIND=kernels.OUT_KIND["fp8"],
                 ACC_INT=False, BM=64, BN=64, BK=64, GROUP_M=8, PDL=2, AHEAD=ahead)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "alpha_ptr", "beta_ptr", "N", "C")
    return compile_sm90(kernels.conv_gemm_kernel, sig, const, aligned, num_warps=4, num_stages=4).asm["ptx"]


def test_at_sm90_a_convolutions_epilogue_loads_nothing_once_its_constants_are_ahead():
    """batch 1's 64 × 64 tile of a 1×1 layer without a residual: α and β load before the wait, none after the loop."""
    for ahead in (False, True):
        ptx = _conv_ptx(ahead)
        wait, mma = ptx.index("griddepcontrol.wait"), ptx.rindex("wgmma.wait_group")
        before, after = ptx[:wait].count("ld.global"), ptx[mma:].count("ld.global")
        assert (before > 0 and after == 0) if ahead else (before == 0 and after > 0), (ahead, before, after)


def test_at_sm90_the_o_gemvs_tail_loads_nothing_once_its_constants_are_ahead():
    """o's 8 × 2048 tile (the residual, the hand-off): after its first store nothing loads (γ came before the wait,
    the residual right after it); the old order loads γ there. No spill, registers as before."""
    from sm90 import compile_sm90, ptxas_usage

    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32", hand_gamma_ptr="*bf16", scaled_ptr="*bf16",
               hand_sums_ptr="*fp32")  # fmt: skip
    const = dict(NORM=False, SWIGLU=False, RESIDUAL=True, ROPE=False, REDUCE=2, PDL=2, PRE=1, BN=8, BK=2048,
                 HAND=True)  # fmt: skip
    usage = {}
    for ahead in (False, True):
        compiled = compile_sm90(fused_row_kernel, sig, const | {"AHEAD": ahead}, ("x_ptr", "w_ptr", "out_ptr", "K"),
                                num_warps=8)  # fmt: skip
        ptx = compiled.asm["ptx"]
        tail = ptx[ptx.index("st.global") :].count("ld.global")
        assert (tail == 0) if ahead else (tail > 0), (ahead, tail)
        usage[ahead] = ptxas_usage(compiled)
    assert usage[True]["spill_stores"] == 0 and usage[True]["registers"] <= usage[False]["registers"], usage


@pytest.mark.gpu
@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
def test_on_a_gpu_the_constants_ahead_give_the_same_bits_in_a_pdl_graph(qfmt):
    """A batch-1 3×3 layer (whole and split-K) and o's and gate_up's 8B GEMVs, each in a CUDA graph right after a
    kernel that writes its input, under PDL: the constants before the wait give the old order's bits."""
    from deepgap.measure.quant import kernels
    from deepgap.measure.quant.gemv_fused import Fusion
    from deepgap.measure.quant.norm_handoff import HandOff, reference
    from deepgap.measure.quant.tiles import TileConfig

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    dt = torch.int8 if qfmt == "int8" else torch.float8_e4m3fn
    src = (torch.randn(14 * 14, 256, device=dev, generator=g) * 30).clamp(-100, 100).to(dt)
    w = (torch.randn(256, 9 * 256, device=dev, generator=g) * 30).clamp(-100, 100).to(dt)
    alpha, beta = torch.rand(256, device=dev, generator=g) / 1e3, torch.randn(256, device=dev, generator=g)
    gamma = (torch.rand(4096, device=dev, generator=g) + 0.5).bfloat16()
    codes = (torch.randn(4096, 4096, device=dev, generator=g) * 40).clamp(-100, 100).to(dt)
    scale, row = torch.rand(4096, device=dev, generator=g) / 40, torch.randn(1, 4096, device=dev).bfloat16()
    handed = reference(torch.randn(1, 4096, device=dev).bfloat16(), gamma)[1]
    x, xr = torch.empty_like(src), torch.empty_like(row)
    o = Fusion(residual=torch.randn(1, 4096, device=dev).bfloat16(), hand=HandOff.to(gamma))
    gate_up = Fusion(eps=1e-5, swiglu=True, handed=handed)

    def launches():
        x.copy_(src)
        xr.copy_(row)
        tiles = (TileConfig(64, 64, 128, num_stages=4), TileConfig(64, 64, 128, num_stages=4, split_k=6))
        outs = [kernels.conv_gemm(x, (1, 14, 14), w, 3, 1, 1, alpha, beta, qfmt, True, t) for t in tiles]
        outs.append(fused_gemv(xr, codes, scale, o, gemv.IN_THREAD_TILES[0]))
        outs.append(fused_gemv(xr, codes, scale, gate_up, gemv.IN_THREAD_TILES[1]))
        return outs

    got = {}
    for value in ("after", "ahead"):
        with constants(value):  # compiles the kernels and makes split-K's scratch, which a capture may not
            launches()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with constants(value), torch.cuda.graph(graph):
            outs = launches()
        x.zero_()
        xr.zero_()
        graph.replay()
        torch.cuda.synchronize()
        got[value] = [t.clone() for t in outs]
    assert all(map(torch.equal, got["after"], got["ahead"]))
