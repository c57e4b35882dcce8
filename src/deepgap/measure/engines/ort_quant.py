"""ONNX Runtime static INT8 quantization (QDQ), cached: the CPU's INT8 path, and the ORT-TensorRT one.

QDQ format (QuantizeLinear/DequantizeLinear pairs around each quantized op, which execution
providers fuse into integer kernels), per-channel symmetric int8 weights, activation ranges
calibrated on N images (`deepgap.measure.calibration_data`). Activations are uint8 asymmetric for the CPU
provider (x86 integer kernels are u8×s8: VPMADDUBSW/VNNI; signed activations are several times
slower there) and int8 symmetric for TensorRT (which takes only symmetric scales). The quantized
model is cached, keyed by the fp32 model's bytes, the calibration set, method and ORT version.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deepgap.measure.engines.artifacts import artifact_path, atomic_path, file_sha, library_version

METHODS = ("minmax", "entropy", "percentile")
CALIBRATION_BATCH = 8


def quant_settings(options: dict[str, Any] | None, for_tensorrt: bool = False) -> dict[str, Any]:
    """The quantization recipe from sweep options (``ort_calibration_method``), validated."""
    from deepgap.core.errors import UsageError

    method = str((options or {}).get("ort_calibration_method", "minmax")).lower()
    if method not in METHODS:
        raise UsageError(
            f"option ort_calibration_method {method!r} is unknown", f"choose one of {', '.join(METHODS)}"
        )
    return {
        "format": "QDQ",
        "per_channel": True,
        "weights": "int8 symmetric per output channel",
        "activations": "int8 symmetric per tensor" if for_tensorrt else "uint8 asymmetric per tensor",
        "calibration_method": method,
    }


def quantize(
    fp32_path: Path,
    calib,
    settings: dict[str, Any],
    label: str,
    options: dict[str, Any] | None = None,
    threads: int | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Quantize the ONNX model at ``fp32_path`` with ``calib`` (a `CalibrationSet`), through the cache.

    ``threads``: the calibration session's intra-op threads (`calibration_threads`); None: ORT's default.

    Returns:
        The QDQ model's path and what to record (recipe, calibration source, cache hit|miss, seconds).
    """
    parts = {
        "artifact": "ort-int8",
        "model_sha": file_sha(fp32_path),
        "calibration": calib.fingerprint,
        "settings": settings,
        "onnxruntime": library_version("onnxruntime"),
    }
    path = artifact_path("ort-int8", label, parts, ".onnx", options)
    info: dict[str, Any] = {
        "quantization": dict(settings),
        "calibration": dict(calib.info),
        "quant_path": str(path),
    }
    if path.exists():
        info["quant_cache"] = "hit"
        return path, info
    t0 = time.perf_counter()
    with atomic_path(path, parts) as tmp:
        pre = tmp.with_name(tmp.name + ".pre.onnx")
        try:
            info["preprocess"] = _preprocess(fp32_path, pre)
            with calibration_threads(threads):
                _quantize_static(pre if pre.exists() else fp32_path, tmp, calib, settings)
        finally:
            pre.unlink(missing_ok=True)
    info.update(quant_cache="miss", quantize_s=time.perf_counter() - t0, calibration_threads=threads)
    return path, info


@contextlib.contextmanager
def calibration_threads(threads: int | None) -> Iterator[None]:
    """ORT's calibration session with ``threads`` intra-op threads instead of ORT's default (None: unchanged).

    Why: `quantize_static` makes its calibration session with default options, and ORT's default is a thread
    per physical core, each pinned to its core. Three builds beside the prelude (`deepgap.drive.prepare`)
    then pin three threads to every core, each spinning while it waits, beside the warm-up's launching
    thread; given a count, ORT pins nothing, and its idle threads sleep here instead of spinning on a core
    another build needs. The session keeps ORT's own options otherwise (no graph optimization, its
    providers), and neither changes the ranges it finds: MLAS splits a convolution's rows and columns
    among threads, not its sums (the QDQ model's bytes are the same, tests/measure/engines/test_engines_units.py).
    """
    if not threads:
        yield
        return
    import onnxruntime
    from onnxruntime.quantization.calibrate import CalibraterBase

    own = CalibraterBase.create_inference_session

    def create(self) -> None:
        own(self)  # ORT's session and options, made again with the thread count set
        so = self.infer_session.get_session_options()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = self.infer_session.get_providers()
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=so, providers=providers
        )

    CalibraterBase.create_inference_session = create
    try:
        yield
    finally:
        CalibraterBase.create_inference_session = own


def _preprocess(src: Path, dst: Path) -> str:
    """ORT's recommended pre-pass (shape inference, graph optimization); skipped when it fails."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst))
        return "quant_pre_process"
    except Exception as exc:  # the raw export quantizes too, only less fused; record why
        dst.unlink(missing_ok=True)
        shutil.rmtree(dst.with_suffix(".data"), ignore_errors=True)
        return f"skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def _quantize_static(src: Path, dst: Path, calib, settings: dict[str, Any]) -> None:
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    input_name = onnx.load(str(src), load_external_data=False).graph.input[0].name
    batches = [b.numpy() for b in calib.batches(CALIBRATION_BATCH)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(batches)

        def get_next(self):
            b = next(self.it, None)
            return None if b is None else {input_name: b}

        def rewind(self) -> None:
            self.it = iter(batches)

    symmetric = settings["activations"].startswith("int8 symmetric")
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[settings["calibration_method"]]
    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=method,
        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True},
    )
