"""ONNX Runtime: the model exported through torch.onnx (dynamic batch), run by an execution provider.

``onnxruntime`` runs on the CPU provider for ``--device cpu`` and the CUDA provider for a GPU
(when the installed onnxruntime has it: the ``onnxruntime-gpu`` wheel); ``onnxruntime-trt`` runs
ORT's TensorRT provider. Precisions: fp32; fp16 (an fp16 export, GPU providers); int8 (static QDQ
quantization, `deepgap.measure.engines.ort_quant`: the CPU's INT8 path, or TensorRT's explicit-quantization
path). Inputs are NCHW: a channels_last configuration is stored as skipped, since the layout ORT
computes in is its own choice. Threads: the configuration's ``threads`` (else torch's default),
inter-op 1, as the PyTorch engines.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any, ClassVar

import torch

from deepgap.measure.engines.base import ENGINES, Engine, Prepared, example_on

PIP_HINT = "pip install 'deepgap[onnx]' (onnx, onnxruntime, onnxscript)"


def _missing() -> str | None:
    missing = [m for m in ("onnxruntime", "onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    return f"unavailable: {', '.join(missing)} not installed; {PIP_HINT}" if missing else None


def providers_available() -> list[str]:
    """The execution providers of the installed onnxruntime."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


@ENGINES.register("onnxruntime")
class OrtEngine(Engine):
    """ONNX Runtime with its CPU provider (CPU device) or CUDA provider (GPU device)."""

    name = "onnxruntime"
    description = "ONNX Runtime (torch.onnx export, dynamic batch): CPU provider, or CUDA provider on a GPU"
    precisions = ("fp32", "fp16", "int8")
    provider: ClassVar[str] = ""  # "" = by device: CPU or CUDA

    def available(self):  # noqa: D102
        return _missing()

    def provider_for(self, kind: str) -> str:
        """The execution provider this engine uses on a device of ``kind`` (cpu|cuda)."""
        return self.provider or ("CUDAExecutionProvider" if kind == "cuda" else "CPUExecutionProvider")

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps)
        if why:
            return why
        if spec.memory_format != "nchw":
            return (
                f"{self.name} takes NCHW inputs (its internal layout is its own choice); "
                "channels_last is a PyTorch layout"
            )
        prov = self.provider_for(caps.kind)
        if prov != "CPUExecutionProvider" and caps.kind != "cuda":
            return f"{self.name} uses {prov}, which needs a CUDA GPU; this device is a CPU"
        have = providers_available()
        if prov not in have:
            return (
                f"unavailable: the installed onnxruntime has no {prov} (it has {', '.join(have)}); "
                "install onnxruntime-gpu (CUDA/TensorRT providers) built for this CUDA"
            )
        if prov == "CPUExecutionProvider" and spec.precision == "fp16":
            return (
                "ONNX Runtime's CPU provider has no fp16 convolution kernels; "
                "fp16 runs on its CUDA/TensorRT providers"
            )
        if spec.seq_len and spec.precision == "int8":
            return (
                "ONNX Runtime int8 calibrates activation ranges on images (deepgap.measure.calibration_data); "
                "calibration on token ids for text encoders is not built yet"
            )
        if prov == "CUDAExecutionProvider" and spec.precision == "int8":
            return (
                "ONNX Runtime's CUDA provider runs QDQ int8 models by dequantizing to float (no int8 kernels); "
                "int8 on a GPU: onnxruntime-trt, tensorrt or quant"
            )
        return None

    def session_options(self):
        """Threads as the PyTorch engines (the worker has set torch's count for this configuration)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = torch.get_num_threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        return so

    def provider_options(self, spec, prov: str) -> dict[str, Any]:
        """Options of the CUDA provider: torch's current stream, so CUDA events time ORT's kernels."""
        idx = torch.device(spec.device).index or 0
        if prov == "CUDAExecutionProvider":
            stream = torch.cuda.current_stream(idx).cuda_stream
            return {
                "device_id": idx,
                "user_compute_stream": str(stream),
                "cudnn_conv_algo_search": "EXHAUSTIVE",
            }
        return {}

    def model_file(self, model, spec, info: dict[str, Any]):
        """The ONNX file to run: the fp32 or fp16 export, or its QDQ int8 quantization."""
        from deepgap.measure.engines.onnx_export import export_onnx
        from deepgap.measure.models.build import weights_fingerprint

        sha = weights_fingerprint(model)
        dtype = "fp16" if spec.precision == "fp16" else "fp32"
        path, export_info = export_onnx(model, spec.model, spec.resolution, sha, dtype, self.options)
        info.update(export_info)
        if spec.precision != "int8":
            return path
        from deepgap.measure import calibration_data
        from deepgap.measure.engines.ort_quant import quant_settings, quantize

        settings = quant_settings(self.options, for_tensorrt=self.provider == "TensorrtExecutionProvider")
        calib = calibration_data.calibration_set(spec.resolution, self.options)
        label = f"{spec.model}-{spec.resolution}"
        qpath, qinfo = quantize(path, calib, settings, label, self.options, torch.get_num_threads())
        info.update(qinfo)
        return qpath

    def prepare(self, model, spec, example):  # noqa: D102
        import onnxruntime as ort

        t0 = time.perf_counter()
        info: dict[str, Any] = {"onnxruntime": ort.__version__}
        path = self.model_file(model, spec, info)
        kind = "cuda" if spec.device.startswith("cuda") else "cpu"
        prov = self.provider_for(kind)
        providers: list[Any] = [(prov, self.provider_options(spec, prov))]
        if prov == "TensorrtExecutionProvider":
            providers.append(("CUDAExecutionProvider", self.provider_options(spec, "CUDAExecutionProvider")))
        t1 = time.perf_counter()
        sess = ort.InferenceSession(str(path), self.session_options(), providers=providers)
        info.update(
            session_s=time.perf_counter() - t1,
            providers=sess.get_providers(),
            intra_op_threads=torch.get_num_threads(),
        )
        if sess.get_providers()[0] != prov:  # ORT falls back to CPU silently; never measure the wrong thing
            raise RuntimeError(
                f"ONNX Runtime did not enable {prov} (session providers: {sess.get_providers()})"
            )
        in_dtype = torch.float16 if spec.precision == "fp16" else torch.float32
        run = _cpu_runner(sess) if kind == "cpu" else _cuda_runner(sess, spec)
        with (
            torch.inference_mode()
        ):  # first run: lazy initialization (and TensorRT's engine build) off the clock
            run(example_on(example, spec.device, in_dtype).contiguous())
        return Prepared(run=run, input_dtype=in_dtype, setup_s=time.perf_counter() - t0, info=info)


def _cpu_runner(sess):
    in_name, out_name = sess.get_inputs()[0].name, sess.get_outputs()[0].name

    def run(x):
        return torch.from_numpy(sess.run([out_name], {in_name: x.contiguous().numpy()})[0])

    return run


def _cuda_runner(sess, spec):
    """IO binding on torch's device buffers: no host round trip inside the timed call."""
    import numpy as np

    idx = torch.device(spec.device).index or 0
    in_name, out = sess.get_inputs()[0].name, sess.get_outputs()[0]
    out_elem = {"tensor(float)": np.float32, "tensor(float16)": np.float16}[out.type]
    out_buf = torch.empty(
        (spec.batch_size, int(out.shape[1])),
        device=spec.device,
        dtype=torch.float16 if out_elem is np.float16 else torch.float32,
    )
    in_elems = {
        torch.float16: np.float16,
        torch.float32: np.float32,
        torch.int64: np.int64,
    }  # int64: token ids
    binding = sess.io_binding()
    binding.bind_output(out.name, "cuda", idx, out_elem, tuple(out_buf.shape), out_buf.data_ptr())

    def run(x):
        x = x.contiguous()
        binding.bind_input(in_name, "cuda", idx, in_elems[x.dtype], tuple(x.shape), x.data_ptr())
        sess.run_with_iobinding(binding)
        return out_buf

    return run


