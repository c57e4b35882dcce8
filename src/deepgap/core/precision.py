"""Numeric precisions: the one table of what each is, and what each device can run.

Why one table: a precision's facts (its dtype, bytes per element, correctness tolerance, colour in the
figures, the compute capability it needs, its datasheet column, whether it is quantized) used to be
literals in a dozen modules, so adding one meant finding them all. Every consumer now reads `PRECISIONS`
at call time; what stays elsewhere is what is not a fact of the precision: which engines run it (each
engine's ``precisions``), the kernels that measure its ceiling (`deepgap.roofline.peaks_measure`) and
its torch dtype and TF32 flags (`deepgap.measure.device`, worker side).

``fp32`` is strict fp32: TF32 is switched *off* for matmuls and convolutions (PyTorch leaves it on
for cuDNN convolutions by default, so a naive "fp32" on Ampere+ is really TF32). ``tf32`` switches it
on. ``fp16``/``bf16`` cast weights and inputs (``model.half()``), as the paper's FP16 scripts did.
``int8``/``fp8`` are quantized: they belong to quantizing engines (TensorRT, ONNX Runtime, deepgap's
quant engine), which calibrate activation scales, and are held to the accuracy floor by default.

This module sits in the lowest layer: it imports no other deepgap module, and never torch (dtypes are
stored by name).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Precision:
    """Everything deepgap needs to know about one numeric precision."""

    name: str
    dtype: str  # the torch dtype it stores tensors in, by attribute name (tf32 stores float32)
    itemsize: int  # bytes per element: the roofline's bytes = elements × this
    rel_l2_bound: float  # correctness: largest relative L2 error of the logits against fp32 eager
    cosine_floor: float  # correctness: smallest cosine similarity of the logits against fp32 eager
    colour: str  # its colour in every figure (static and interactive)
    colour_name: str  # that colour in words, for figure captions
    min_cc: tuple[int, int]  # the CUDA compute capability its fast path needs; (0, 0): any GPU
    peak_column: str  # its dense peak's column in data/gpu_specs.csv (`deepgap.roofline.specs`)
    peak_unit: str = "TFLOP/s"  # the unit of that peak (int8: TOPS)
    peak_fallback: str | None = None  # whose peak it runs at where the sheet has none of its own
    quantized: bool = False  # needs a quantizing engine and calibration; held to the accuracy floor
    allow_tf32: bool = False  # PyTorch's TF32 switches are on while it runs
    gpu_only: bool = False  # a mode of NVIDIA GPUs only, not a CPU precision


# Tolerances (random-weight ResNets, 224²): loose enough for rounding, tight enough that a wrong layer, layout
# or scale blows far past them; fp32 differs only by reordering, bf16 has an 8-bit mantissa.
# name, dtype, itemsize, rel_l2_bound, cosine_floor, colour, colour_name, min_cc, peak_column
_TABLE: tuple[tuple[Any, ...], ...] = (
    ("fp32", "float32", 4, 1e-3, 0.9999, "#1f77b4", "blue", (0, 0), "fp32_tflops"),
    ("tf32", "float32", 4, 2e-2, 0.999, "#17becf", "cyan", (8, 0), "tf32_tflops"),
    ("fp16", "float16", 2, 2e-2, 0.999, "#ff7f0e", "orange", (5, 3), "fp16_tflops"),
    ("bf16", "bfloat16", 2, 1e-1, 0.99, "#8c564b", "brown", (8, 0), "bf16_tflops"),
    ("int8", "int8", 1, 0.25, 0.95, "#2ca02c", "green", (7, 5), "int8_tops"),
    ("fp8", "float8_e4m3fn", 1, 0.25, 0.95, "#9467bd", "purple", (8, 9), "fp8_tflops"),
)
# the fields past the table's columns, where a precision's differ from the defaults
_REST: dict[str, dict[str, Any]] = {
    "tf32": {"peak_fallback": "fp32", "allow_tf32": True, "gpu_only": True},
    "bf16": {"peak_fallback": "fp16"},
    "int8": {"peak_unit": "TOPS", "quantized": True},
    "fp8": {"quantized": True},
}
PRECISIONS: dict[str, Precision] = {row[0]: Precision(*row, **_REST.get(row[0], {})) for row in _TABLE}


class _Column(Mapping[str, Any]):
    """A live, read-only ``{precision: field}`` view of the table (sees entries added after import)."""

    def __init__(self, field: str):
        self.field = field

    def __getitem__(self, name: str) -> Any:
        return getattr(PRECISIONS[name], self.field)

    def __iter__(self) -> Iterator[str]:
        return iter(PRECISIONS)

    def __len__(self) -> int:
        return len(PRECISIONS)

    def __repr__(self) -> str:
        return f"column({self.field!r}): {dict(self)!r}"


def column(field: str) -> Mapping[str, Any]:
    """``{name: getattr(precision, field)}`` over the table, read at each access (colours, item sizes)."""
    if field not in Precision.__dataclass_fields__:
        raise KeyError(f"Precision has no field {field!r}")
    return _Column(field)


def is_quantized(name: str) -> bool:
    """Whether ``name`` is a quantized precision (int8, fp8); False for an unknown name."""
    p = PRECISIONS.get(str(name))
    return bool(p and p.quantized)


def quantized_names() -> tuple[str, ...]:
    """The quantized precisions, in table order."""
    return tuple(n for n, p in PRECISIONS.items() if p.quantized)


def float_names() -> tuple[str, ...]:
    """The precisions plain PyTorch runs (every one not quantized), in table order."""
    return tuple(n for n, p in PRECISIONS.items() if not p.quantized)


def colour(name: str, default: str) -> str:
    """The precision's figure colour, or ``default`` for a name the table does not know."""
    p = PRECISIONS.get(str(name))
    return p.colour if p else default


def __getattr__(name: str) -> Any:
    # FLOAT_PRECISIONS stays importable as a tuple, computed from the table at each import.
    if name == "FLOAT_PRECISIONS":
        return float_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DeviceCaps:
    """What the worker learned about the device under test (cheap to pickle to the parent)."""

    device: str
    kind: str  # "cpu" or "cuda"
    name: str
    compute_capability: tuple[int, int] | None = None
    total_mem_bytes: int | None = None


def device_support(precision: str, caps: DeviceCaps) -> str | None:
    """Why this device lacks ``precision``'s hardware path (GPU-only mode, compute capability), or None."""
    p = PRECISIONS[precision]
    need = f"{p.min_cc[0]}.{p.min_cc[1]}"
    if caps.kind == "cpu":
        if p.gpu_only:
            return (
                f"{precision} is a tensor-core mode of NVIDIA GPUs (compute capability ≥ {need}); "
                "this device is a CPU"
            )
        return None
    cc = caps.compute_capability or (0, 0)
    if tuple(cc) < p.min_cc:
        return f"{precision} needs compute capability ≥ {need}; {caps.name} has {cc[0]}.{cc[1]}"
    return None


def float_precision_support(precision: str, caps: DeviceCaps) -> str | None:
    """Why ``precision`` cannot run in plain PyTorch on this device, or None when it can."""
    if precision not in PRECISIONS or PRECISIONS[precision].quantized:
        return (
            f"{precision} needs a quantizing engine (tensorrt, onnxruntime with int8, quant), "
            "not plain PyTorch"
        )
    return device_support(precision, caps)
