"""deepgap's own INT8/FP8 engine for NVIDIA tensor cores, built only on PyTorch and Triton (no TensorRT).

Post-training quantization of torchvision ResNets: BatchNorm folded, per-channel weight scales,
static activation scales (calibrated, cached), NHWC int8/fp8 activations, convolutions as fused
implicit-GEMM Triton kernels, a per-layer fallback to fp16 where that is faster, one CUDA graph.
Transformers (BERT, ViT): every Linear in fp8/int8 through ``torch._scaled_mm``/``torch._int_mm``
(in fp8 on Hopper the MLP fused in a Triton kernel and each Linear on its faster kernel:
`deepgap.measure.quant.linear_choice`), attention in bf16 SDPA, compiled and captured
(`deepgap.measure.quant.transformer_engine`).
This module is only the engine plug-in (registration, support checks, `prepare`); the implementation
lives in the package ``deepgap.measure.quant``. docs/quant.md and docs/transformers.md have the design
and measurements.
"""

from __future__ import annotations

import time

import torch

from deepgap.core.precision import PRECISIONS
from deepgap.core.records import TEXT_INPUTS
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
TRANSFORMERS = ("bert-base", "bert-large", "tinybert", "vit_b_16")  # their Linears in 8 bits
TEXT_NOT_YET = (
    "unavailable: the quant engine converts ResNets' convolutions and the Linears of "
    f"{', '.join(TRANSFORMERS)}; this text model's are not built yet"
)
NEEDS_GPU = (
    "unavailable: quant engine needs a CUDA GPU with int8 tensor cores (compute capability ≥ 8.0; fp8 ≥ 8.9)"
)


@ENGINES.register("quant")
class QuantEngine(Engine):
    """Quantized ResNets through Triton kernels, ``torch._int_mm`` and ``torch._scaled_mm``."""

    name = "quant"
    description = (
        "INT8/FP8 post-training quantization: ResNets (Triton implicit-GEMM, fused epilogues), "
        "BERT/ViT Linears (torch._scaled_mm/_int_mm, compiled); one CUDA graph"
    )
    precisions = ("int8", "fp8")
    inputs = ("default", "int8-resident", *TEXT_INPUTS)

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps)
        if why:
            return why
        transformer = spec.model in TRANSFORMERS
        if spec.seq_len and not transformer:  # before the device check: the same answer on every device
            return TEXT_NOT_YET
        if transformer and spec.input_mode == "int8-resident":
            return (
                "unavailable: int8-resident input is an image input of the ResNet path (MLPerf's ResNet-50)"
            )
        if caps.kind != "cuda":
            return NEEDS_GPU
        cc = caps.compute_capability or (0, 0)
        need = max((8, 0), PRECISIONS[spec.precision].min_cc)  # its kernels need ≥ 8.0; fp8 needs more
        if cc < need:
            return f"{NEEDS_GPU}; {caps.name} has {cc[0]}.{cc[1]}"
        if spec.model not in SUPPORTED_MODELS and not transformer:
            return (
                "unavailable: the quant engine converts torchvision ResNets "
                f"({', '.join(SUPPORTED_MODELS)}) and the Linears of {', '.join(TRANSFORMERS)}; "
                f"{spec.model} is not one"
            )
        return None

    def _prepare_transformer(self, model, spec, example):
        from deepgap.measure.models.registry import MODELS
        from deepgap.measure.quant.transformer_engine import prepare_transformer

        t0 = time.perf_counter()
        vocab = MODELS.get(spec.model).vocab_size
        run, in_dtype, info = prepare_transformer(model, spec.precision, example, spec.device, vocab)
        return Prepared(run=run, input_dtype=in_dtype, setup_s=time.perf_counter() - t0, info=info)

    def prepare(self, model, spec, example):  # noqa: D102
        if spec.model in TRANSFORMERS:
            return self._prepare_transformer(model, spec, example)
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
        from deepgap.measure.quant import repeats, split_k

        prepared = Prepared(
            run=res.run,
            input_dtype=torch.int8 if resident else torch.float16,
            setup_s=time.perf_counter() - t0,
            info=res.info,
            # a split-K wait that gave up, or a graph whose logits changed between replays (`quant.repeats`)
            faults=lambda: (
                split_k.faults(layer.w_q for layer in res.net.convs.values()) or repeats.fault(res.info)
            ),
        )
        if resident:  # the int8 pixels are made once from the fp32 batch, outside the timed window
            prepared.make_input = res.make_input
        return prepared