@ENGINES.register("onnxruntime-trt")
class OrtTensorrtEngine(OrtEngine):
    """ONNX Runtime's TensorRT execution provider (needs onnxruntime-gpu built with TensorRT)."""

    name = "onnxruntime-trt"
    description = "ONNX Runtime TensorRT provider: fp32, fp16, int8 (QDQ explicit quantization); GPU"
    provider = "TensorrtExecutionProvider"

    def provider_options(self, spec, prov):  # noqa: D102
        opts = super().provider_options(spec, prov)
        if prov != "TensorrtExecutionProvider":
            return opts
        from deepgap.measure.engines.artifacts import cache_dir

        idx = torch.device(spec.device).index or 0
        b = spec.batch_size
        shape = (
            f"input:{b}x{spec.seq_len}"
            if spec.seq_len
            else f"input:{b}x3x{spec.resolution}x{spec.resolution}"
        )
        return {
            "device_id": idx,
            "user_compute_stream": str(torch.cuda.current_stream(idx).cuda_stream),
            "trt_fp16_enable": spec.precision in ("fp16", "int8"),
            "trt_int8_enable": spec.precision == "int8",
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache_dir(self.options) / "ort-trt"),
            "trt_profile_min_shapes": shape,
            "trt_profile_opt_shapes": shape,
            "trt_profile_max_shapes": shape,
        }
