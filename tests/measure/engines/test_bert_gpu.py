"""BERT-class encoders on a CUDA GPU (issue 38; skipped without CUDA): SDPA's fused kernels in fp16/bf16,
CUDA graphs and compile-freeze with int64 token inputs, each against the fp32 reference.

Run on the device with ``bash benchmarks/transformers_preset.sh gputests``.
"""

from __future__ import annotations

import pytest
import torch
from tinybert_gpu import sweep_tinybert

from deepgap.core.records import Status

pytestmark = pytest.mark.gpu


def test_sdpa_takes_a_fused_kernel_in_half_precision():
    """fp16/bf16 attention runs as FlashAttention or memory-efficient attention, never the math path."""
    from deepgap.measure.models.build import build_model, example_batch
    from deepgap.measure.models.flops import op_counter

    for dtype in (torch.float16, torch.bfloat16):
        m = build_model("bert-base", 128).to("cuda", dtype)
        counter = op_counter()
        with torch.inference_mode(), counter:
            m(example_batch("bert-base", 8, 128, device="cuda"))
        ops = {r.op.split(".")[0] for r in counter.records if "attention" in r.op}
        fused = {
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
        }
        assert ops and ops <= fused, ops
        assert sum(r.flops for r in counter.records if "attention" in r.op) == 12 * 4 * 8 * 128 * 128 * 768


def test_tinybert_through_the_gpu_engines():
    results = sweep_tinybert(
        ("eager", "cudagraph", "compile-freeze", "onnxruntime"), ("fp32", "fp16", "bf16"), 4
    )
    ok = [r for r in results if r.status == Status.OK]
    assert {(r.spec.engine, r.spec.precision) for r in ok} >= {
        ("eager", "fp16"),
        ("eager", "bf16"),
        ("cudagraph", "fp16"),
        ("compile-freeze", "fp16"),
    }
    for r in ok:
        assert r.details.correctness.flagged is False, (r.spec.label(), r.details.correctness)
    for r in results:
        assert r.status in (Status.OK, Status.SKIPPED), (r.spec.label(), r.reason)
