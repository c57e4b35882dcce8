"""The 8-bit Linear path on a CUDA GPU (issue 50; skipped without one): cuBLASLt's kernels against the fp32
reference, and tinybert prepared, compiled and captured through the quant engine."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from deepgap.measure.models.build import build_model
from deepgap.measure.quant.linear import LinearQuant, QuantLinear
from deepgap.measure.quant.transformer_engine import DEFAULT_HOW, prepare_transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _fp8_ok() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.parametrize(
    "how",
    [*DEFAULT_HOW.values(), LinearQuant("fp8", "row"), LinearQuant("int8", "row")],
    ids=lambda h: f"{h.precision}-{h.act_scale}-{h.weight_scale}",
)
@pytest.mark.parametrize("rows", [256, 1])  # 1: a batch-1 pooler (torch._int_mm on CUDA needs > 16 rows)
def test_kernels_match_the_reference_at_bert_shapes(how, rows):
    if how.precision == "fp8" and not _fp8_ok():
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    torch.manual_seed(0)
    lin = nn.Linear(768, 3072).cuda()
    x = torch.randn(rows, 768, device="cuda")
    q = QuantLinear(lin, LinearQuant(how.precision, how.act_scale, 5.0, how.weight_scale, how.fast_accum))
    with torch.inference_mode():
        got, want = q(x.bfloat16()).float(), q.reference(x.bfloat16()).float()
    # fp32 sums in a different order, and a bf16 output: within a few bf16 ulps of the output's scale
    assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_tinybert_compiled_and_captured(precision):
    if precision == "fp8" and not _fp8_ok():
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    model = build_model("tinybert", 32)
    ids = torch.randint(0, 1000, (32, 32), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids)
    run, in_dtype, info = prepare_transformer(copy.deepcopy(model), precision, ids, "cuda:0", 1000)
    with torch.inference_mode():
        out = run(ids.cuda()).float().cpu()
        again = run(ids.cuda()).float().cpu()
    assert info["compile_s"] > 0 and info["linears"] == 9 and in_dtype == torch.int64
    assert torch.equal(out, again)  # the graph replays the same work
    assert float((out - ref).norm() / ref.norm()) < 0.1


@pytest.mark.parametrize("mode", ["flash", "cudnn", "flash"])
def test_tinybert_attention_kernel_is_the_one_named(mode, monkeypatch):
    """``DEEPGAP_QUANT_SDPA`` fixes the attention's kernel in the graph, ``engine_info.attention.ran`` names it
    (the profile's kernels say so; cuDNN's Hopper kernel has "flash" in its name too), and a graph compiled
    under one mode is never served from the compile cache to another (flash after cudnn: the last case)."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("DEEPGAP_QUANT_SDPA", mode)
    model = build_model("tinybert", 64)
    ids = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = model(ids)
    run, _, info = prepare_transformer(copy.deepcopy(model), "int8", ids, "cuda:0", 1000)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = run(ids.cuda()).float().cpu()
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    assert info["attention"] == {"mode": mode, "switch": "DEEPGAP_QUANT_SDPA",
                                 "ran": ["cuDNN" if mode == "cudnn" else "FlashAttention-2"]}  # fmt: skip
    assert ("cudnn" in names) == (mode == "cudnn") and "flash" in names, names
    assert float((out - ref).norm() / ref.norm()) < 0.1


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_llama_tiny_decodes_with_8bit_linears(precision):
    """`--workload decode --engines quant` (issue 51): the CUDA-graph step over 8-bit Linears, checked."""
    if precision == "fp8" and not _fp8_ok():
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    from deepgap.core.records import ConfigSpec
    from deepgap.drive.config import SweepSpec, validate
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import protocol_for
    from deepgap.measure.protocol import MeasureRequest

    sweep = dict(models=("llama-tiny",), engines=("quant",), precisions=(precision,), batch_sizes=(4,))
    spec = validate(SweepSpec(**sweep, device="cuda", workload="decode", cpu_baseline=False))
    c = ConfigSpec("llama-tiny", "quant", precision, 4, "cuda", resolution=16, input_len=16, output_len=32)
    w = InProcessWorker("cuda")
    w.start()
    try:
        res = w.call("measure", MeasureRequest(spec=c, protocol=protocol_for(spec)), 300)
    finally:
        w.stop()
    assert res.status.value == "ok", res.reason
    d = res.details.decode
    assert d.step == "cuda-graph" and not res.details.correctness.flagged
    assert d.token_agreement >= 0.5, d


@pytest.mark.parametrize("gelu,out_scale", [(True, 0.05), (False, None)])
def test_fused_fp8_linear_kernel_rounds_as_the_reference(gelu, out_scale):
    if not _fp8_ok():
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    from deepgap.measure.quant.linear_kernels import Epilogue, fp8_linear, reference

    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(1000, 768, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(3072, 768, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    bias = torch.randn(3072, device="cuda", generator=g)
    epi = Epilogue(1 / 44_000, bias, gelu, out_scale)
    got, want = fp8_linear(a, w, epi).float(), reference(a, w, epi).float()
    # Hopper's fp8 MMA accumulates with fewer bits than fp32 (as cuBLAS's fast accumulation, the engine's
    # default), so outputs sit a rounding step or two from the fp32 reference: on one H200, 98.9% of the
    # fp8 codes and 79% of the bf16 outputs equal it, within 5% and 0.5% of the output's range
    # (benchmarks/fp8_gemm_gelu.py, results/h200/session17)
    worst = float((got - want).abs().max() / want.abs().max())
    same = float((got == want).float().mean())
    assert worst <= (0.13 if out_scale else 0.01)
    assert same > (0.95 if out_scale else 0.6)


@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("codes", ["fp8", "int8"])
def test_weight_only_gemv_tuned_on_the_gpu(rows, codes):
    """The decode GEMV (issue 51) at a Llama-8B shape with its timed tile: every output within one bf16 step."""
    from deepgap.measure.quant.gemv import _TUNED, fp8_gemv, reference

    dtype = torch.float8_e4m3fn if codes == "fp8" else torch.int8
    if codes == "fp8" and not _fp8_ok():
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    g = torch.Generator(device="cuda").manual_seed(0)
    k, n = 4096, 6144
    x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 40).clamp(-120, 120).round().to(dtype)
    scale = torch.rand(n, device="cuda", generator=g) / 100 + 1e-3
    got, want = fp8_gemv(x, w, scale), reference(x, w, scale)
    assert (rows, k, n, "cuda:0") in _TUNED  # the tile was timed, not the first candidate taken
    ulp = want.float().abs().clamp(min=1e-2) * 2**-7
    assert bool(((got.float() - want.float()).abs() <= ulp).all())
