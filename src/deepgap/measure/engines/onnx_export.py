"""ONNX export with a dynamic batch axis, cached: the shared first step of ONNX Runtime and TensorRT.

One export serves every batch size (the batch axis is symbolic, named ``batch``); input ``input``
(N, 3, R, R), or a text model's int64 token ids (N, S) with S fixed (one export per sequence length,
which the cache key's ``resolution`` holds), output ``logits``. The exporter is torch.onnx's dynamo
path (``torch.export``, opset 18); where it fails, the TorchScript exporter (opset 17) is tried, and
``info["exporter"]`` says which one wrote the file. The export is keyed by model, resolution, weights
fingerprint, dtype, torch version and opset (`deepgap.measure.engines.artifacts`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from deepgap.measure.device import torch_dtype
from deepgap.measure.engines.artifacts import artifact_path, atomic_path, library_version
from deepgap.measure.models.build import example_batch

OPSET = 18
FALLBACK_OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def export_parts(model_name: str, resolution: int, weights_sha: str, dtype: str) -> dict[str, Any]:
    """The cache key of an export (everything that changes the file's bytes)."""
    return {
        "artifact": "onnx",
        "model": model_name,
        "resolution": resolution,
        "weights": weights_sha,
        "dtype": dtype,
        "torch": library_version("torch"),
        "onnx": library_version("onnx"),
        "onnxscript": library_version("onnxscript"),
        "opset": OPSET,
    }


def export_onnx(
    model,
    model_name: str,
    resolution: int,
    weights_sha: str,
    dtype: str = "fp32",
    options: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Export ``model`` (fp32, CPU, eval) in ``dtype`` (fp32|fp16) to a cached ONNX file.

    Returns:
        The file's path and what to record: ``onnx_cache`` (hit|miss), ``exporter``, ``export_s``.
    """
    parts = export_parts(model_name, resolution, weights_sha, dtype)
    path = artifact_path("onnx", f"{model_name}-{resolution}-{dtype}", parts, ".onnx", options)
    info: dict[str, Any] = {"onnx_path": str(path)}
    if path.exists():
        info["onnx_cache"] = "hit"
        return path, info
    t0 = time.perf_counter()
    tdtype = torch_dtype(dtype)
    model = model.to(tdtype).eval()
    example = example_batch(model_name, 2, resolution)  # 2, not 1: export specializes size 1
    example = example.to(tdtype) if example.is_floating_point() else example  # token ids stay int64
    errors = []
    with atomic_path(path, parts) as tmp:
        for exporter in ("dynamo", "torchscript"):
            try:
                _export(model, example, str(tmp), exporter)
                info["exporter"] = exporter
                break
            except Exception as exc:  # the next exporter may manage; the message is kept either way
                errors.append(
                    f"{exporter}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
        else:
            raise RuntimeError("ONNX export failed: " + " | ".join(errors))
        parts["exporter"] = info["exporter"]
    if errors:
        info["export_fallback"] = errors[0][:300]
    info.update(onnx_cache="miss", export_s=time.perf_counter() - t0)
    return path, info


def _export(model, example, path: str, exporter: str) -> None:
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1)
            prog = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: batch},),
                opset_version=OPSET,
                optimize=True,
                verbose=False,
            )
            prog.save(path)
        else:
            torch.onnx.export(
                model,
                (example,),
                path,
                dynamo=False,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                opset_version=FALLBACK_OPSET,
            )
