"""Roofline analysis: FLOPs and bytes per model, measured and spec-sheet ceilings, kernel profiles.

The paper's roofline study (``roofline-training-study.md``) profiled ResNet-50, ViT and MobileNet training
steps with Nsight Compute on T4/L4/V100. This package makes that a deepgap capability on whatever device
is present:

- `flops`: a model's cost per image (FLOPs from `deepgap.measure.models.flops`, the one counter), parameters, bytes.
- `specs`: the packaged spec-sheet table (``data/gpu_specs.csv``, dense numbers) and the paper's rows.
- `peaks`: measured ceilings of this device (matmul per precision, device-memory bandwidth).
- `model`: roofline arithmetic (attainable rate, ridge point, theoretical times).
- `predict`: the throughput ratio two platforms' ceilings predict for a configuration, and its bound.
- `cluster`: kernel name → cluster (convolution, GEMM, elementwise, normalization, pooling, copy …).
- `trace` / `profile`: torch.profiler runs of an inference or training step, kernels attributed to ops.
- `ncu`: Nsight Compute collection with the paper's metrics, and a parser of its CSV.
- `storage`: additive tables (peaks, profiles, kernels, model_costs) in a deepgap store.
- `figures`: roofline figures and the "theoretical vs measured" table for the report.

Every module imports torch/matplotlib inside functions, so importing this package is cheap.
"""

from __future__ import annotations

__all__ = [
    "cluster",
    "figures",
    "flops",
    "model",
    "ncu",
    "peaks",
    "predict",
    "profile",
    "specs",
    "storage",
    "trace",
]
