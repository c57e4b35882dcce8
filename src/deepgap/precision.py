"""Numeric precisions and what each device can run.

``fp32`` is strict fp32: TF32 is switched *off* for matmuls and convolutions (PyTorch leaves it on
for cuDNN convolutions by default, so a naive "fp32" on Ampere+ is really TF32). ``tf32`` switches it
on. ``fp16``/``bf16`` cast weights and inputs (``model.half()``), as the paper's FP16 scripts did.
``int8``/``fp8`` belong to quantizing engines (TensorRT, ONNX Runtime, deepgap's quant engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8")
FLOAT_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True)
class DeviceCaps:
    """What the worker learned about the device under test (cheap to pickle to the parent)."""

    device: str
    kind: str  # "cpu" or "cuda"
    name: str
    compute_capability: tuple[int, int] | None = None
    total_mem_bytes: int | None = None


def torch_dtype(precision: str) -> torch.dtype:
    """The tensor dtype an fp-precision computes in (tf32 stores fp32)."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def float_precision_support(precision: str, caps: DeviceCaps) -> str | None:
    """Why ``precision`` cannot run in plain PyTorch on this device, or None when it can."""
    if precision not in FLOAT_PRECISIONS:
        return f"{precision} needs a quantizing engine (tensorrt, onnxruntime with int8, quant), not plain PyTorch"
    if caps.kind == "cpu":
        if precision == "tf32":
            return "tf32 is a tensor-core mode of NVIDIA GPUs (compute capability ≥ 8.0); this device is a CPU"
        return None
    cc = caps.compute_capability or (0, 0)
    if precision in ("tf32", "bf16") and cc < (8, 0):
        return f"{precision} needs compute capability ≥ 8.0; {caps.name} has {cc[0]}.{cc[1]}"
    if precision == "fp16" and cc < (5, 3):
        return f"fp16 needs compute capability ≥ 5.3; {caps.name} has {cc[0]}.{cc[1]}"
    return None


def set_tf32(precision: str) -> None:
    """Allow TF32 tensor cores exactly when the precision is ``tf32`` (process-wide flags)."""
    import torch

    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
