"""The fp8 Linear's epilogue options and the engine's kernel choice (issue 50), on the CPU.

The GELU's tanh form in the interpreter (its exp form: the interpreter runs no inline PTX) against torch's
``approximate="tanh"``, and compiled for sm_90 to one ``tanh.approx.f32``; a `QuantLinear` on a Triton tile
(bias only) against its cuBLASLt path; `linear_choice`: the switches, what engine_info says, and the
engine's CPU path unchanged. tests/measure/quant/test_quant_linear_persistent_gpu.py runs the same on a Hopper GPU.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.models.build import build_model  # noqa: E402
from deepgap.measure.quant import linear_choice  # noqa: E402
from deepgap.measure.quant.fused_mlp import FusedLinearGelu  # noqa: E402
from deepgap.measure.quant.linear import LinearQuant, QuantLinear  # noqa: E402
from deepgap.measure.quant.linear_kernels import (  # noqa: E402
    FP8_LINEAR_PERSISTENT_TILE,
    GELU_ERF_POLY,
    GELU_TANH_PTX,
    Epilogue,
    fp8_linear,
    fp8_linear_persistent_kernel,
    reference,
)
from deepgap.measure.quant.tiles import TileConfig  # noqa: E402
from deepgap.measure.quant.transformer import calibrate_linears, quantize_linears  # noqa: E402
from deepgap.measure.quant.transformer_engine import DEFAULT_HOW, prepare_transformer  # noqa: E402

SMALL = TileConfig(32, 32, 32, 2, 4, 2)


def test_the_tanh_form_is_within_5e_4_of_the_exact_gelu():
    """What docs/transformers.md says of the option: at most 4.8e-4 apart (near |y| = 2.7), everywhere."""
    y = torch.linspace(-12, 12, 480_001, dtype=torch.float64)
    gap = (nn.functional.gelu(y, approximate="tanh") - nn.functional.gelu(y)).abs()
    assert 4.5e-4 < float(gap.max()) < 4.8e-4


@pytest.mark.parametrize("persistent", [0, 1], ids=["grouped", "persistent"])
@pytest.mark.parametrize("out_scale", [None, 0.05], ids=["bf16", "fp8"])
def test_tanh_gelu_in_the_interpreter_is_torchs_tanh_form(persistent, out_scale):
    g = torch.Generator().manual_seed(8)
    a = (torch.randn(40, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    bias = torch.randn(32, generator=g)
    tile = TileConfig(32, 32, 32, 2, 4, 2, persistent=persistent)
    tanh = Epilogue(1e-3, bias, True, out_scale, "tanh")
    got, want = fp8_linear(a, w, tanh, tile).float(), reference(a, w, tanh).float()
    exact = reference(a, w, Epilogue(1e-3, bias, True, out_scale)).float()
    # e4m3's and bf16's mantissas: the interpreter rounds its own way
    step = 2.0**-3 if out_scale else 2.0**-7
    carry = (got * 2 == want) & (torch.log2(want.abs()).frac() == 0)  # the interpreter's e4m3 carry
    assert bool(((got - want).abs() <= want.abs() * step + 1e-4 * want.abs().max()).logical_or(carry).all())
    assert float((got == want).float().mean()) > 0.4  # as in test_quant_linear.py: bf16 truncated
    assert not torch.equal(want, exact)  # the forms differ: the option is not the exact GELU renamed
    with pytest.raises(ValueError, match="approximate"):
        fp8_linear(a, w, Epilogue(1e-3, bias, True, out_scale, "sigmoid"), tile)


@pytest.mark.parametrize("out_scale", [None, 0.05], ids=["bf16", "fp8"])
def test_the_branch_free_erf_is_the_exact_gelu(out_scale):
    """``approximate="erf-poly"``: Abramowitz & Stegun's erf (|error| ≤ 1.5e-7) against libdevice's in the same
    kernel: the same fp8 codes, bf16 outputs at most a step apart (the fp32 GELUs differ by ~4e-7)."""
    g = torch.Generator().manual_seed(10)
    a = (torch.randn(40, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    bias = torch.randn(32, generator=g)
    tile = TileConfig(32, 32, 32, 2, 4, 2, persistent=1)
    got = fp8_linear(a, w, Epilogue(1e-3, bias, True, out_scale, "erf-poly"), tile).float()
    exact = fp8_linear(a, w, Epilogue(1e-3, bias, True, out_scale), tile).float()
    assert float((got == exact).float().mean()) > (0.99 if out_scale else 0.85)
    assert bool(((got - exact).abs() <= exact.abs() * 2**-7 + 1e-6).all())


@pytest.mark.parametrize("gelu,op", [(GELU_TANH_PTX, "tanh.approx.f32"), (GELU_ERF_POLY, "ex2.approx")])
def test_the_gelu_forms_compile_for_hopper(gelu, op):
    """The tanh form is one ``tanh.approx.f32`` an element; the branch-free erf one ``ex2`` and no branches
    beyond the tile walk's (libdevice's erf branches on |x|: some 260 in this epilogue)."""
    t = FP8_LINEAR_PERSISTENT_TILE
    sig = dict(a_ptr="*fp8e4nv", w_ptr="*fp8e4nv", bias_ptr="*fp32", out_ptr="*fp8e4nv", scale="fp32",
               out_inv_scale="fp32", M="i32", N="i32")  # fmt: skip
    const = dict(K=768, GELU=gelu, OUT_FP8=True, BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m,
                 NUM_SMS=132, TMA_EPILOGUE=False, EPI_N=t.bn // 2)  # fmt: skip
    compiled = compile_sm90(
        fp8_linear_persistent_kernel, sig, const, ("a_ptr", "w_ptr", "bias_ptr", "out_ptr", "N"),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert op in ptx and ptx.count("bra") < 20


def test_a_quant_linear_on_a_triton_tile_computes_its_cublaslt_product():
    """Bias only, bf16 out: the Triton GEMM (interpreter) against ``torch._scaled_mm`` (which a CPU runs too)."""
    torch.manual_seed(9)
    how = LinearQuant("fp8", "static", act_amax=6.0, weight_scale="tensor", fast_accum=True)
    q = QuantLinear(nn.Linear(64, 32), how)
    x = torch.randn(3, 20, 64, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        want = q(x).float()
        q.use_tile(SMALL.fields())
        got = q(x).float()
    assert got.shape == want.shape and q.tile == SMALL.fields()
    assert float((got - want).abs().max()) <= 2**-7 * float(want.abs().max())  # a bf16 step, sums reordered
    q.use_tile([])
    with torch.inference_mode():
        assert torch.equal(q(x).float(), want)
    with pytest.raises(ValueError, match="static per-tensor"):
        QuantLinear(nn.Linear(64, 32), LinearQuant("int8", "row")).use_tile(SMALL.fields())


@pytest.fixture(scope="module")
def tinybert_fp8():
    model = build_model("tinybert", 16)
    quantize_linears(model, DEFAULT_HOW["fp8"], calibrate_linears(model, [torch.randint(0, 1000, (8, 16))]))
    return model


@pytest.mark.parametrize("mode,gelu", [("tuned", "erf"), ("mlp", "tanh"), ("tuned", "erf-poly")])
def test_engine_info_names_each_linears_kernel_and_tile(tinybert_fp8, mode, gelu):
    """On a CPU the tuner takes its first candidate untimed: cuBLASLt for the others, the grouped tile fused."""
    net = copy.deepcopy(tinybert_fp8)
    ids = torch.randint(0, 1000, (8, 16), generator=torch.Generator().manual_seed(5))
    info = linear_choice.apply(net, ids, mode, gelu)
    assert info["fused_mlp"] == 2 and all(isinstance(m.act, nn.Identity) for m in net.layers)
    assert info["linear_precompile"]["kernels"] == 0 and "no Hopper" in info["linear_precompile"]["skipped"]
    rows = {n: k for k in info["linear_kernels"] for n in k["names"]}
    fused = rows["layers.0.ff1"]
    assert fused == rows["layers.1.ff1"] and fused["shape"] == "128x32x64"
    assert fused["kernel"] == "Triton grouped"
    assert linear_choice.GELU_LABELS[gelu] in fused["epilogue"] and fused["tile"] == "128x64x32 w8 s3"
    tile = net.layers[0].ff1.tile  # fixed before compiling
    assert tile and tile == TileConfig.from_fields(tile).fields()
    if mode == "tuned":
        assert rows["layers.1.qkv"]["kernel"] == "cuBLASLt" and rows["pooler"]["shape"] == "8x32x32"
        assert len(rows) == 9 and not rows["pooler"]["tile"]
    else:
        assert set(rows) == {"layers.0.ff1", "layers.1.ff1"}
    with torch.inference_mode():  # the tiles chosen, the network runs as it will compiled
        assert torch.isfinite(net(ids).float()).all()


def test_the_switches(monkeypatch):
    for name, read, default in ((linear_choice.FUSED_ENV, linear_choice.fused_mode, "tuned"),
                                (linear_choice.GELU_ENV, linear_choice.gelu_mode, "tanh")):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
        assert read() == default
        monkeypatch.setenv(name, "")
        assert read() == default
        monkeypatch.setenv(name, "fast")
        with pytest.raises(UsageError, match=f"{name}='fast'"):
            read()
    monkeypatch.setenv(linear_choice.FUSED_ENV, "off")
    monkeypatch.delenv(linear_choice.GELU_ENV)
    assert linear_choice.fused_mode() == "off"
    assert linear_choice.modes() == ("off", "tanh") and linear_choice.modes("mlp", "tanh") == ("mlp", "tanh")
    with pytest.raises(ValueError, match="'on' is not one of tuned, mlp, off"):
        linear_choice.modes("on")


def test_the_cpu_path_is_the_fp32_reference_and_says_why_nothing_was_fused(monkeypatch):
    """The reference (``fast=False``, the only path a CPU has) fuses nothing and says why; int8 says nothing;
    a bad switch stops the prepare before calibrating."""
    model = build_model("tinybert", 16)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(4))
    net, _, info = prepare_transformer(copy.deepcopy(model), "fp8", ids, "cpu", 1000, fast=False)
    assert info["fused"]["mode"] == "off" and "fp32 reference" in info["fused"]["why_off"]
    assert "linear_kernels" not in info and not any(isinstance(m, FusedLinearGelu) for m in net.modules())
    _, _, info = prepare_transformer(copy.deepcopy(model), "int8", ids, "cpu", 1000, fast=False)
    assert "fused" not in info
    assert "Hopper" in linear_choice.unavailable("fp8", "cpu", True)
    monkeypatch.setenv(linear_choice.FUSED_ENV, "on")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_FUSED"):
        prepare_transformer(model, "fp8", ids, "cpu", 1000, fast=False)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # stopped before anything changed


def test_the_chosen_kernels_trace_through_torch_compile(tinybert_fp8):
    """What the engine compiles: fused chains (tanh form), a Linear on a Triton tile, the rest on cuBLASLt,
    each a fixed choice; traced by dynamo and AOT autograd (the ops' fake kernels), the same output as eager."""
    net = copy.deepcopy(tinybert_fp8)
    ids = torch.randint(0, 1000, (8, 16), generator=torch.Generator().manual_seed(6))
    linear_choice.apply(net, ids, "tuned", "tanh")
    net.layers[0].out.use_tile(dataclasses.replace(SMALL, persistent=1).fields())
    with torch.inference_mode():
        want = net(ids)
        torch._dynamo.reset()
        got = torch.compile(net, backend="aot_eager", dynamic=False)(ids)
    assert torch.equal(got, want)
