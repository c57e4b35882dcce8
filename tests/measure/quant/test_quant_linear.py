"""The quant engine's 8-bit Linear path for transformers (issue 50), on the CPU.

torch runs ``_scaled_mm`` (fp8) and ``_int_mm`` (int8) on a CPU too, so the kernels' path is held to the
fp32 reference here on small shapes, and the reference to the quantization written out by hand.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec
from deepgap.measure.engines import get_engine
from deepgap.measure.models.attention import SelfAttention, unfuse_attention
from deepgap.measure.models.build import build_model, inform_zero_layers
from deepgap.measure.quant.linear import LinearQuant, QuantLinear, quantize_codes, use_reference
from deepgap.measure.quant.transformer import calibrate_linears, linear_names, quantize_linears
from deepgap.measure.quant.transformer_engine import prepare_transformer

H200 = DeviceCaps("cuda:0", "cuda", "NVIDIA H200", (9, 0), 140 << 30)
A100 = DeviceCaps("cuda:0", "cuda", "NVIDIA A100", (8, 0), 80 << 30)
CPU = DeviceCaps("cpu", "cpu", "some cpu")
HOWS = [
    LinearQuant("fp8", "static", act_amax=8.0, weight_scale="tensor", fast_accum=True),
    LinearQuant("fp8", "row"),
    LinearQuant("fp8", "static", act_amax=8.0),
    LinearQuant("int8", "row"),
    LinearQuant("int8", "static", act_amax=8.0),
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module")
def linear():
    torch.manual_seed(0)
    return nn.Linear(64, 48)


@pytest.mark.parametrize("rows", [40, 1], ids=["40-rows", "1-row"])  # int8 pads a batch-1 pooler to 17 rows
@pytest.mark.parametrize("how", HOWS, ids=lambda h: f"{h.precision}-{h.act_scale}-{h.weight_scale}")
def test_kernel_path_equals_the_reference(linear, how, rows):
    x = torch.randn(rows // 20 or 1, min(rows, 20), 64, generator=torch.Generator().manual_seed(1))
    q = QuantLinear(linear, how)
    torch.testing.assert_close(q(x).float(), q.reference(x).float(), rtol=0, atol=1e-2)
    assert q(x).dtype == torch.bfloat16 and q(x).shape == (*x.shape[:-1], 48)


@pytest.mark.parametrize("how", HOWS, ids=lambda h: f"{h.precision}-{h.act_scale}-{h.weight_scale}")
def test_reference_is_the_quantization_written_out(linear, how):
    """Codes of x/s and W/s_w, back to reals, multiplied in fp32: nothing else."""
    x = (torch.randn(40, 64, generator=torch.Generator().manual_seed(2)) * 2).clamp(-8, 8)  # inside the range
    qmax = 448.0 if how.precision == "fp8" else 127.0
    w = linear.weight.detach()
    sw = (w.abs().amax(1, keepdim=True) if how.weight_scale == "channel" else w.abs().amax()) / qmax
    sx = x.abs().amax(1, keepdim=True) / qmax if how.act_scale == "row" else torch.tensor(8.0 / qmax)

    def back(v, s):
        c = (v / s).clamp(-qmax, qmax)
        c = c.to(torch.float8_e4m3fn).float() if how.precision == "fp8" else c.round()
        return c * s

    want = back(x, sx) @ back(w, sw).t() + linear.bias.detach()
    got = QuantLinear(linear, how, out_dtype=torch.float32).reference(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _rel(got, x @ w.t() + linear.bias.detach()) < (0.08 if how.precision == "fp8" else 0.03)


def test_codes_saturate_and_a_zero_row_stays_zero():
    s = torch.tensor(1.0)
    fp8 = quantize_codes(torch.tensor([1000.0, -1000.0, 0.5]), s, "fp8").float()
    assert fp8.tolist() == [448.0, -448.0, 0.5]
    assert quantize_codes(torch.tensor([300.0, -300.0, 2.4]), s, "int8").tolist() == [127, -127, 2]
    q = QuantLinear(nn.Linear(16, 16), LinearQuant("fp8", "row"))
    out = q.reference(torch.zeros(3, 16))
    assert torch.isfinite(out).all()


def test_refuses_shapes_and_settings_it_cannot_take():
    with pytest.raises(ValueError, match="multiples of 16"):
        QuantLinear(nn.Linear(768, 1000), LinearQuant("fp8"))
    with pytest.raises(ValueError, match="calibrated amax"):
        QuantLinear(nn.Linear(16, 16), LinearQuant("fp8", "static"))
    with pytest.raises(ValueError, match="precision"):
        LinearQuant("fp16")


def test_unfused_attention_is_multihead_attention_exactly():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 7, 32)
    with torch.inference_mode():
        want, _ = mha(x, x, x, need_weights=False)
        got, none = SelfAttention(mha)(x, x, x, need_weights=False)
    assert none is None and _rel(got, want) < 1e-5
    with pytest.raises(ValueError, match="batch-first"):
        SelfAttention(nn.MultiheadAttention(32, 4))
    box = nn.Sequential(nn.Linear(32, 32))
    box.attn = copy.deepcopy(mha)
    assert unfuse_attention(box) == 1 and isinstance(box.attn, SelfAttention)


def test_calibration_sees_each_linear_input():
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    xs = [torch.full((2, 16), 1.5), torch.full((2, 16), -4.0)]
    amax = calibrate_linears(net, xs, method="max")
    assert set(amax) == {"0", "2"} and amax["0"] == pytest.approx(4.0)
    with torch.inference_mode():
        assert amax["2"] == pytest.approx(max(float(net[1](net[0](x)).abs().max()) for x in xs))


def test_swap_keeps_codes_and_casts_the_rest():
    net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 10))
    amax = calibrate_linears(net, [torch.randn(4, 16)])
    swapped = quantize_linears(net, LinearQuant("fp8", "static", weight_scale="tensor"), amax)
    assert swapped == ["0"] and linear_names(net) == []  # the 32→10 head: N is not a multiple of 16
    assert net[0].weight_t.dtype == torch.float8_e4m3fn and net[0].w_scale.dtype == torch.float32
    assert net[1].weight.dtype == torch.bfloat16 and net[2].weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="calibrated ranges"):
        quantize_linears(nn.Sequential(nn.Linear(16, 16)), LinearQuant("fp8", "static"))


@pytest.mark.parametrize("precision,bound", [("fp8", 0.1), ("int8", 0.05)])
def test_tinybert_prepared_agrees_with_fp32(precision, bound):
    model = build_model("tinybert", 16)
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        ref = model(ids)
        run, in_dtype, info = prepare_transformer(
            copy.deepcopy(model), precision, ids, "cpu", 1000, fast=False
        )
        out = run(ids)
    assert in_dtype == torch.int64 and info["linears"] == 9 and info["linears_kept_bf16"] == []
    assert info["quant"]["precision"] == precision and info["calibration"]["batches"] == 2
    assert _rel(out, ref) < bound
    assert float(nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)) > 0.99


def test_vit_prepared_unfuses_and_keeps_the_head():
    """torchvision's ViT, two small layers (vit_b_16 itself: the same modules, 15 s to build on a CPU)."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(5)
    model = VisionTransformer(32, 16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)
    inform_zero_layers(model.eval(), 0)  # torchvision's zero head, as deepgap builds it
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        ref = model(x)
        run, in_dtype, info = prepare_transformer(copy.deepcopy(model), "fp8", x, "cpu", fast=False)
        out = run(x.to(in_dtype))
    assert in_dtype == torch.bfloat16 and info["unfused_attention"] == 2
    assert info["linears"] == 8 and info["linears_kept_bf16"] == ["heads.head"]
    assert _rel(out, ref) < 0.25


