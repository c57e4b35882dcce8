"""The quant engine's Triton kernels, run on the CPU by the Triton interpreter, against the exact reference.

int8 must match bit for bit (integer accumulation, identical fp32 epilogue, no FMA contraction).
fp8: the interpreter (Triton 3.8) rounds fp32 → e4m3 wrongly when rounding carries into the next
binade (7.9 → 4 instead of 8) and misrounds subnormals (< 2⁻⁶); the GPU converts in hardware. So
fp8 outputs must equal the reference except at exactly those signatures (value = half the
reference's power of two; a subnormal off by ≤ 2⁻⁸), and fp8 inputs are also checked through an
fp16 output, which is exact. tests/measure/quant/test_quant_gpu.py checks fp8 outputs on the GPU.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from fp8_codes import same_codes  # noqa: E402
from sm90 import compile_sm90  # noqa: E402

from deepgap.measure.quant import kernels, launch, layers, stem_kernels  # noqa: E402
from deepgap.measure.quant.fold import ConvNode  # noqa: E402
from deepgap.measure.quant.tiles import TileConfig  # noqa: E402

CFG = TileConfig(32, 32, 32, group_m=2, num_warps=4, num_stages=2)


def _layer(qfmt, k, stride, pad, cin, cout, res_fmt, out_fmt, relu, seed=0):
    g = torch.Generator().manual_seed(seed)
    node = ConvNode(
        "t",
        "a",
        "b",
        torch.randn(cout, cin, k, k, generator=g) * 0.1,
        torch.randn(cout, generator=g),
        stride,
        pad,
        relu,
        "r" if res_fmt else None,
    )
    fmts = {"a": qfmt, "b": out_fmt, "r": res_fmt or qfmt}
    return layers.make_qconv(node, qfmt, "q", fmts, {"a": 0.05, "b": 0.08, "r": 0.03}), g


CASES = [  # k, stride, pad, cin, cout, residual format, output format, relu
    (1, 1, 0, 64, 32, None, "q", True),
    (3, 1, 1, 32, 64, "q", "q", True),
    (3, 2, 1, 32, 32, "fp16", "fp16", False),
    (1, 2, 0, 64, 64, None, "q", False),
    (1, 1, 0, 32, 32, "q", "fp16", True),
    (7, 2, 3, 32, 32, None, "q", True),
]


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[0]}s{c[1]}res{c[5]}out{c[6]}")
def test_conv_gemm_matches_reference(qfmt, case):
    k, s, p, cin, cout, res_fmt, out_fmt, relu = case
    res_fmt = qfmt if res_fmt == "q" else res_fmt
    out_fmt = qfmt if out_fmt == "q" else out_fmt
    lay, g = _layer(qfmt, k, s, p, cin, cout, res_fmt, out_fmt, relu)
    nb, h, w = 2, 9, 7  # M not a multiple of the tile: the row mask matters
    x = layers.quantize_act(torch.randn(nb * h * w, cin, generator=g) * 40, qfmt)
    oh, ow = lay.node.out_hw(h, w)
    res = layers.quantize_act(torch.randn(nb * oh * ow, cout, generator=g) * 40, res_fmt) if res_fmt else None
    ref = layers.conv_reference(lay, x, (nb, h, w), res)
    out = kernels.conv_gemm(
        x, (nb, h, w), lay.w_q, k, s, p, lay.alpha, lay.beta, out_fmt, relu, CFG, res, lay.gamma
    )
    same_codes(out, ref, out_fmt)
    assert torch.equal(
        layers.conv_torch(lay, x, (nb, h, w), res).float(), ref.float()
    )  # the no-Triton path too


@pytest.mark.parametrize("qfmt, res_fmt", [("int8", "int8"), ("fp8", "fp8"), ("int8", "fp16")])
def test_early_residual_load_gives_the_same_output(qfmt, res_fmt):
    """The residual tile loaded before the K loop (TileConfig.early_res) changes timing, not results."""
    import dataclasses

    lay, g = _layer(qfmt, 1, 1, 0, 64, 32, res_fmt, qfmt, True, seed=3)
    nb, h, w = 2, 9, 7
    x = layers.quantize_act(torch.randn(nb * h * w, 64, generator=g) * 40, qfmt)
    res = layers.quantize_act(torch.randn(nb * h * w, 32, generator=g) * 40, res_fmt)
    ref = layers.conv_reference(lay, x, (nb, h, w), res)
    early = dataclasses.replace(CFG, early_res=True)
    assert early.label.endswith(" er")
    out = kernels.conv_gemm(
        x, (nb, h, w), lay.w_q, 1, 1, 0, lay.alpha, lay.beta, qfmt, True, early, res, lay.gamma
    )
    same_codes(out, ref, qfmt)


def test_conv_gemm_writes_every_element_and_uses_out():
    lay, g = _layer("int8", 3, 1, 1, 32, 32, None, "int8", False, seed=1)
    x = layers.quantize_act(torch.randn(3 * 5 * 5, 32, generator=g) * 40, "int8")
    out = torch.full((75, 32), -128, dtype=torch.int8)  # poison: the kernel clamps to ±127
    got = kernels.conv_gemm(x, (3, 5, 5), lay.w_q, 3, 1, 1, lay.alpha, lay.beta, "int8", False, CFG, out=out)
    assert got.data_ptr() == out.data_ptr() and int(out.min()) >= -127
    assert torch.equal(out, layers.conv_reference(lay, x, (3, 5, 5)))


@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp16"])
def test_maxpool_kernel(fmt):
    import torch.nn.functional as F  # noqa: N812

    g = torch.Generator().manual_seed(2)
    nb, h, w, c = 2, 11, 10, 48  # C not a power of two: channel mask
    x = (torch.randn(nb * h * w, c, generator=g) * 4).half()
    alpha, beta = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    out = stem_kernels.maxpool(x, (nb, h, w), alpha, beta, fmt, relu=True)
    pooled = F.max_pool2d(x.float().view(nb, h, w, c).permute(0, 3, 1, 2), 3, 2, 1)
    ref = layers.epilogue_reference(pooled.permute(0, 2, 3, 1).reshape(-1, c), alpha, beta, fmt, True)
    same_codes(out, ref, fmt)


@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp16"])
@pytest.mark.parametrize("src,res", [("fp16", "int8"), ("fp16", None), ("int8", None), ("fp16", "fp8")])
def test_epilogue_kernel(fmt, src, res):
    g = torch.Generator().manual_seed(3)
    m, n = 100, 48
    x = layers.quantize_act(torch.randn(m, n, generator=g) * 30, src)
    r = layers.quantize_act(torch.randn(m, n, generator=g) * 30, res) if res else None
    alpha, beta = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    out = kernels.epilogue(x, alpha, beta, fmt, True, r, 0.37)
    same_codes(out, layers.epilogue_reference(x.float(), alpha, beta, fmt, True, r, 0.37), fmt)


def test_launch_checks_give_clear_errors():
    lay, g = _layer("int8", 3, 1, 1, 32, 32, None, "int8", True)
    x = layers.quantize_act(torch.randn(2 * 4 * 4, 32, generator=g) * 40, "int8")
    args = dict(
        nhw=(2, 4, 4),
        w=lay.w_q,
        ksize=3,
        stride=1,
        padding=1,
        alpha=lay.alpha,
        beta=lay.beta,
        out_fmt="int8",
        relu=True,
        cfg=CFG,
    )
    with pytest.raises(ValueError, match="int8 or float8"):
        kernels.conv_gemm(x.float(), **args)
    with pytest.raises(ValueError, match=r"x must be contiguous \[nb·h·w=32, C\]"):
        kernels.conv_gemm(x[:-1], **args)
    with pytest.raises(ValueError, match="w must be contiguous"):
        kernels.conv_gemm(x, **{**args, "ksize": 1})
    with pytest.raises(ValueError, match="multiple of BK"):
        kernels.conv_gemm(x, **{**args, "cfg": TileConfig(32, 32, 64)})
    with pytest.raises(ValueError, match="multiple of BN"):
        kernels.conv_gemm(x, **{**args, "cfg": TileConfig(32, 64, 32)})
    with pytest.raises(ValueError, match="alpha must be a contiguous float32"):
        kernels.conv_gemm(x, **{**args, "alpha": lay.alpha.double()})
    with pytest.raises(ValueError, match="residual must be"):
        kernels.conv_gemm(x, **args, res=torch.zeros(5, 32, dtype=torch.int8))
    with pytest.raises(ValueError, match="out_fmt must be one of"):
        kernels.conv_gemm(x, **{**args, "out_fmt": "int4"})
    with pytest.raises(ValueError, match="maxpool input must be fp16"):
        stem_kernels.maxpool(x, (2, 4, 4), lay.alpha, lay.beta, "int8", True)


def test_whole_network_triton_matches_reference_int8():
    """ResNet-18 at 32², mixed quantized/fp16 layers (with a format conversion): Triton ≡ reference."""
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet18().eval())
    amax = collect_amax(graph, calibration_images(2, 32, 0), method="max")
    modes = {
        c.name: "fp16"
        for c in graph.convs()
        if c.name in ("layer2.0.conv1", "layer3.1.conv1", "layer4.1.conv2")
    }
    net = build(graph, "int8", amax, modes, 32)
    assert net.converts  # layer2.0.conv1 in fp16, its downsample quantized: layer1.1 in two formats
    x = torch.randn(2, 3, 32, 32)
    ref = net.forward(x)
    net.backend = {n: "triton" for n in net.convs}
    net.stem_backend = "triton"
    got = net.forward(x)
    assert torch.equal(got, ref)


@pytest.mark.parametrize(
    "early_res,split", [(False, 1), (True, 1), (False, 12)], ids=["", "early-res", "split12"]
)
@pytest.mark.parametrize("qfmt,mma", [("int8", "s32.s8.s8"), ("fp8", "f32.e4m3.e4m3")])
def test_conv_gemm_compiles_to_hopper_wgmma(qfmt, mma, early_res, split):
    """Ahead-of-time compile for sm_90 (no GPU needed): 8-bit wgmma, pipelined 16-byte async copies.

    Split-K too (`quant.split_k`): its K slice starts at a run-time step, which loses the loads' 16-byte
    alignment (and with it the async copies, to a spilling byte-wise loop) unless the kernel states it."""
    ptr = {"int8": "*i8", "fp8": "*fp8e4nv"}[qfmt]
    cfg = TileConfig(128, 128, 128, 8, 8, 4)
    sig = {
        "x_ptr": ptr,
        "w_ptr": ptr,
        "out_ptr": ptr,
        "alpha_ptr": "*fp32",
        "beta_ptr": "*fp32",
        "res_ptr": ptr,
        "gamma": "fp32",
        **{a: "i32" for a in ("M", "N", "C", "H", "W", "OH", "OW")},
        "ws_ptr": "*i32" if qfmt == "int8" else "*fp32",  # split-K's partials (the accumulator's type)
        "cnt_ptr": "*i32",
    }
    const = dict(
        KH=3,
        KW=3,
        STRIDE=1,
        PAD=1,
        RELU=True,
        HAS_RES=True,
        OUT_KIND=kernels.OUT_KIND[qfmt],
        ACC_INT=qfmt == "int8",
        BM=cfg.bm,
        BN=cfg.bn,
        BK=cfg.bk,
        GROUP_M=cfg.group_m,
        EARLY_RES=early_res,
        SPLIT=split,
        PDL=False,
    )
    aligned = (
        "x_ptr",
        "w_ptr",
        "out_ptr",
        "alpha_ptr",
        "beta_ptr",
        "res_ptr",
        "N",
        "C",
    )  # what the JIT infers
    compiled = compile_sm90(
        kernels.conv_gemm_kernel, sig, const, aligned,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False,
    )  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async.sync.aligned" in ptx and mma in ptx
    assert "griddepcontrol" not in ptx  # programmatic dependent launch only where asked (test_quant_pdl)
    assert "cp.async.cg.shared.global" in ptx and ", 0x10," in ptx  # 16-byte asynchronous loads
    assert compiled.metadata.shared <= 227 * 1024
    assert ("atom.global.gpu.acq_rel.add" in ptx) == (split > 1)  # the ticket of split-K's last program


def test_inside_compile_only_a_gpu_launch_compiles_with_its_grid_and_runs_nothing():
    calls = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append(("run", grid, a, k))

        def warmup(self, *a, grid, **k):
            calls.append(("warmup", grid, a, k))

    gpu = torch.device("cuda")
    with launch.compile_only():
        launch.launcher(FakeKernel(), gpu)[(4, 2)](1, 2, BM=32)
        assert isinstance(launch.launcher(kernels.conv_gemm_kernel, torch.device("cpu")), launch.Interpreted)
    launch.launcher(FakeKernel(), gpu)[(1,)](3)  # outside: launched as before
    assert calls == [("warmup", (4, 2), (1, 2), {"BM": 32}), ("run", (1,), (3,), {})]
