"""Measuring one configuration in the worker process: build, check against fp32, time, record.

Why apart from the worker process (`deepgap.measure.worker`): that module is the process every kind of
run shares (its loop, model caches and failure mapping); this is what a sweep asks of it, the
``measure`` and ``thermal`` requests (`deepgap.measure.protocol.MeasureRequest`), step by step: the
engine prepares the model, the first call is checked against the fp32 reference, telemetry samples the
timing protocol, and the result carries its memory peaks, accuracy and guards.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from deepgap.core import guards, stats
from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec, Result, Status, is_resident
from deepgap.core.result_details import (
    Correctness,
    DeviceMemUsed,
    EngineInfo,
    MemoryPeaks,
    ResultDetails,
    Window,
)
from deepgap.measure import correctness, graph_runner, text_input
from deepgap.measure.device import CudaEventClock
from deepgap.measure.engines import get_engine
from deepgap.measure.protocol import MeasureRequest, StatusError
from deepgap.measure.resident import resident_input
from deepgap.measure.telemetry.measuring import MeasureTelemetry
from deepgap.measure.timing import HostClock, ok_result, run_protocol
from deepgap.measure.worker import (
    CORRECTNESS_IMAGES,
    WorkerState,
    failure,
    handles,
    inputs_for,
    nvml_used_bytes,
    true_peak,
)


def check_devices(spec: ConfigSpec, caps: DeviceCaps, x: Any, prepared: Any, clock: Any) -> None:
    """Raise an error status when any of the configuration's work is on another device (guard a)."""
    why = guards.device_mismatch(
        spec.device,
        guards.observed_devices(x, prepared, clock, caps.kind),
        current=guards.current_device(caps.kind),
    )
    if why:
        raise StatusError(Status.ERROR, why)


@handles("measure", "thermal")  # thermal: payload.telemetry.thermal
def measure(state: WorkerState, req: MeasureRequest) -> Result:
    """Measure one configuration; never raises (failures become statuses)."""
    spec = req.spec
    started = time.time()
    t0 = time.perf_counter()
    try:
        res = _measure(state, req)
    except BaseException as exc:  # noqa: BLE001 - every failure must become a stored status
        if isinstance(exc, KeyboardInterrupt):
            raise
        status, reason, tb = failure(exc)
        res = Result(spec=spec, status=status, reason=reason)
        if tb:
            res.details.traceback = tb
    finally:
        _release(state)
    res.started_at = started
    res.duration_s = time.perf_counter() - t0
    return res


@handles("prepare")
def prepare_only(state: WorkerState, req: MeasureRequest) -> dict[str, Any]:
    """Build ``req``'s engine as a measurement would, time nothing, and say what it built.

    Why: an engine whose set-up writes a cached artifact (ONNX Runtime's export and int8 quantization,
    about 50 s for the three ResNets on a 16-core host) can build it beside the run's prelude, which
    measures only the idle GPU and warms it (`deepgap.drive.prepare`); the configuration's own
    measurement then finds the artifact cached. The process runs niced, so the warm-up's launches keep
    their core, on ``spec.threads`` threads (its share of the cores: `deepgap.drive.prepare.build_threads`),
    and makes only the reference inputs, not their fp32 logits, which nothing here compares against.
    Returns the engine's info (cache hit or miss, seconds), or ``{"skipped": why}``.
    """
    spec = req.spec
    if multiprocessing.parent_process() is not None:  # a worker process of its own (not a test's)
        with contextlib.suppress(OSError):
            os.nice(10)
    engine = get_engine(spec.engine, req.options)
    why_not = engine.available() or engine.supports(spec, state.caps)
    if why_not:
        return {"skipped": why_not}
    torch.set_num_threads(spec.threads or state.default_threads)
    try:
        ref_x = state.reference_inputs(spec.model, spec.resolution, req.seed)
        return dict(_prepare(state, req, engine, ref_x).prepared.info)
    finally:
        _release(state)


def _release(state: WorkerState) -> None:
    gc.collect()
    if state.caps.kind == "cuda":
        torch.cuda.empty_cache()


@dataclass
class _Prepared:
    """A configuration ready to time: the engine's prepared model, its input on the device, the step."""

    prepared: Any
    x: Any  # the batch on the device
    x_src: Any  # the pinned host batch copied in every step (include_transfer on a GPU), else None
    k: int  # reference rows at the head of the batch
    step: Callable[[], Any]
    prepare_peak: MemoryPeaks | None
    text: Any = None  # a mixed-length text input's batch (`text_input`), else None
    model: Any = None  # the model the engine prepared, set to that batch (the attention its layout ran)
    flops_ratio: float | None = None  # its FLOPs per sequence over a full-length sequence's


