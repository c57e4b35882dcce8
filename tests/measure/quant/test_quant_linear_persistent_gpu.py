"""The fused fp8 Linear's persistent TMA core on a Hopper GPU (issue 50; skipped without CUDA or below sm_90).

    python -m pytest tests/measure/quant/test_quant_linear_persistent_gpu.py -v -rA

Every tile of `tiles.linear_persistent_configs` at bert-base's and ViT-B/16's four Linear shapes at batch
256 (M = 256·128 and 256·197 rows, so each program walks many tiles), against cuBLASLt: ``torch._scaled_mm``
with the bias in its epilogue (bf16 out), and for the MLP's first Linear that output's GELU and fp8
quantization in torch, what the engine runs today. Then tinybert's MLP fused on the persistent core, and
"tuned", compiled and captured through the quant engine. Nothing is timed here (benchmarks/fp8_gemm_gelu.py
times them).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
        reason="the persistent kernel's TMA descriptors need compute capability ≥ 9.0",
    ),
]

SHAPES = [  # name, M, K, N, GELU + the next Linear's fp8 quantization
    (f"{model} {name}", m, k, n, name == "ff1")
    for model, m in (("bert-base", 256 * 128), ("vit_b_16", 256 * 197))
    for name, k, n in (("qkv", 768, 2304), ("out", 768, 768), ("ff1", 768, 3072), ("ff2", 3072, 768))
]


def _operands(m, k, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    bias = torch.randn(n, device="cuda", generator=g).bfloat16().float()  # cuBLASLt's epilogue takes bf16
    return a, w, bias, 1.0 / (1600 * k**0.5)


def _cublaslt(a, w, scale, bias, gelu, out_scale):
    """cuBLASLt's tensor-wise fp8 GEMM with fast accumulation, bias in its epilogue; then GELU and e4m3."""
    one = torch.ones((), device="cuda")
    y = torch._scaled_mm(a, w.t(), scale_a=torch.tensor(scale, device="cuda"), scale_b=one,
                         bias=bias.bfloat16(), out_dtype=torch.bfloat16, use_fast_accum=True)  # fmt: skip
    if not gelu:
        return y
    return (torch.nn.functional.gelu(y.float()) / out_scale).clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0].replace(" ", "-"))
def test_every_persistent_tile_agrees_with_cublaslt(shape):
    """Both sum fp8 products with Hopper's reduced-precision accumulation in different orders, and cuBLASLt
    rounds its sum and bias to bf16 before the GELU: outputs sit a rounding step apart here and there,
    as the grouped kernel's do (tests/measure/quant/test_quant_linear_gpu.py)."""
    from deepgap.measure.quant.linear_kernels import FP8_LINEAR_TILE, Epilogue, fp8_linear
    from deepgap.measure.quant.tiles import linear_persistent_configs

    _, m, k, n, gelu = shape
    a, w, bias, scale = _operands(m, k, n)
    out_scale = 0.05 if gelu else None
    want = _cublaslt(a, w, scale, bias, gelu, out_scale).float()
    top = float(want.abs().max())
    epi = Epilogue(scale, bias, gelu, out_scale)
    grouped = fp8_linear(a, w, epi, FP8_LINEAR_TILE.fit(k, n)).float()
    for t in linear_persistent_configs(k, n, 1 if gelu else 2):
        got = fp8_linear(a, w, epi, t).float()
        torch.cuda.synchronize()
        worst = float((got - want).abs().max()) / top
        same = float((got == want).float().mean())
        assert worst <= (0.13 if gelu else 0.01) and same > (0.95 if gelu else 0.6), (t.label, worst, same)
        # the same sums as the grouped kernel's, tile for tile: at most a rare one-step flip
        assert float((got != grouped).float().mean()) < 0.01, t.label


