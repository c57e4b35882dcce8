"""The TMA-fed 3×3 convolution (quant.conv_tma) on the CPU, and when the tuner offers it.

The Triton interpreter runs the kernel as written, its 4-D descriptors included: a window that starts above
or left of the image (negative coordinates) or runs past its edge arrives as zeros, which must be exactly the
convolution's padding. int8 equals the exact reference bit for bit; fp8 but for the interpreter's known
e4m3 misroundings (`fp8_codes.same_codes`). tests/measure/quant/test_quant_conv_tma_gpu.py checks it against
`conv_gemm_kernel` on a Hopper GPU.
"""

from __future__ import annotations

import functools

import pytest
import torch

triton = pytest.importorskip("triton")

from fp8_codes import same_codes  # noqa: E402
from sm90 import compile_sm90, ptxas_usage  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import conv_tma, layers, tuning  # noqa: E402
from deepgap.measure.quant.fold import ConvNode  # noqa: E402
from deepgap.measure.quant.tiles import TileConfig  # noqa: E402


def _case(qfmt, nb, h, w, c, n, res, seed=0, stride=1):
    g = torch.Generator().manual_seed(seed)
    node = ConvNode("c", "a", "b", torch.randn(n, c, 3, 3, generator=g) * 0.1, torch.randn(n, generator=g),
                    stride, 1, True, "r" if res else None)  # fmt: skip
    lay = layers.make_qconv(node, qfmt, "q", dict.fromkeys("abr", qfmt), {"a": 0.05, "b": 0.08, "r": 0.03})
    x = layers.quantize_act(torch.randn(nb * h * w, c, generator=g) * 40, qfmt)
    out_px = nb * (h // stride) * (w // stride)
    r = layers.quantize_act(torch.randn(out_px, n, generator=g) * 40, qfmt) if res else None
    return lay, x, r, layers.conv_reference(lay, x, (nb, h, w), r)


def _run(lay, x, r, nhw, cfg):
    s = lay.node.stride
    return conv_tma.conv_gemm(
        x, nhw, lay.w_q, 3, s, 1, lay.alpha, lay.beta, lay.out_fmt, True, cfg, r, lay.gamma
    )


CASES = [  # (images, H, W, C_in, C_out, stride), tile
    ((2, 7, 6, 32, 32, 1), TileConfig(32, 32, 32, 8, 4, 2, tma_conv=8)),  # 4×8 blocks, partial in both axes
    (
        (1, 5, 9, 64, 64, 1),
        TileConfig(32, 32, 32, 8, 4, 2, tma_conv=16),
    ),  # 2×16: two channel chunks, N in two
    ((2, 8, 6, 64, 32, 2), TileConfig(16, 32, 32, 8, 4, 2, tma_conv=4)),  # stride 2: a 4×3 output, 4×4 blocks
]


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("res", [False, True], ids=["", "res"])
@pytest.mark.parametrize("shape,cfg", CASES, ids=["7x6", "5x9-chunks", "8x6-stride2"])
def test_the_kernel_equals_the_exact_reference_padding_included(qfmt, res, shape, cfg):
    nb, h, w, c, n, stride = shape
    lay, x, r, ref = _case(qfmt, nb, h, w, c, n, res, stride=stride)
    same_codes(_run(lay, x, r, (nb, h, w), cfg), ref, qfmt, min_equal=0.9)


def test_the_launch_refuses_other_kernel_shapes_and_tiles():
    lay, x, r, _ = _case("int8", 1, 4, 4, 32, 32, False)
    cfg = TileConfig(32, 32, 32, 8, 4, 2, tma_conv=8)
    with pytest.raises(ValueError, match="stride 1, or 2 on even sizes"):
        conv_tma.conv_gemm(x, (1, 4, 4), lay.w_q, 3, 3, 1, lay.alpha, lay.beta, "int8", True, cfg)
    odd, xo, _, _ = _case("int8", 1, 5, 4, 32, 32, False, stride=2)
    with pytest.raises(ValueError, match="5×4"):
        _run(odd, xo, None, (1, 5, 4), cfg)
    with pytest.raises(ValueError, match="must divide BM"):
        _run(lay, x, r, (1, 4, 4), TileConfig(32, 32, 32, 8, 4, 2, tma_conv=12))
    with pytest.raises(ValueError, match="at most 2 stages"):  # 3 and 4 raced on an H100 (MAX_STAGES)
        _run(lay, x, r, (1, 4, 4), TileConfig(32, 32, 32, 8, 4, 3, tma_conv=8))


def test_offered_on_hopper_where_it_won_and_explored_everywhere(monkeypatch):
    node = ConvNode("c", "a", "b", torch.zeros(128, 128, 3, 3), torch.zeros(128), 1, 1, True)
    strided = ConvNode("c", "a", "b", torch.zeros(128, 128, 3, 3), torch.zeros(128), 2, 1, True)
    monkeypatch.delenv(conv_tma.ENV, raising=False)  # off by default since session 55 (the module says why)
    assert not conv_tma.offered() and conv_tma.tma_configs(node, 28, 28, (9, 0)) == []
    monkeypatch.setenv(conv_tma.ENV, "on")  # the one tile that won, 17-32 wide outputs
    offered = {h: [c.label for c in conv_tma.tma_configs(node, h, h, (9, 0))] for h in (56, 28, 14, 7)}
    assert offered == {56: [], 28: ["128x128x128 w8 s2 tma-conv4x32"], 14: [], 7: []}
    assert [c.tma_conv for c in conv_tma.tma_configs(strided, 56, 56, (9, 0))] == [32]  # 28 wide out
    explored = {
        h: {c.tma_conv for c in conv_tma.tma_configs(node, h, h, (9, 0), explore=True)}
        for h in (56, 28, 14, 7)
    }
    assert explored == {56: {64, 32}, 28: {32, 16}, 14: {16, 8}, 7: {8}}  # as wide as the image, and half
    assert {c.tma_conv for c in conv_tma.tma_configs(strided, 56, 56, (9, 0), explore=True)} == {32, 16}
    assert conv_tma.tma_configs(node, 28, 28, (8, 0)) == []  # no TMA below Hopper
    assert conv_tma.tma_configs(strided, 7, 7, (9, 0), explore=True) == []  # stride 2 needs even sizes
    monkeypatch.setenv(conv_tma.ENV, "off")
    assert conv_tma.tma_configs(node, 28, 28, (9, 0)) == []
    monkeypatch.setenv(conv_tma.ENV, "yes")
    with pytest.raises(UsageError, match=conv_tma.ENV):
        conv_tma.tma_configs(node, 56, 56, (9, 0))


def test_switched_on_the_tuner_checks_and_times_it_and_the_network_runs_it(r50_net, monkeypatch):
    from deepgap.measure.quant.prepare import QuantOptions

    opts = QuantOptions(timing_reps=1, per_layer_choice=False, force_backend="triton")
    monkeypatch.setenv(conv_tma.ENV, "off")
    assert not any(c and c.tma_conv for _, c in tuning.candidates(r50_net, "layer2.1.conv2", 2, opts, True))
    monkeypatch.setenv(conv_tma.ENV, "on")
    explore = functools.partial(conv_tma.tma_configs, explore=True)  # at 32², no layer is 17-32 wide
    monkeypatch.setattr(conv_tma, "tma_configs", explore)
    cands = [c for _, c in tuning.candidates(r50_net, "layer1.0.conv2", 2, opts, True) if c and c.tma_conv]
    assert [c.label for c in cands] == ["128x64x64 w4 s2 tma-conv16x8", "128x64x64 w4 s1 tma-conv16x8"]
    t = tuning.time_layer(r50_net, "layer1.0.conv2", 2, opts, True)
    assert t.q_error is None  # every candidate, the TMA tiles included, passed the exact self-check
    r50_net.configs["layer1.0.conv2"] = cands[0]
    x = tuning.rand_act(2 * 64, 64, "int8", "cpu")
    got = r50_net.run_conv("layer1.0.conv2", x, 2, None)  # network.run_conv dispatches to quant.conv_tma
    assert torch.equal(got, layers.conv_reference(r50_net.convs["layer1.0.conv2"], x, (2, 8, 8), None))


@pytest.mark.parametrize(
    "qfmt,mma,stride,dims",
    [("int8", "s32.s8.s8", 1, "4d"), ("fp8", "f32.e4m3.e4m3", 1, "4d"), ("fp8", "f32.e4m3.e4m3", 2, "5d")],
)
def test_it_compiles_for_hopper_to_tma_copies_and_8bit_wgmma_without_spills(qfmt, mma, stride, dims):
    """Stride 1 reads 4-D windows; stride 2 reads the input as [N, H/2, 2, W/2, 2·C], 5-D; the store is 4-D."""
    ptr = {"int8": "*i8", "fp8": "*fp8e4nv"}[qfmt]
    sig = {a: ptr for a in ("x_ptr", "w_ptr", "out_ptr", "res_ptr")}
    sig.update(alpha_ptr="*fp32", beta_ptr="*fp32", gamma="fp32", NB="i32", H="i32", W="i32")
    const = dict(C=64, N=64, RELU=True, HAS_RES=False, OUT_KIND=int(qfmt == "fp8"), ACC_INT=qfmt == "int8",
                 TH=2, TW=64, BN=64, BK=64, STRIDE=stride, PDL=False)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "res_ptr", "alpha_ptr", "beta_ptr")
    compiled = compile_sm90(conv_tma.conv3x3_tma_kernel, sig, const, aligned, num_warps=4,
                            num_stages=conv_tma.MAX_STAGES, enable_fp_fusion=False)  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert f"cp.async.bulk.tensor.{dims}.shared::c" in ptx  # the shifted windows, one copy each
    assert "cp.async.bulk.tensor.4d.global.shared" in ptx  # the output's clipped store
    assert "wgmma.mma_async.sync.aligned" in ptx and mma in ptx
    assert ptxas_usage(compiled)["spill_stores"] == 0


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("shape,cfg", CASES, ids=["7x6", "5x9-chunks", "8x6-stride2"])
def test_descriptors_made_at_launch_give_the_bits_of_those_each_program_makes(qfmt, shape, cfg):
    nb, h, w, c, n, stride = shape
    lay, x, r, _ = _case(qfmt, nb, h, w, c, n, True, stride=stride)
    args = (x, (nb, h, w), lay.w_q, 3, stride, 1, lay.alpha, lay.beta, lay.out_fmt, True, cfg, r, lay.gamma)
    device = conv_tma.conv_gemm(*args, descriptors="device")
    assert torch.equal(
        conv_tma.conv_gemm(*args, descriptors="host").view(torch.uint8), device.view(torch.uint8)
    )