def _spec(model, precision="fp8", device="cuda", input_mode=""):
    seq = 128 if model.startswith(("bert", "tiny", "llama")) else None
    return ConfigSpec(model, "quant", precision, 8, device, seq_len=seq, input_mode=input_mode)


@pytest.mark.parametrize(
    "spec,caps,expect",
    [
        (_spec("bert-base"), H200, None),
        (_spec("vit_b_16"), H200, None),
        (_spec("tinybert", "int8"), A100, None),
        (_spec("bert-base"), A100, "fp8 ≥ 8.9"),
        (_spec("bert-base", device="cpu"), CPU, "needs a CUDA GPU"),
        (_spec("llama-tiny"), H200, "not built yet"),
        (_spec("vit_b_16", input_mode="int8-resident"), H200, "int8-resident"),
    ],
)
def test_engine_takes_transformers(spec, caps, expect):
    why = get_engine("quant").supports(spec, caps)
    assert why is None if expect is None else expect in why


def test_reference_switch_covers_every_swapped_layer():
    net = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    quantize_linears(net, LinearQuant("int8", "row"))
    use_reference(net)
    assert not any(m.fast for m in net)
    use_reference(net, on=False)
    assert all(m.fast for m in net)


@pytest.mark.parametrize("codes", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize(
    "rows,tile",
    [
        (1, None),
        (1, (8, 64, 1, 4, 3)),
        (1, (8, 64, 1, 4, 1, 1, 1)),
        (1, (16, 64, 2, 4, 3)),
        (5, (32, 64, 2, 4, 3)),
        (16, None),
    ],
)
def test_weight_only_gemv_in_the_interpreter(codes, rows, tile):
    """`gemv.fp8_gemv` (decode at a small batch, issue 51): bf16 rows times 8-bit weights, both kernels.

    One row with one K split runs the CUDA-core kernel (several K steps at tile 8 × 64: a block of partial
    sums reduced at the end, or each step reduced with the next step's weights loaded ahead); a split one row,
    and more rows, the tensor-core one (split K through fp32 atomics, or not).

    Each output is the fp32 product rounded once to bf16, so it is held to the reference within one
    bf16 step of its size.
    """
    from deepgap.measure.quant.gemv import GemvTile, fp8_gemv, reference

    g = torch.Generator().manual_seed(3)
    k, n = 256, 96
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 40).clamp(-120, 120)
    w = w.to(codes) if codes != torch.int8 else w.round().to(codes)
    scale, bias = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    got = fp8_gemv(x, w, scale, bias, GemvTile(*tile) if tile else None)
    want = reference(x, w, scale, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    ulp = want.float().abs().clamp(min=1e-3) * 2**-7
    assert bool(((got.float() - want.float()).abs() <= ulp).all())
    with pytest.raises(ValueError, match="at most 16"):
        fp8_gemv(torch.zeros(17, k).bfloat16(), w, scale)


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_weight_only_rows_keep_bf16_activations(linear, precision):
    """Up to ``weight_only_rows`` rows meet the 8-bit weights in bf16 (no activation codes); more are coded."""
    q = QuantLinear(linear, LinearQuant(precision, "row", weight_only_rows=4))
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    w = q.weight_t.float() * q.w_scale
    want = (x.bfloat16().float() @ w + linear.bias.detach()).bfloat16()
    torch.testing.assert_close(q(x).float(), want.float(), rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(q.reference(x).float(), want.float(), rtol=2**-7, atol=1e-3)
    x5 = torch.randn(5, 64, generator=torch.Generator().manual_seed(5))
    assert not q.weight_only(x5) and q.weight_only(x)
    torch.testing.assert_close(q(x5).float(), q.reference(x5).float(), rtol=0, atol=1e-2)
    with pytest.raises(ValueError, match="weight_only_rows"):
        LinearQuant(precision, weight_only_rows=17)


@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("batch", [2, 3], ids=["16-rows-weight-only", "24-rows-per-token"])
def test_decoder_with_8bit_linears_decodes_the_fp32_tokens(precision, batch):
    """The quant engine's decode swap (issue 51): every Linear of llama-tiny in 8 bits.

    8 tokens of 2 prompts are 16 rows: the weight-only GEMV; of 3 prompts, 24 rows: per-token codes.
    """
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    ref = build_llama("llama-tiny", seed=0, device="cpu")
    q = LINEAR_SWAPS[precision](build_llama("llama-tiny", seed=0, device="cpu"))
    assert sum(isinstance(m, QuantLinear) for m in q.modules()) == len(linear_names(ref))
    ids = prompts(ref.shape.vocab, batch, 8, 0)
    with torch.inference_mode():
        want, got = ref(ids, all_logits=True), q(ids, all_logits=True)
    assert _rel(got, want) < 0.25
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.75
    from deepgap.measure.llm_cost import gemm_weights
    from deepgap.measure.models.llama_net import weight_bytes

    # the 8-bit codes are buffers: counted, at one byte each (the bf16 rest and the scales on top)
    assert gemm_weights(ref.shape) < weight_bytes(q) < 2 * ref.shape.params()


@pytest.mark.parametrize("gelu,out_scale", [(True, 0.05), (False, None), (True, None)])
@pytest.mark.parametrize(
    "persistent,tma_epi,split", [(0, 0, 0), (1, 0, 0), (1, 1, 1)], ids=["grouped", "pers", "pers-te-split"]
)
def test_fused_fp8_linear_kernel_in_the_interpreter(gelu, out_scale, persistent, tma_epi, split):
    """The fused GEMM + bias + GELU + fp8 kernels (the next fp8 lever) against their fp32 reference.

    Both GEMM cores: the grouped kernel and the persistent TMA one (``persistent``: 3 programs walk the
    4 output tiles, device-side descriptors run by the interpreter). The interpreter truncates fp32 →
    bf16 and misrounds some fp32 → e4m3 (tests/measure/quant/test_quant_kernels.py's docstring); the GPU rounds in
    hardware (tests/measure/quant/test_quant_linear_gpu.py). So each output is its reference's or one step toward
    zero, or the interpreter's known e4m3 carry signature.
    """
    pytest.importorskip("triton")
    from deepgap.measure.quant.linear_kernels import FP8_LINEAR_TILE, Epilogue, fp8_linear, reference
    from deepgap.measure.quant.tiles import TileConfig

    g = torch.Generator().manual_seed(7)
    a = (torch.randn(40, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 64, generator=g) * 20).to(torch.float8_e4m3fn)
    bias = torch.randn(32, generator=g)
    tile = TileConfig(32, 32, 32, 2, 4, 2, persistent=persistent, tma_epilogue=tma_epi, split_epilogue=split)
    epi = Epilogue(1e-3, bias, gelu, out_scale)
    got, want = fp8_linear(a, w, epi, tile).float(), reference(a, w, epi).float()
    step = 2.0**-3 if out_scale else 2.0**-7  # e4m3 and bf16 mantissas
    near = (got - want).abs() <= want.abs() * step + 1e-4 * want.abs().max()  # GELU's far tail: erf's ulps
    carry = (got * 2 == want) & (torch.log2(want.abs()).frac() == 0)
    assert bool((near | carry).all()) and float((got == want).float().mean()) > 0.4
    assert got.dtype == torch.float32 and tuple(got.shape) == (40, 32)
    big = FP8_LINEAR_TILE
    assert big.fit(768, 3072) == big and big.fit(32, 48) == TileConfig(128, 16, 32, 8, 8, 3)
    with pytest.raises(ValueError, match="BK"):
        fp8_linear(
            a[:, :48].contiguous(), w[:, :48].contiguous(), Epilogue(1.0, bias), TileConfig(32, 32, 32)
        )


def _fp8_static(model: nn.Module, batches: list[torch.Tensor]) -> nn.Module:
    from deepgap.measure.quant.transformer_engine import DEFAULT_HOW

    quantize_linears(model, DEFAULT_HOW["fp8"], calibrate_linears(model, batches))
    return model


def test_fused_mlp_rewrites_bert_and_vit_chains_only():
    """BERT's marked chain and ViT's Sequential block are fused; int8 or per-row Linears are left alone."""
    from torchvision.models.vision_transformer import VisionTransformer

    from deepgap.measure.quant.fused_mlp import FusedLinearGelu, fuse_mlp
    from deepgap.measure.quant.tiles import TileConfig

    tile = TileConfig(32, 32, 32, 2, 4, 2)
    bert = _fp8_static(build_model("tinybert", 16), [torch.randint(0, 1000, (4, 16))])
    assert fuse_mlp(bert, tile) == 2 and isinstance(bert.layers[0].ff1, FusedLinearGelu)
    assert isinstance(bert.layers[0].act, nn.Identity) and bert.layers[0].ff2.takes_codes
    vit = VisionTransformer(32, 16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)
    unfuse_attention(vit.eval())
    _fp8_static(vit, [torch.randn(2, 3, 32, 32)])
    assert fuse_mlp(vit, tile) == 2 and isinstance(vit.encoder.layers[0].mlp[0], FusedLinearGelu)
    other = build_model("tinybert", 16)
    quantize_linears(other, LinearQuant("int8", "row"))
    assert fuse_mlp(other, tile) == 0


def test_fused_mlp_computes_what_the_unfused_path_does():
    from deepgap.measure.quant.fused_mlp import fuse_mlp
    from deepgap.measure.quant.tiles import TileConfig

    model = build_model("tinybert", 16)
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(6))
    q = _fp8_static(copy.deepcopy(model), [torch.randint(0, 1000, (8, 16))])
    fused = copy.deepcopy(q)
    fuse_mlp(fused, TileConfig(32, 32, 32, 2, 4, 2))
    with torch.inference_mode():
        want, got = q(ids).float(), fused(ids).float()
    # GELU of the fp32 accumulator instead of its bf16 rounding: the codes differ by a step here and there
    assert _rel(got, want) < 0.05