@pytest.mark.parametrize("tile", ["persistent", "tuned"])
def test_tinybert_fused_on_the_persistent_core_compiled_and_captured(tile):
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant.linear_kernels import FP8_LINEAR_PERSISTENT_TILE, tuned_tiles
    from deepgap.measure.quant.transformer_engine import prepare_transformer

    model = build_model("tinybert", 32)
    ids = torch.randint(0, 1000, (64, 32), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids)
    chosen = FP8_LINEAR_PERSISTENT_TILE if tile == "persistent" else None
    run, _, info = prepare_transformer(copy.deepcopy(model), "fp8", ids, "cuda:0", 1000, fused="mlp",
                                       fused_tile=chosen)  # fmt: skip
    with torch.inference_mode():
        out = run(ids.cuda()).float().cpu()
        again = run(ids.cuda()).float().cpu()
    assert info["fused_mlp"] == 2 and torch.equal(out, again)
    assert float((out - ref).norm() / ref.norm()) < 0.1
    fused = [k for k in info["linear_kernels"] if "GELU" in k["epilogue"]]
    assert [n for k in fused for n in k["names"]] == ["layers.0.ff1", "layers.1.ff1"]
    # "mlp": the other Linears are left on cuBLASLt, unlisted
    assert all(k["kernel"].startswith("Triton") for k in info["linear_kernels"])
    if tile == "tuned":  # timed in the eager pass before compiling: one entry, ff1's shape
        assert (64 * 32, 32, 64) in tuned_tiles()
    else:
        assert fused[0]["tile"] == FP8_LINEAR_PERSISTENT_TILE.fit(32, 64).label


@pytest.mark.parametrize("switch", ["tuned", "off", "mlp", ""])
def test_the_engine_fuses_and_chooses_every_fp8_linear(monkeypatch, switch):
    """``DEEPGAP_QUANT_FUSED=tuned``: the MLP fused and every other fp8 Linear of ≥ 128 rows on cuBLASLt or
    a Triton tile, each named in engine_info (unset: `DEFAULT_FUSED`, "tuned"); "off" is the cuBLASLt +
    Inductor engine as before."""
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant import linear_choice
    from deepgap.measure.quant.transformer_engine import prepare_transformer

    monkeypatch.setenv("DEEPGAP_QUANT_FUSED", switch)
    model = build_model("tinybert", 32)
    ids = torch.randint(0, 1000, (64, 32), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = model(ids)
    run, _, info = prepare_transformer(copy.deepcopy(model), "fp8", ids, "cuda:0", 1000)
    with torch.inference_mode():
        out = run(ids.cuda()).float().cpu()
    assert float((out - ref).norm() / ref.norm()) < 0.1
    assert info["fused"]["mode"] == (switch or linear_choice.DEFAULT_FUSED)
    if (switch or linear_choice.DEFAULT_FUSED) == "off":
        assert info["fused"]["why_off"].startswith("turned off") and "linear_kernels" not in info
        assert "Triton" not in info["kernels"]
        return
    assert (
        info["fused"]["gelu"] == linear_choice.GELU_LABELS["tanh"]
        and info["linear_precompile"]["kernels"] > 0
    )
    names = {n: k for k in info["linear_kernels"] for n in k["names"]}
    want = {"layers.0.ff1", "layers.1.ff1"}
    if (
        switch or linear_choice.DEFAULT_FUSED
    ) == "tuned":  # qkv, out, ff2 of both layers and the pooler (64 rows: cuBLASLt untimed)
        want |= {f"layers.{i}.{n}" for i in (0, 1) for n in ("qkv", "out", "ff2")} | {"pooler"}
        assert names["pooler"]["kernel"] == "cuBLASLt"
    assert set(names) == want
    assert all(bool(k["tile"]) == (k["kernel"] != "cuBLASLt") for k in info["linear_kernels"])


@pytest.mark.parametrize("approximate", ["tanh", "erf-poly"])
def test_the_gelu_forms_on_the_gpu_are_their_torch_forms(approximate):
    """The GELU forms: "tanh" (tanh.approx.f32) held to torch's tanh GELU in fp32; "erf-poly" (the branch-free
    erf) to torch's exact GELU; bf16 out, so each within a bf16 step and the sums' order."""
    from deepgap.measure.quant.linear_kernels import (
        FP8_LINEAR_PERSISTENT_TILE,
        Epilogue,
        fp8_linear,
        reference,
    )

    a, w, bias, scale = _operands(4096, 768, 3072, seed=3)
    epi = Epilogue(scale, bias, True, None, approximate)
    want = reference(a, w, epi).float()
    for t in (FP8_LINEAR_PERSISTENT_TILE, None):
        got = fp8_linear(a, w, epi, t).float()
        # one bf16 step of the output's size, plus tanh.approx's 2^-11 relative error and the sums' order
        assert float(((got - want).abs() - want.abs() * 2**-7).max()) <= 2e-3 * float(want.abs().max())
