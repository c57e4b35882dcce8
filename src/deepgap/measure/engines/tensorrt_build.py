"""Building TensorRT engines: optimization profile, INT8 entropy calibration, and the two caches.

The paper's INT8 path, made explicit: ONNX (`deepgap.measure.engines.onnx_export`) → TensorRT network → one
optimization profile over a batch range (the paper's min 1 / opt 32 / max 512 by default, widened
to cover a larger batch) → FP16 or INT8 with an entropy calibrator (IInt8EntropyCalibrator2) fed
full batches of the calibration set (`deepgap.measure.calibration_data`), whose table is cached → a serialized
engine, cached under a key of model, resolution, weights, precision, profile, GPU (name and
compute capability), TensorRT version and calibration set.

The pure parts (profile ranges, cache keys, calibration batches) are tested on the CPU; the parts
that call TensorRT import it inside the function and are untested until a machine with TensorRT
runs them (docs/engines.md says so).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from deepgap.core.errors import UsageError

PAPER_PROFILE = (1, 32, 512)  # the paper's profile: min, opt, max batch
CALIBRATION_BATCH = 32  # the paper fed its calibrator batches of 32
DEFAULT_WORKSPACE_GIB = 2.0  # the paper's builder workspace
PROFILE_MODES = ("range", "static")


def profile_shapes(batch_size: int, options: dict[str, Any] | None = None) -> tuple[int, int, int]:
    """(min, opt, max) batch of the optimization profile for a configuration of ``batch_size``.

    ``trt_profile = "range"`` (default): the paper's (1, 32, 512), or ``trt_profile_batches``; its max
    is raised to the next power of two ≥ ``batch_size`` when the batch is larger, and opt clamped
    into [min, max]. One engine then serves every batch of a sweep. ``"static"``: (b, b, b), an
    engine tuned for exactly this batch (faster at batches far from opt; one build per batch).
    """
    options = options or {}
    mode = options.get("trt_profile", "range")
    if mode not in PROFILE_MODES:
        raise UsageError(
            f"option trt_profile {mode!r} is unknown", f"choose one of {', '.join(PROFILE_MODES)}"
        )
    if mode == "static":
        return (batch_size, batch_size, batch_size)
    given = options.get("trt_profile_batches", PAPER_PROFILE)
    if (
        not isinstance(given, (list, tuple))
        or len(given) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in given)
        or not given[0] <= given[1] <= given[2]
    ):
        raise UsageError(
            f"option trt_profile_batches must be [min, opt, max] with 1 ≤ min ≤ opt ≤ max, got {given!r}",
            "set e.g. trt_profile_batches = [1, 32, 512]",
        )
    lo, opt, hi = (int(v) for v in given)
    lo = min(lo, batch_size)
    if batch_size > hi:
        hi = 1 << (batch_size - 1).bit_length()
    return (lo, min(max(opt, lo), hi), hi)


def workspace_bytes(options: dict[str, Any] | None = None) -> int:
    """The builder's workspace limit from ``trt_workspace_gib`` (default 2 GiB, the paper's)."""
    gib = (options or {}).get("trt_workspace_gib", DEFAULT_WORKSPACE_GIB)
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0:
        raise UsageError(
            f"option trt_workspace_gib must be a positive number, got {gib!r}",
            "set e.g. trt_workspace_gib = 2",
        )
    return int(gib * (1 << 30))


def _artifact_parts(
    artifact: str, model: str, resolution: int, weights_sha: str, trt_version: str
) -> dict[str, Any]:
    """What every TensorRT artifact depends on: the model, its input size and weights, TensorRT's version."""
    return {
        "artifact": artifact,
        "model": model,
        "resolution": resolution,
        "weights": weights_sha,
        "tensorrt": trt_version,
    }


