"""Profile one inference pass or training step: time it, then break it down per kernel with torch.profiler.

The paper's experiment, on any device: a training step is forward + cross-entropy + backward + SGD
update (momentum 0.9) at batch 64 by default; ``fp16``/``bf16`` training uses autocast mixed precision with
fp32 master weights (and a GradScaler for fp16), ``fp16``/``bf16`` inference casts the model as deepgap's
eager engine does; ``fp32`` switches TF32 off, ``tf32`` on.

Two passes, never mixed: (1) ``steps`` timed steps after ``warmup`` (CUDA events, or ``perf_counter`` on a
CPU) — the step time and achieved TFLOP/s come from these alone, without profiler overhead; (2)
``profiled_steps`` steps under torch.profiler (CPU + CUDA activity) with `OpCounter` annotating every aten op,
from which `deepgap.roofline.trace` builds the per-kernel and per-cluster tables.

Only worker-side code imports this module (`deepgap.roofline.worker`, `deepgap.roofline.ncu_child`), so torch
is imported at its top.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from deepgap.core.precision import FLOAT_PRECISIONS, float_precision_support
from deepgap.measure.device import CudaEventClock, device_caps, is_oom, set_tf32, torch_dtype
from deepgap.measure.models.build import build_model, example_batch
from deepgap.measure.models.flops import op_counter
from deepgap.measure.models.registry import resolve_model
from deepgap.measure.timing import HostClock
from deepgap.roofline import trace as tr
from deepgap.roofline.details import ProfileDetails
from deepgap.roofline.flops import model_cost
from deepgap.roofline.profile import MODES, ProfileResult, ProfileSpec
from deepgap.roofline.trace import OPS_KEY


def _why_not(spec: ProfileSpec) -> str | None:
    if spec.mode not in MODES:
        return f"mode must be infer or train, not {spec.mode!r}"
    if spec.precision not in FLOAT_PRECISIONS:
        return (
            f"profile runs PyTorch eager in {', '.join(FLOAT_PRECISIONS)}; "
            f"{spec.precision} needs a quantizing engine"
        )
    return float_precision_support(spec.precision, device_caps(spec.device))


def build_step(spec: ProfileSpec):
    """The model on the device and a zero-argument ``step()`` doing one inference pass or training step."""
    entry = resolve_model(spec.model)
    res = spec.resolution or entry.default_resolution
    model = build_model(spec.model, res, seed=spec.seed)
    set_tf32(spec.precision)
    dtype = torch_dtype(spec.precision)
    cl = spec.memory_format == "channels_last"
    g = torch.Generator().manual_seed(1234)
    x = example_batch(spec.model, spec.batch_size, res, g)  # images, or a text model's token ids
    dev_type = "cuda" if spec.device.startswith("cuda") else "cpu"
    if spec.mode == "infer":
        model = model.to(device=spec.device, dtype=dtype).eval()
        x = x.to(device=spec.device, dtype=dtype) if x.is_floating_point() else x.to(spec.device)
        if cl and x.dim() == 4:
            model, x = (
                model.to(memory_format=torch.channels_last),
                x.contiguous(memory_format=torch.channels_last),
            )

        def step():
            with torch.inference_mode():
                return model(x)

        return model, step, res
    model = model.to(spec.device).train()
    x = x.to(spec.device)
    if cl and x.dim() == 4:
        model, x = (
            model.to(memory_format=torch.channels_last),
            x.contiguous(memory_format=torch.channels_last),
        )
    y = torch.randint(0, entry.num_classes, (spec.batch_size,), generator=g).to(spec.device)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    amp = spec.precision in ("fp16", "bf16")
    scaler = torch.amp.GradScaler(dev_type) if spec.precision == "fp16" and dev_type == "cuda" else None

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev_type, dtype=dtype, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    return model, train_step, res


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def profile_step(step, spec: ProfileSpec, trace_path: str) -> list[dict[str, Any]]:
    """Run ``profiled_steps`` steps under torch.profiler with annotated ops; write the trace; return ops."""
    cuda = spec.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    counter = op_counter(annotate=True)
    _sync(spec.device)
    with profile(activities=acts) as prof:
        for _ in range(spec.profiled_steps):
            with counter:
                step()
        _sync(spec.device)
    prof.export_chrome_trace(trace_path)
    records = [asdict(r) for r in counter.records]
    with open(trace_path) as fh:
        trace = json.load(fh)
    trace[OPS_KEY] = records
    trace["deepgapProfile"] = asdict(spec)
    with open(trace_path, "w") as fh:
        json.dump(trace, fh)
    return records


def run_profile(spec: ProfileSpec, trace_dir: str | None = None) -> ProfileResult:
    """Time and profile one configuration; never raises for a failing model (status/reason instead)."""
    res = ProfileResult(spec=spec, started_at=time.time())
    t0 = time.perf_counter()
    why = _why_not(spec)
    if why:
        res.status, res.reason = "skipped", f"unavailable: {why}"
        return res
    model = step = None
    try:
        torch.backends.cudnn.benchmark = True
        model, step, res.resolution = build_step(spec)
        cost = model_cost(spec.model, res.resolution, spec.mode)
        res.cost = cost.to_dict()
        for _ in range(spec.warmup):
            step()
        clock = CudaEventClock(spec.device) if spec.device.startswith("cuda") else HostClock()
        res.step_times_s = [clock.time_iteration(step) for _ in range(spec.steps)]
        res.step_time_median_s = statistics.median(res.step_times_s)
        b = spec.batch_size
        res.throughput_ips = b / res.step_time_median_s
        res.flops_per_step = cost.flops(b)
        res.bytes_per_step = cost.traffic_bytes(b, spec.precision)
        res.min_bytes_per_step = cost.min_bytes(b, spec.precision)
        res.achieved_tflops = res.flops_per_step / res.step_time_median_s / 1e12
        keep = trace_dir is not None
        if keep:
            os.makedirs(trace_dir, exist_ok=True)
            path = os.path.join(trace_dir, f"{spec.model}-{spec.mode}-{spec.precision}-bs{b}.trace.json")
        else:
            fd, path = tempfile.mkstemp(suffix=".trace.json")
            os.close(fd)
        try:
            records = profile_step(step, spec, path)
            kernels = tr.kernels_from_trace(path, records)
        finally:
            if not keep:
                os.unlink(path)
        res.trace_path = path if keep else None
        res.kernels = tr.kernel_table(kernels, spec.profiled_steps)
        res.clusters = tr.cluster_table(res.kernels)
        res.kernel_time_per_step_s = float(res.kernels["time_per_step_s"].sum())
        res.attributed_flops_per_step = float(res.kernels["flops_per_step"].sum())
        res.details = ProfileDetails(
            profiled_ops_per_step=len(records) / spec.profiled_steps,
            counted_flops_per_step=sum(r["flops"] for r in records) / spec.profiled_steps,
            # GPU: kernel time / step time (low = launch-bound); CPU op times under a profiler are not
            busy_fraction=res.kernel_time_per_step_s / res.step_time_median_s
            if spec.device.startswith("cuda")
            else None,
            unattributed_kernel_time_s=float(sum(k.dur_us for k in kernels if k.op_index is None))
            * 1e-6
            / spec.profiled_steps,
            step_time_mean_s=statistics.fmean(res.step_times_s),
            step_time_min_s=min(res.step_times_s),
            torch=torch.__version__,
        )
    except BaseException as exc:  # noqa: BLE001 - a failing model becomes a stored status
        if isinstance(exc, KeyboardInterrupt):
            raise
        res.status = "oom" if is_oom(exc) else "error"
        res.reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    finally:
        del model, step
        if spec.device.startswith("cuda"):
            torch.cuda.empty_cache()
        res.duration_s = time.perf_counter() - t0
    return res
