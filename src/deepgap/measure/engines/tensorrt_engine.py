"""TensorRT: the paper's INT8 engine (and FP32/TF32/FP16/BF16), through the TensorRT Python API.

Used when ``import tensorrt`` works (TensorRT ≥ 8.6: ``execute_async_v3``); otherwise
`available` says why, ``deepgap env`` shows it, and every tensorrt configuration is stored as
skipped with that reason. Building is in `deepgap.measure.engines.tensorrt_build`. The engine runs on its
own stream, ordered after and before the caller's stream by event waits, so CUDA events on the
caller's stream time exactly its kernels (TensorRT discourages the legacy default stream).

Untested on hardware until a machine with TensorRT runs it: the development GPU has none.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from deepgap.core.precision import device_support, float_precision_support, is_quantized
from deepgap.measure.engines.base import ENGINES, Engine, Prepared

MIN_VERSION = (8, 6)


def _import_trt():
    import tensorrt as trt

    return trt


@ENGINES.register("tensorrt")
class TensorrtEngine(Engine):
    """ONNX → TensorRT engine (optimization profile over a batch range), cached; INT8 entropy calibration."""

    name = "tensorrt"
    description = (
        "TensorRT (the paper's INT8 path): ONNX → engine, batch-range profile, entropy calibration; GPU"
    )
    precisions = ("fp32", "tf32", "fp16", "bf16", "int8")

    def available(self):  # noqa: D102
        try:
            trt = _import_trt()
        except ImportError:
            return "unavailable: tensorrt is not installed (pip install tensorrt; NVIDIA GPUs only)"
        except Exception as exc:  # a broken install (missing libnvinfer …)
            return f"unavailable: import tensorrt failed: {type(exc).__name__}: {exc}"[:300]
        version = tuple(int(p) for p in trt.__version__.split(".")[:2] if p.isdigit())
        if version < MIN_VERSION:
            return f"unavailable: tensorrt {trt.__version__} is older than 8.6 (no execute_async_v3)"
        from deepgap.measure.engines.ort import _missing

        return _missing()  # the ONNX export needs onnx + onnxscript

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps)
        if why:
            return why
        if caps.kind != "cuda":
            return "tensorrt builds engines for NVIDIA GPUs; this device is a CPU"
        if spec.seq_len:
            return (
                "tensorrt's optimization profiles and int8 calibration are built for image inputs "
                "(N, 3, R, R); token-id inputs for text encoders are not wired yet"
            )
        if spec.memory_format != "nchw":
            return "tensorrt takes NCHW inputs (it chooses its own internal layouts); channels_last is a PyTorch layout"
        if is_quantized(spec.precision):  # not plain PyTorch's: only the device's capability counts
            why = device_support(spec.precision, caps)
            return f"tensorrt {why}" if why else None
        if spec.precision == "bf16" and not hasattr(_import_trt().BuilderFlag, "BF16"):
            return "this TensorRT has no BF16 builder flag (TensorRT ≥ 9 has)"
        return float_precision_support(spec.precision, caps)

    def prepare(self, model, spec, example):  # noqa: D102
        from deepgap.measure.engines import tensorrt_build as tb
        from deepgap.measure.engines.artifacts import artifact_path, write_bytes
        from deepgap.measure.engines.onnx_export import export_onnx
        from deepgap.measure.models.build import weights_fingerprint

        trt = _import_trt()
        t0 = time.perf_counter()
        dev = torch.device(spec.device)
        props = torch.cuda.get_device_properties(dev)
        sha = weights_fingerprint(model)
        info: dict[str, Any] = {"tensorrt": trt.__version__}
        onnx_path, export_info = export_onnx(model, spec.model, spec.resolution, sha, "fp32", self.options)
        info.update(export_info)
        profile = tb.profile_shapes(spec.batch_size, self.options)
        workspace = tb.workspace_bytes(self.options)
        calib = None
        if spec.precision == "int8":
            from deepgap.measure import calibration_data

            calib = calibration_data.calibration_set(spec.resolution, self.options)
            info["calibration"] = dict(calib.info)
        parts = tb.engine_parts(
            spec.model,
            spec.resolution,
            sha,
            spec.precision,
            profile,
            props.name,
            (props.major, props.minor),
            trt.__version__,
            calib.fingerprint if calib else None,
            workspace,
        )
        path = artifact_path(
            "tensorrt", f"{spec.model}-{spec.resolution}-{spec.precision}", parts, ".engine", self.options
        )
        info.update(profile_batches=list(profile), engine_path=str(path))
        if path.exists():
            info["engine_cache"] = "hit"
            blob = path.read_bytes()
        else:
            calibrator = None
            if calib is not None:
                cb = min(tb.CALIBRATION_BATCH, int(calib.images.shape[0]))
                batches = tb.calibration_batches(calib, cb)
                cparts = tb.calibration_cache_parts(
                    spec.model, spec.resolution, sha, calib.fingerprint, trt.__version__, cb
                )
                cpath = artifact_path(
                    "tensorrt-calibration", f"{spec.model}-{spec.resolution}", cparts, ".cache", self.options
                )
                calibrator = tb.make_calibrator(trt, batches, cpath, cparts, spec.device)
                info.update(
                    calibration_cache=str(cpath),
                    calibration_batch=cb,
                    calibration_images_used=cb * len(batches),
                )
            with torch.cuda.device(dev):
                blob, build_info = tb.build_serialized(
                    trt,
                    onnx_path,
                    spec.precision,
                    profile,
                    spec.resolution,
                    workspace,
                    calibrator,
                    calibration_batch=info.get("calibration_batch", tb.CALIBRATION_BATCH),
                )
            info.update(build_info, engine_cache="miss")
            if calibrator is not None:
                info["calibration_cache_hit"] = calibrator.cache_read
            write_bytes(path, blob, parts)
        run, keep = _runner(trt, blob, spec, dev)
        with torch.inference_mode():
            run(example.to(dev).contiguous())  # first call: lazy allocations off the clock
        torch.cuda.synchronize(dev)
        run.keep = keep  # engine, context and stream live as long as `run`
        return Prepared(run=run, input_dtype=torch.float32, setup_s=time.perf_counter() - t0, info=info)


def _runner(trt, blob: bytes, spec, dev):
    """A callable running the deserialized engine for the configuration's batch on its own stream."""
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    with torch.cuda.device(dev):
        engine = runtime.deserialize_cuda_engine(blob)
        if engine is None:
            raise RuntimeError(
                "TensorRT could not deserialize the cached engine (a different TensorRT or GPU?)"
            )
        context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    in_name = next(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
    out_name = next(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT)
    context.set_input_shape(in_name, (spec.batch_size, 3, spec.resolution, spec.resolution))
    out_dtype = {trt.float32: torch.float32, trt.float16: torch.float16}[engine.get_tensor_dtype(out_name)]
    out = torch.empty(tuple(context.get_tensor_shape(out_name)), dtype=out_dtype, device=dev)
    context.set_tensor_address(out_name, out.data_ptr())
    stream = torch.cuda.Stream(device=dev)

    def run(x):
        caller = torch.cuda.current_stream(dev)
        stream.wait_stream(caller)  # the input is ready
        context.set_tensor_address(in_name, x.data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        caller.wait_stream(stream)  # the caller's stream (and its timing events) waits for the engine
        return out

    return run, (runtime, engine, context, stream, out)