def test_the_descriptor_switch_reads_the_environment_and_refuses_other_words(monkeypatch):
    calls, real = [], conv_tma.host_descriptors
    monkeypatch.setattr(conv_tma, "host_descriptors", lambda *a: calls.append(a) or real(*a))
    lay, x, r, ref = _case("int8", 1, 4, 4, 32, 32, False)
    cfg = TileConfig(32, 32, 32, 8, 4, 2, tma_conv=8)
    monkeypatch.delenv(conv_tma.DESC_ENV, raising=False)  # default: each program makes its own
    assert torch.equal(_run(lay, x, r, (1, 4, 4), cfg), ref) and not calls
    monkeypatch.setenv(conv_tma.DESC_ENV, "host")
    assert torch.equal(_run(lay, x, r, (1, 4, 4), cfg), ref) and len(calls) == 1
    monkeypatch.setenv(conv_tma.DESC_ENV, "both")
    with pytest.raises(UsageError, match=conv_tma.DESC_ENV):
        _run(lay, x, r, (1, 4, 4), cfg)


def test_with_host_descriptors_it_compiles_to_the_same_copies_and_makes_no_descriptor():
    """``HOST_DESC``: the descriptors arrive as kernel parameters, so no program writes or fences one."""
    sig = {"x_ptr": "tensordesc<fp8e4nv[1, 4, 32, 128]>", "w_ptr": "tensordesc<fp8e4nv[128, 128]>",
           "out_ptr": "tensordesc<fp8e4nv[1, 4, 32, 128]>", "res_ptr": "tensordesc<fp8e4nv[1, 4, 32, 128]>",
           "alpha_ptr": "*fp32", "beta_ptr": "*fp32", "gamma": "fp32", "NB": "i32", "H": "i32", "W": "i32"}  # fmt: skip
    const = dict(C=128, N=128, RELU=True, HAS_RES=False, OUT_KIND=1, ACC_INT=False, TH=4, TW=32, BN=128, BK=128,
                 STRIDE=1, PDL=False, HOST_DESC=True)  # fmt: skip
    compiled = compile_sm90(conv_tma.conv3x3_tma_kernel, sig, const, ("alpha_ptr", "beta_ptr"), num_warps=8,
                            num_stages=conv_tma.MAX_STAGES, enable_fp_fusion=False)  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "cp.async.bulk.tensor.4d.shared::c" in ptx and "cp.async.bulk.tensor.4d.global.shared" in ptx
    assert "tensormap.replace" not in ptx and "tensormap.cp_fenceproxy" not in ptx
