"""What the parent knows of each engine without importing it: its name, module, precisions and description.

Why: an engine module imports torch at its top (it runs in a worker). Validating a sweep or a serve in the
parent imported every engine to look up names and precisions, and with them torch: 7 CPU-s per CLI
process with a bytecode cache, 17 without, and the parent never touches the GPU anyway. The parent reads
this table; the worker imports the engine (`deepgap.measure.engines.get_engine`). A new engine is one file
plus one line here; tests/measure/engines/test_engines_units.py checks the table against the registry, so a missing or
stale line fails there.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgap.core.errors import UsageError
from deepgap.core.records import TEXT_INPUTS

FLOATS = ("fp32", "tf32", "fp16", "bf16")
TORCH_INPUTS = (
    "default",
    *TEXT_INPUTS,
)  # a PyTorch engine runs a mixed-length text batch as the model lays it out


@dataclass(frozen=True)
class EngineInfo:
    """One engine as the parent sees it."""

    name: str
    module: str  # under deepgap.measure.engines
    precisions: tuple[str, ...]
    description: str
    inputs: tuple[str, ...] = ("default",)  # the input modes it takes (`deepgap.core.records.INPUT_MODES`)


CATALOG: tuple[EngineInfo, ...] = (
    EngineInfo(
        "compile",
        "torch_compile",
        FLOATS,
        "torch.compile (Inductor), default mode; compile time stored as engine_info.compile_s",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "compile-freeze",
        "torch_compile",
        FLOATS,
        "torch.compile mode=reduce-overhead + Inductor freezing (weights as constants, conv-BN folded)",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "compile-max-autotune",
        "torch_compile",
        FLOATS,
        "torch.compile mode=max-autotune-no-cudagraphs (autotuned GEMM/conv templates; minutes to compile)",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "compile-reduce-overhead",
        "torch_compile",
        FLOATS,
        "torch.compile mode=reduce-overhead (CUDA graphs on a GPU)",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "cudagraph",
        "cudagraph",
        FLOATS,
        "PyTorch eager captured as a CUDA graph per batch size (the small-batch latency winner); GPU",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "eager",
        "eager",
        FLOATS,
        "PyTorch eager (the paper's FP32/FP16 path); NCHW or channels_last",
        TORCH_INPUTS,
    ),
    EngineInfo(
        "onnxruntime",
        "ort",
        ("fp32", "fp16", "int8"),
        "ONNX Runtime (torch.onnx export, dynamic batch): CPU provider, or CUDA provider on a GPU",
    ),
    EngineInfo(
        "onnxruntime-trt",
        "ort",
        ("fp32", "fp16", "int8"),
        "ONNX Runtime TensorRT provider: fp32, fp16, int8 (QDQ explicit quantization); GPU",
    ),
    EngineInfo(
        "quant",
        "quant",
        ("int8", "fp8"),
        (
            "INT8/FP8 post-training quantization: ResNets (Triton implicit-GEMM, fused epilogues), "
            "BERT/ViT Linears (torch._scaled_mm/_int_mm, compiled); one CUDA graph"
        ),
        ("default", "int8-resident", *TEXT_INPUTS),
    ),
    EngineInfo(
        "tensorrt",
        "tensorrt_engine",
        (*FLOATS, "int8"),
        "TensorRT (the paper's INT8 path): ONNX → engine, batch-range profile, entropy calibration; GPU",
    ),
)
_BY_NAME = {e.name: e for e in CATALOG}


def _registered_here() -> dict[str, EngineInfo]:
    """Engines registered in this process beyond the catalogue (a test's broken engine, say)."""
    from deepgap.measure.engines.base import ENGINES

    return {
        n: EngineInfo(
            n,
            ENGINES.get(n).__module__,
            tuple(ENGINES.get(n).precisions),
            ENGINES.get(n).description,
            tuple(ENGINES.get(n).inputs),
        )
        for n in ENGINES.names()
        if n not in _BY_NAME
    }


def engine_names() -> list[str]:
    """Every engine's name, sorted: the catalogue's and any registered in this process."""
    return sorted({*_BY_NAME, *_registered_here()})


def engine_info(name: str) -> EngineInfo:
    """The engine ``name``, or a `UsageError` that lists the known ones."""
    found = _BY_NAME.get(name) or _registered_here().get(name)
    if found is None:
        raise UsageError(
            f"unknown engine {name!r}",
            f"choose one of: {', '.join(engine_names())} (see `deepgap list engines`)",
        )
    return found