def _measure(state: WorkerState, req: MeasureRequest) -> Result:
    """Prepare, check the first output against fp32, time under telemetry, then record what was found."""
    spec = req.spec
    if spec.is_decode:  # a decoder's generation, not a forward pass (`decode_config`)
        from deepgap.measure.decode_config import measure_decode_config

        return measure_decode_config(state, req)
    engine = get_engine(spec.engine, req.options)
    why_not = engine.available() or engine.supports(spec, state.caps)
    if why_not:
        return Result(spec=spec, status=Status.SKIPPED, reason=why_not)
    torch.set_num_threads(spec.threads or state.default_threads)  # never inherit the last configuration's
    torch.backends.cudnn.benchmark = req.cudnn_benchmark
    if req.telemetry is not None and req.telemetry.thermal:  # as decode_config's tel.thermal_mode
        return _thermal(state, req, engine)
    facts = state.model_facts(spec.model, spec.resolution, req.weights, req.seed)  # FLOPs, params, sha
    lengths = text_input.reference_lengths(spec, CORRECTNESS_IMAGES)  # () but for a mixed-length text input
    ref_x, ref_y = state.reference(spec.model, spec.resolution, req.weights, req.seed, lengths)
    p = _prepare(state, req, engine, ref_x)
    cuda = state.caps.kind == "cuda"
    with torch.inference_mode():
        out = p.step()  # first call: correctness on the reference rows
        agreement = correctness.compare(
            out[: p.k], ref_y[: p.k], spec.precision, "state-dict" if req.weights else "random"
        )
        del out
        clock = CudaEventClock(spec.device) if cuda else HostClock()
        check_devices(spec, state.caps, p.x, p.prepared, clock)
        # Telemetry samples the whole protocol (warm-up and latency pass at a low rate); its energy
        # window is the pipelined windows, which run back to back and last ≥ energy_window_s.
        tel = MeasureTelemetry.for_request(state.telemetry, spec.device, req.telemetry, spec.batch_size)
        protocol = tel.protocol(req.protocol) if tel is not None else req.protocol
        with tel if tel is not None else contextlib.nullcontext():
            timings = run_protocol(p.step, tel.clock(clock) if tel is not None else clock, protocol)
        check_devices(spec, state.caps, p.x, p.prepared, clock)  # the events now have their device
        why = p.prepared.faults() if getattr(p.prepared, "faults", None) else None
        if why:  # a kernel flagged a failure its outputs need not show: no number from these runs
            raise StatusError(Status.ERROR, why)
    result = _timed_result(req, facts, timings, p, agreement)
    if tel is not None:
        tel.finish(result)
    if cuda:
        _memory(result, spec.device, p.prepare_peak)
    # after every timed and memory figure; a stored min_accuracy of 0 is --min-accuracy off
    if req.options.get("dataset") or req.options.get("min_accuracy") is not None:
        from deepgap.measure.accuracy.evaluate import record

        record(state, req, p.prepared, result)
    result = guards.rate_checked(result, state.caps.name)  # above the datasheet's peak: an error that says so
    try:
        import psutil

        result.host_rss_bytes = int(psutil.Process(os.getpid()).memory_info().rss)
    except ImportError:
        pass
    return result


def _thermal(state: WorkerState, req: MeasureRequest, engine: Any) -> Result:
    """The run-level thermal warm-up: the configuration's step, run until the device is steady.

    Why not through the measurement's first steps: nothing here is stored as a figure, so the model's FLOP
    count, weight fingerprint and fp32 reference logits would be computed for nothing. For a decoder's
    warm-up (serve's 8B) those cost minutes on the host with the GPU idle (session 52: 140 s of 250).
    """
    spec = req.spec
    ref_x = state.reference_inputs(spec.model, spec.resolution, req.seed)  # the batch's shape, no logits
    p = _prepare(state, req, engine, ref_x)
    cuda = state.caps.kind == "cuda"
    with torch.inference_mode():
        p.step()  # the first call builds what the engine builds lazily (graphs, autotuning), as a run's does
        clock = CudaEventClock(spec.device) if cuda else HostClock()
        tel = MeasureTelemetry.for_request(state.telemetry, spec.device, req.telemetry, spec.batch_size)
        assert tel is not None  # a thermal request carries its telemetry settings
        return tel.thermal(p.step, clock, spec)


