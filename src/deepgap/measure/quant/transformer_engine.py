"""Prepare a transformer for the quant engine: unfuse attention, calibrate, swap Linears, compile, capture.

Steps (all outside the timed window; their cost is ``Prepared.setup_s``):
  1. the fp32 model on the device; ``nn.MultiheadAttention`` unfused (`deepgap.measure.models.attention`);
  2. each Linear's input range over seeded calibration inputs (token ids, or N(0, 1) images), as the CNN
     engine calibrates (`deepgap.measure.quant.transformer.calibrate_linears`);
  3. every Linear the tensor cores take swapped for a `QuantLinear`, the rest of the network in bf16;
     in fp8 on Hopper, each MLP's first Linear, GELU and the next quantization fused in one Triton kernel
     and every fp8 Linear's kernel and tile chosen by timing in one eager pass
     (`deepgap.measure.quant.linear_choice`; ``DEEPGAP_QUANT_FUSED`` turns it down);
  4. torch.compile (Inductor's default mode: each activation's quantization fused into the kernel that
     produced it), then the whole forward captured as one CUDA graph, the attention's SDPA kernel chosen
     in torch's order (`deepgap.measure.quant.sdpa_choice`; ``DEEPGAP_QUANT_SDPA=cudnn`` puts cuDNN first).

The default scales are what one H200 measured fastest at equal error (results/h200/session17, bert-base
seq 128 batch 256, bare loop): fp8 with static per-tensor activation and weight scales and fast
accumulation (cuBLASLt's tensor-wise kernel, 26.3k seq/s) beat per-row activations with per-channel
weights (18.7k; the row amax is a reduction before every GEMM, and the row-wise kernel is slower) at
the same relL2 against fp32 (0.079 vs 0.080). int8 keeps per-channel weights (``torch._int_mm``
applies no scale itself, so a channel's scale costs nothing more); it measured 15.2k, slower than bf16.
Session 23 (the same loop): the fused MLP on the persistent TMA core, tiles timed per shape, 28,320 seq/s
against 26,046 for cuBLASLt + Inductor; ViT-B/16 batch 256 14,936 img/s against 13,780.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from deepgap.measure.models.attention import unfuse_attention
from deepgap.measure.quant import linear_choice, sdpa_choice
from deepgap.measure.quant.calibrate import DEFAULT_METHOD
from deepgap.measure.quant.linear import LinearQuant, use_reference
from deepgap.measure.quant.transformer import calibrate_linears, quantize_linears

if TYPE_CHECKING:
    from deepgap.measure.quant.tiles import TileConfig

CALIB_BATCHES = 2
CALIB_BATCH_SIZE = 16
DEFAULT_HOW = {
    "fp8": LinearQuant("fp8", "static", weight_scale="tensor", fast_accum=True),
    "int8": LinearQuant("int8", "static", weight_scale="channel"),
}
OUT_DTYPE = torch.bfloat16  # _scaled_mm's row-wise kernel writes bf16 only; one dtype for every path


def calibration_inputs(example: torch.Tensor, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """Seeded calibration batches shaped like ``example``: token ids below ``vocab``, or N(0, 1) images."""
    g = torch.Generator().manual_seed(20_011 + seed)
    shape = (CALIB_BATCH_SIZE, *example.shape[1:])
    if example.is_floating_point():
        return [torch.randn(shape, generator=g) for _ in range(CALIB_BATCHES)]
    return [torch.randint(0, vocab, shape, generator=g) for _ in range(CALIB_BATCHES)]


def prepare_transformer(
    model: torch.nn.Module,
    precision: str,
    example: torch.Tensor,
    device: str,
    vocab: int = 0,
    fast: bool = True,
    fused: str | None = None,
    fused_tile: TileConfig | None = None,
    gelu: str | None = None,
) -> tuple[Any, torch.dtype, dict[str, Any]]:
    """(run, input dtype, info) of ``model`` with 8-bit Linears; ``fast=False``: the fp32 reference, no compile.

    ``run(x)`` takes the batch on ``device``: token ids (int64) as they are, images in bf16.
    ``fused``: one of `linear_choice.FUSED_MODES` (default ``DEEPGAP_QUANT_FUSED``'s, else "tuned"): in fp8 on
    Hopper each MLP's first Linear, GELU and the next quantization in one Triton kernel, and ("tuned")
    every other fp8 Linear on cuBLASLt or a Triton tile, whichever its shape ran faster. ``fused_tile``:
    one fixed tile for the fused chains (tests, benchmarks). ``gelu``: one of `linear_choice.GELU_MODES`
    (default ``DEEPGAP_QUANT_GELU``'s, else "tanh"). ``info["fused"]`` says what ran and why not.
    """
    mode, form = linear_choice.modes(fused, gelu)  # a bad switch stops the prepare here, before calibrating
    attention = sdpa_choice.mode()
    how = DEFAULT_HOW[precision]
    net = model.to(device).eval()
    info: dict[str, Any] = {"path": "transformer linears", "unfused_attention": unfuse_attention(net)}
    t0 = time.perf_counter()
    amax = calibrate_linears(net, [x.to(device) for x in calibration_inputs(example, vocab)], DEFAULT_METHOD)
    info["calibration"] = {"batches": CALIB_BATCHES, "batch_size": CALIB_BATCH_SIZE, "method": DEFAULT_METHOD,
                           "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
    swapped = quantize_linears(net, how, amax, OUT_DTYPE)
    kept = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)]
    info.update(quant={k: v for k, v in asdict(how).items() if k != "act_amax"}, linears=len(swapped),
                linears_kept_bf16=kept, dtype="bfloat16")  # fmt: skip
    in_dtype = OUT_DTYPE if example.is_floating_point() else example.dtype
    x = example.to(device=device, dtype=in_dtype)
    if precision == "fp8":
        off = f"turned off ({linear_choice.FUSED_ENV}=tuned turns it on)" * (mode == "off")
        why_not = linear_choice.unavailable(precision, device, fast) or off
        gelu_ran = linear_choice.GELU_LABELS[form] if not why_not else "the model's own (Inductor)"
        info["fused"] = {"mode": "off" if why_not else mode, "switch": linear_choice.FUSED_ENV, "why_off": why_not,
                         "gelu": gelu_ran}  # fmt: skip
        if not why_not:
            t1 = time.perf_counter()
            info.update(linear_choice.apply(net, x, mode, form, fused_tile))
            info["fused"]["choose_s"] = round(time.perf_counter() - t1, 2)
    if not fast:
        use_reference(net)
        info["kernels"] = "fp32 reference (no tensor cores)"
        return net, in_dtype, info
    ran = sdpa_choice.chosen(net, x, attention)
    info["attention"] = {"mode": attention, "switch": sdpa_choice.ENV, "ran": ran}
    return _compile_and_capture(net, x, device, info, attention), in_dtype, info


def _compile_and_capture(net: torch.nn.Module, x: torch.Tensor, device: str, info: dict[str, Any],
                         attention: str = "torch"):  # fmt: skip
    """Inductor (default mode, static shapes) around ``net``, then one CUDA graph of it; times in ``info``."""
    from deepgap.measure import graph_runner

    torch._dynamo.reset()  # fresh guards for this configuration, as the compile engines do
    compiled = torch.compile(net, dynamic=False)
    t0 = time.perf_counter()
    with sdpa_choice.backends(attention):
        with torch.inference_mode():
            compiled(x)
        torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        graph, out = graph_runner.capture(compiled, x, device)
    triton = " + deepgap::fp8_linear (Triton)" if info.get("linear_kernels") else ""
    sdpa = " / ".join(info.get("attention", {}).get("ran") or ["(none)"])
    kernels = f"torch._scaled_mm / torch._int_mm{triton} + Inductor + SDPA {sdpa}, one CUDA graph"
    info.update(compile_s=round(t1 - t0, 2), capture_s=round(time.perf_counter() - t1, 2), kernels=kernels)
    return graph_runner.GraphRunner(graph, x, out, owns=compiled)
