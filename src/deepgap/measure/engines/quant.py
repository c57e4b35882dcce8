"""deepgap's own INT8/FP8 engine for NVIDIA tensor cores, built only on PyTorch and Triton (no TensorRT).

Post-training quantization of torchvision ResNets: BatchNorm folded, per-channel weight scales,
static activation scales (calibrated, cached), NHWC int8/fp8 activations, convolutions as fused
implicit-GEMM Triton kernels, a per-layer fallback to fp16 where that is faster, one CUDA graph.
This module is only the engine plug-in (registration, support checks, `prepare`); the implementation
lives in the package ``deepgap.measure.quant``. docs/quant.md has the design and measurements.
"""

from __future__ import annotations

import time

import torch

from deepgap.core.precision import PRECISIONS
from deepgap.measure.engines.base import ENGINES, Engine, Prepared

SUPPORTED_MODELS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "wide_resnet50_2",
    "wide_resnet101_2",
)
TEXT_NOT_YET = (
    "unavailable: the quant engine converts convolutions (ResNets); int8/fp8 for a text encoder's Linear "
    "layers (QKV, projection, MLP) with calibrated static activation scales is not built yet (issue 38)"
)
NEEDS_GPU = (
    "unavailable: quant engine needs a CUDA GPU with int8 tensor cores (compute capability ≥ 8.0; fp8 ≥ 8.9)"
)


@ENGINES.register("quant")
class QuantEngine(Engine):
    """Quantized ResNets through Triton kernels, ``torch._int_mm`` and ``torch._scaled_mm``."""

    name = "quant"
    description = (
        "INT8/FP8 post-training quantization (Triton implicit-GEMM, fused epilogues, CUDA graph); ResNets"
    )
    precisions = ("int8", "fp8")
    inputs = ("default", "int8-resident")

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps)
        if why:
            return why
        if spec.seq_len:  # before the device check: the answer is the same on every device
            return TEXT_NOT_YET
        if caps.kind != "cuda":
            return NEEDS_GPU
        cc = caps.compute_capability or (0, 0)
        need = max((8, 0), PRECISIONS[spec.precision].min_cc)  # its kernels need ≥ 8.0; fp8 needs more
        if cc < need:
            return f"{NEEDS_GPU}; {caps.name} has {cc[0]}.{cc[1]}"
        if spec.model not in SUPPORTED_MODELS:
            return (
                "unavailable: the quant engine converts torchvision ResNets "
                f"({', '.join(SUPPORTED_MODELS)}); "
                f"{spec.model} is not one"
            )
        return None

    def prepare(self, model, spec, example):  # noqa: D102
        from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

        t0 = time.perf_counter()
        resident = spec.input_mode == "int8-resident"
        opts = QuantOptions(resident_input=resident)
        if self.options.get("dataset"):  # accuracy mode: calibrate on the labelled set's calibration split
            from deepgap.measure.calibration_data import from_dataset

            opts.calib_set = from_dataset(self.options["dataset"], spec.resolution, self.options)
        res = prepare_quant(
            model, spec.precision, spec.batch_size, spec.resolution, spec.model, device=spec.device, opts=opts
        )
        prepared = Prepared(
            run=res.run,
            input_dtype=torch.int8 if resident else torch.float16,
            setup_s=time.perf_counter() - t0,
            info=res.info,
        )
        if resident:  # the int8 pixels are made once from the fp32 batch, outside the timed window
            prepared.make_input = res.make_input
        return prepared