def _prepare(state: WorkerState, req: MeasureRequest, engine: Any, ref_x: Any) -> _Prepared:
    """The engine prepares a fresh copy of the model; the batch goes to the device; the step is built."""
    spec = req.spec
    cuda = state.caps.kind == "cuda"
    model = state.model(spec.model, spec.resolution, req.weights, req.seed)
    if cuda:
        torch.cuda.reset_peak_memory_stats(spec.device)
    x_host, k = inputs_for(spec, ref_x, torch.float32)
    text = text_input.batch_of(spec, ref_x.shape[0])
    text_model = ratio = None
    if text is not None:  # the model packs or masks this batch itself; its ids are each row cut to its length
        x_host = text_input.apply(model, text, x_host)
        text_model, ratio = model, text_input.flops_ratio(model, text, spec.resolution)
    prepared = engine.prepare(model, spec, x_host)
    del model
    x_src = None
    if is_resident(spec.input_mode):  # the engine's resident input, made once here, outside the timed window
        x = resident_input(spec, prepared, x_host.to(spec.device))
    else:
        if x_host.is_floating_point():  # a text model's token ids stay int64
            x_host = x_host.to(prepared.input_dtype)
        if spec.include_transfer and cuda:
            x_src = x_host.pin_memory()
            x = torch.empty_like(x_host, device=spec.device)
        else:
            x = x_host.to(spec.device)
    prepare_peak = None
    if cuda:  # the set-up's peak (compile, capture, calibration) apart; then the peak of the run alone
        prepare_peak = MemoryPeaks(
            allocated=int(torch.cuda.max_memory_allocated(spec.device)),
            reserved=int(torch.cuda.max_memory_reserved(spec.device)),
        )
        torch.cuda.reset_peak_memory_stats(spec.device)
    run = prepared.run
    if x_src is not None:

        def step():
            x.copy_(x_src, non_blocking=True)
            return run(x)

    else:
        bound = graph_runner.bound_input(run, x)  # where a captured graph reads it: no copy a replay
        if bound is not x:  # the engine's record says where its input sat
            prepared.info["static_input"] = "bound: the batch sits in the graph's input buffer"
        x = bound

        def step():
            return run(x)

    return _Prepared(prepared, x, x_src, k, step, prepare_peak, text, text_model, ratio)


def _timed_result(req: MeasureRequest, facts: tuple, timings: Any, p: _Prepared, agreement: Any) -> Result:
    """The stored row of a timed configuration: latency and throughput with their spread, and details."""
    spec = req.spec
    flops, params, sha = facts
    result = ok_result(
        spec,
        timings.pooled,
        throughput_pipelined_ips=timings.window_throughput(spec.batch_size),
        n_repeats=len(timings.samples_s),
        warmup=req.protocol.warmup,
        cv_repeats=stats.coefficient_of_variation([float(np.median(s)) for s in timings.samples_s]),
        target_ci=req.protocol.target_ci,
        ci_met=timings.ci_met,
        flops_per_image=flops * p.flops_ratio if flops is not None and p.flops_ratio is not None else flops,
        params=params,
        weights_sha=sha,
        samples_s=timings.samples_s,
    )
    result.details = ResultDetails(
        setup_s=p.prepared.setup_s,
        engine_info=EngineInfo.from_json(p.prepared.info),
        correctness=Correctness.from_json(agreement.to_dict()),
        windows=[Window(iterations=n, seconds=s) for n, s in timings.windows],
        ci_halfwidth_rel=timings.ci_halfwidth_rel,
        torch_threads=torch.get_num_threads(),
    )
    if p.text is not None:
        result.details.text_batch = text_input.details(p.text, p.model, spec)
    if is_resident(spec.input_mode):  # say what was timed: the engine's resident input, made before timing
        result.details.transfer = f"none: {spec.input_mode} input made on the device before timing"
    elif spec.include_transfer:  # say what was timed: on a CPU device there is no host→device copy
        result.details.transfer = (
            "pinned host→device copy timed in every iteration"
            if p.x_src is not None
            else "none: the device is the host (CPU), no copy to time"
        )
    return result


def _memory(result: Result, device: str, prepare_peak: MemoryPeaks | None) -> None:
    """A GPU configuration's memory: torch's peaks of the run alone, and the device's true peak (NVML)."""
    result.peak_mem_allocated_bytes = int(torch.cuda.max_memory_allocated(device))
    result.peak_mem_reserved_bytes = int(torch.cuda.max_memory_reserved(device))
    result.details.prepare_peak_mem_bytes = prepare_peak
    final = nvml_used_bytes(device)
    tel_details = result.details.telemetry
    sampled = tel_details.max_device_mem_used_bytes if tel_details is not None else None
    # the true peak: the highest sampled reading during the protocol, or the one after it
    result.device_mem_used_bytes = true_peak(final, sampled)
    result.details.device_mem_used = DeviceMemUsed(final_bytes=final, sampled_max_bytes=sampled)