def engine_parts(
    model: str,
    resolution: int,
    weights_sha: str,
    precision: str,
    profile: tuple[int, int, int],
    gpu_name: str,
    compute_capability: tuple[int, int],
    trt_version: str,
    calibration: str | None,
    workspace: int,
) -> dict[str, Any]:
    """The engine cache's key: everything that changes the serialized engine."""
    return {
        **_artifact_parts("tensorrt-engine", model, resolution, weights_sha, trt_version),
        "precision": precision,
        "profile": list(profile),
        "gpu": gpu_name,
        "compute_capability": f"{compute_capability[0]}.{compute_capability[1]}",
        "calibration": calibration if precision == "int8" else None,
        "workspace_bytes": workspace,
    }


def calibration_cache_parts(
    model: str, resolution: int, weights_sha: str, calibration: str, trt_version: str, batch: int
) -> dict[str, Any]:
    """The calibration table's key (a table is portable across GPUs, not across TensorRT versions)."""
    parts = _artifact_parts("tensorrt-calibration", model, resolution, weights_sha, trt_version)
    return {**parts, "calibration": calibration, "algorithm": "entropy2", "batch": batch}


def calibration_batches(calib, batch: int) -> list[Any]:
    """Full, contiguous batches of the calibration set (TensorRT's calibrator takes one batch size)."""
    if calib.images.shape[0] < batch:
        raise UsageError(
            f"INT8 calibration needs at least {batch} images, the set has {calib.images.shape[0]}",
            f"set calibration_images ≥ {batch}",
        )
    return [b.contiguous() for b in calib.batches(batch) if b.shape[0] == batch]


def make_calibrator(trt, batches: list[Any], cache_path: Path, cache_parts: dict[str, Any], device: str):
    """An IInt8EntropyCalibrator2 over ``batches`` that reads/writes its table at ``cache_path``."""
    from deepgap.measure.engines.artifacts import write_bytes

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.index = 0
            self.current = None
            self.cache_read = False

        def get_batch_size(self) -> int:
            return int(batches[0].shape[0])

        def get_batch(self, names):
            if self.index >= len(batches):
                return None
            self.current = batches[self.index].to(device).contiguous()  # kept alive until the next call
            self.index += 1
            return [int(self.current.data_ptr())]

        def read_calibration_cache(self):
            if cache_path.exists():
                self.cache_read = True
                return cache_path.read_bytes()
            return None

        def write_calibration_cache(self, cache) -> None:
            write_bytes(cache_path, bytes(cache), cache_parts)

    return EntropyCalibrator()


def build_serialized(
    trt,
    onnx_path: Path,
    precision: str,
    profile: tuple[int, int, int],
    resolution: int,
    workspace: int,
    calibrator=None,
    calibration_batch: int = CALIBRATION_BATCH,
) -> tuple[bytes, dict]:
    """Parse ONNX, configure precision and profile, build; returns the engine's bytes and build facts."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    flags_set = []
    if precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)  # strict fp32, as deepgap's fp32 everywhere
    else:
        flags_set.append("TF32")
    if precision in ("fp16", "int8"):
        config.set_flag(
            trt.BuilderFlag.FP16
        )  # int8: layers without int8 kernels run fp16 (trtexec --int8 --fp16)
        flags_set.append("FP16")
    if precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
        flags_set.append("BF16")
    name = network.get_input(0).name
    shape = lambda b: (b, 3, resolution, resolution)  # noqa: E731
    prof = builder.create_optimization_profile()
    prof.set_shape(name, shape(profile[0]), shape(profile[1]), shape(profile[2]))
    config.add_optimization_profile(prof)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
        flags_set.append("INT8")
        cal = builder.create_optimization_profile()
        cal.set_shape(name, shape(calibration_batch), shape(calibration_batch), shape(calibration_batch))
        config.set_calibration_profile(cal)
        config.int8_calibrator = calibrator
    t0 = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise RuntimeError("TensorRT engine build failed (see the TensorRT log on stderr)")
    return bytes(blob), {"build_s": time.perf_counter() - t0, "builder_flags": flags_set}
