"""PyTorch eager execution: the paper's FP32/FP16 engine."""

from __future__ import annotations

import time

import torch

from deepgap.core.precision import float_precision_support
from deepgap.core.records import TEXT_INPUTS
from deepgap.measure.device import set_tf32, torch_dtype
from deepgap.measure.engines.base import ENGINES, Engine, Prepared


def to_device(model, spec):
    """Move a model to the spec's device, dtype and memory format (shared by the torch engines)."""
    set_tf32(spec.precision)
    model = model.to(device=spec.device, dtype=torch_dtype(spec.precision))
    if spec.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    return model


@ENGINES.register("eager")
class EagerEngine(Engine):
    """``model(x)`` under ``torch.inference_mode``; NCHW or channels_last."""

    name = "eager"
    inputs = ("default", *TEXT_INPUTS)  # a mixed-length text batch: the model packs or masks it itself
    description = "PyTorch eager (the paper's FP32/FP16 path); NCHW or channels_last"

    def supports(self, spec, caps):  # noqa: D102
        return super().supports(spec, caps) or float_precision_support(spec.precision, caps)

    def prepare(self, model, spec, example):  # noqa: D102
        t0 = time.perf_counter()
        model = to_device(model, spec)
        return Prepared(run=model, input_dtype=torch_dtype(spec.precision), setup_s=time.perf_counter() - t0)
