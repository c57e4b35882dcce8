"""Where an ONNX Runtime int8 artifact build's time goes: model, reference, export, pre-pass, calibration, QDQ.

The default GPU run builds one such artifact per ResNet beside its prelude (`deepgap.drive.prepare`), and the
run waits for the longest before its first GPU configuration. This builds each model's artifact from an
empty cache, as the worker's ``prepare`` request does (`measure.configuration.prepare_only` → the engine's
`model_file`), and prints each phase's seconds, so the cost can be named before it is cut:

    python benchmarks/ort_build_time.py [--models resnet18,resnet50,resnet101] [--threads N] [--jsonl F]
    python benchmarks/ort_build_time.py --beside [--jsonl F]

``--beside`` builds the default GPU run's host-CPU artifacts exactly as the run does beside its prelude
(`deepgap.drive.prepare.prepare_beside`: its worker processes, their threads, the same requests), from an
empty cache, with nothing else running, and prints the run's log line and each build's info. Run it with
another tree's ``src`` on PYTHONPATH to set two versions side by side.

Phases: ``build`` (build_model: seeded weights, the activation taming), ``reference`` (the worker's fp32
reference rows), ``export`` (torch.onnx), ``pre_process`` (ORT's shape inference and optimization),
``load`` (quantize_static's model load with shape inference), ``calibrator`` (the augmented model and its
session), ``collect`` (inference over the calibration batches), ``ranges`` (compute_data), ``qdq`` (the
QDQ rewrite), ``save``, ``session`` (the quantized model's InferenceSession and first batch-1 run).
Each model runs in this one process, one after another; the caches are in a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

PHASES: dict[str, float] = defaultdict(float)
CPU: dict[str, float] = defaultdict(float)  # the process's CPU seconds (all threads) in each phase


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextmanager
def phase(name: str):
    t0, c0 = time.perf_counter(), cpu_s()
    try:
        yield
    finally:
        PHASES[name] += time.perf_counter() - t0
        CPU[name] += cpu_s() - c0


def timed(obj, attr: str, name: str) -> None:
    """Wrap ``obj.attr`` so that each call adds its seconds to ``PHASES[name]``."""
    fn = getattr(obj, attr)

    def wrapper(*a, **k):
        with phase(name):
            return fn(*a, **k)

    setattr(obj, attr, wrapper)


def instrument() -> None:
    """Time the steps inside the export and ORT's quantize_static (module attributes, so its calls see them)."""
    import importlib

    from onnxruntime.quantization.onnx_model import ONNXModel
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    from deepgap.measure.engines import onnx_export, ort_quant

    q = importlib.import_module("onnxruntime.quantization.quantize")
    timed(onnx_export, "_export", "export")
    timed(ort_quant, "_preprocess", "pre_process")
    timed(q, "load_model_with_shape_infer", "load")
    timed(QDQQuantizer, "quantize_model", "qdq")
    timed(ONNXModel, "save_model_to_file", "save")
    make = q.create_calibrator

    def create(*a, **k):
        with phase("calibrator"):
            cal = make(*a, **k)
        timed(cal, "collect_data", "collect")
        timed(cal, "compute_data", "ranges")
        return cal

    q.create_calibrator = create


def build(name: str, cache: str, threads: int) -> dict[str, float]:
    import onnxruntime as ort
    import torch

    from deepgap.measure.engines import get_engine
    from deepgap.measure.models.build import build_model, example_batch
    from deepgap.measure.worker import CORRECTNESS_IMAGES

    PHASES.clear()
    CPU.clear()
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    with phase("build"):
        model = build_model(name, 224, None, 0)
    with phase("reference"), torch.inference_mode():
        x = example_batch(name, CORRECTNESS_IMAGES, 224, torch.Generator().manual_seed(1))
        torch.cat([model(x[i : i + 1]) for i in range(x.shape[0])])
    engine = get_engine("onnxruntime", {"cache_dir": cache})

    class Spec:  # the fields `model_file` reads
        model, resolution, precision = name, 224, "int8"

    info: dict = {}
    path = engine.model_file(model, Spec, info)
    with phase("session"):
        so = engine.session_options()
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        sess.run(None, {sess.get_inputs()[0].name: x[:1].numpy()})
    out = {k: round(v, 2) for k, v in PHASES.items()}
    out["total"] = round(time.perf_counter() - t0, 2)
    out["quantize_other"] = round(
        info.get("quantize_s", 0)
        - sum(PHASES[k] for k in ("pre_process", "load", "calibrator", "collect", "ranges", "qdq", "save")),
        2,
    )
    out["exporter"] = info.get("exporter")
    out["cpu_s"] = {k: round(v, 1) for k, v in CPU.items()}  # over wall seconds: the threads it kept busy
    return out


def beside(models: list[str], jsonl: str | None) -> None:
    """The default GPU run's artifact builds (`prepare_beside`), timed from the start to the last one's end."""
    import os

    from deepgap.drive.plan import host_cpu
    from deepgap.drive.prepare import prepare_beside
    from deepgap.drive.presets import cpu_baseline_spec, default_spec
    from deepgap.drive.runner import SweepRunner

    cores = os.cpu_count() or 1
    spec = default_spec(True, cores).replace(device="cuda", cpu_cores=cores)
    with tempfile.TemporaryDirectory(prefix="ort-beside-") as cache:
        os.environ["DEEPGAP_CACHE"] = cache  # the workers inherit it: every build a miss
        t0 = time.perf_counter()
        host = [c for c in host_cpu(spec) if c.model in models]
        bg = prepare_beside(host, lambda: SweepRunner(cpu_baseline_spec(spec, cores), "cpu"), print)
        if bg is None:
            print("no artifact to build (is onnxruntime installed?)")
            return
        bg.finish()
        total = round(time.perf_counter() - t0, 1)
    for cfg, info in bg.built:
        keep = {k: v for k, v in info.items() if k.endswith("_s") or k in ("failed", "calibration_threads")}
        row = {"model": cfg.model, "beside": True, "cores": cores, "total": total, **keep}
        print(json.dumps(row, default=str), flush=True)
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")


def main() -> None:
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,resnet50,resnet101")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--beside", action="store_true", help="the run's own builds beside the prelude, at once")
    args = ap.parse_args()
    if args.beside:
        beside(args.models.split(","), args.jsonl)
        return
    instrument()
    with tempfile.TemporaryDirectory(prefix="ort-build-") as cache:
        for name in args.models.split(","):
            row = {
                "model": name,
                "threads": args.threads,
                "cpus": os.cpu_count(),
                **build(name, cache, args.threads),
            }
            print(json.dumps(row), flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
