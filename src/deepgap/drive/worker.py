"""The worker process: measures what the parent sends over a pipe, one handler per request kind.

Why a separate process: a segfault, a hang, a sticky CUDA error or a leaked allocation costs the
configuration in flight only — the parent records it and starts a fresh worker. A worker keeps the
models it built, so a batch sweep of one model builds it once.

The protocol (one for every kind of run): a handler is a function ``(state, payload) -> value`` that
registers itself under a request kind with `handles` when its module is imported (the measure, thermal,
idle and env handlers below; the features' own in ``serving/process.py``, ``roofline/profile.py`` and
``roofline/peaks.py``). The parent looks the kind up in `HANDLERS` and sends ``(kind, handler, payload)``;
the handler travels by reference (pickle names its module), so the worker process imports the feature
that registered it and this module names no feature. The worker answers ``("ok", value)``, or
``("failed", (status, reason, traceback))`` when the handler raised (`failure` is the one
exception → status mapping). The parent side is `deepgap.drive.runner.WorkerHandle.call`.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import (
    Correctness,
    DeviceMemUsed,
    EngineInfo,
    MemoryPeaks,
    ResultDetails,
    Window,
)
from deepgap.measure.models.inputs import example_batch
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.timing import TimingProtocol

CORRECTNESS_IMAGES = 8  # rows compared against the fp32 reference


@dataclass(frozen=True)
class MeasureRequest:
    """Everything the worker needs for one configuration."""

    spec: ConfigSpec
    protocol: TimingProtocol
    weights: str | None = None
    seed: int = 0
    cudnn_benchmark: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    telemetry: TelemetrySettings | None = None  # None: telemetry off (deepgap.measure.telemetry.settings)


Handler = Callable[[Any, Any], Any]  # (WorkerState, payload) -> the reply's value

# Request kind → its handler, filled by `handles` as modules are imported. A handler module keeps its GPU
# imports inside its functions, so the parent, which imports it to register the kind, stays light.
HANDLERS: dict[str, Handler] = {}


def handles(*kinds: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of each request kind in ``kinds``."""

    def register(fn: Handler) -> Handler:
        for kind in kinds:
            HANDLERS[kind] = fn
        return fn

    return register


class StatusError(Exception):
    """Raised by a handler that knows the status to report (e.g. skipped: the engine cannot run here)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def failure(exc: BaseException) -> tuple[Status, str, str]:
    """The one exception → (status, one-line reason, traceback) mapping of every handler.

    OOM is its own status (the parent cascades it to larger batches) and carries no traceback;
    a `StatusError` keeps its status; anything else is an error with the traceback's tail.
    """
    if isinstance(exc, StatusError):
        return exc.status, exc.reason, ""
    oom = is_oom(exc)
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
    return (Status.OOM, reason, "") if oom else (Status.ERROR, reason, traceback.format_exc()[-4000:])


def handler(kind: str) -> Handler:
    """The function registered for ``kind``; a `ValueError` for a kind no imported module registered."""
    if kind not in HANDLERS:
        raise ValueError(
            f"unknown worker request {kind!r} (known: {', '.join(sorted(HANDLERS))}); "
            "import the module whose handler registers it"
        )
    return HANDLERS[kind]


def is_oom(exc: BaseException) -> bool:
    """True for CUDA and CPU out-of-memory errors."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or "can't allocate memory" in msg or isinstance(exc, MemoryError)
    )


def bind_device(device: str) -> None:
    """Make ``device`` this process's current CUDA device, before any other CUDA work.

    Why: a stream, an event or a graph capture made without a device argument lands on the *current*
    device. A worker of lane ``cuda:1`` that left ``cuda:0`` current ran its model on ``cuda:1`` and
    timed ``cuda:0`` (issue 34). Under Ray (``CUDA_VISIBLE_DEVICES`` narrowed to the task's GPU) the
    device is plain ``cuda``: index 0 of what the process sees. NVML still finds the physical GPU by
    UUID (`deepgap.core.nvml_access.cuda_uuid`), whatever the numbering. A CPU device needs nothing.
    """
    if not str(device).startswith("cuda"):
        return
    import torch

    dev = torch.device(device)
    torch.cuda.set_device(dev.index if dev.index is not None else 0)


def check_devices(spec: ConfigSpec, caps: DeviceCaps, x: Any, prepared: Any, clock: Any) -> None:
    """Raise an error status when any of the configuration's work is on another device (guard a)."""
    from deepgap.core import guards

    why = guards.device_mismatch(
        spec.device,
        guards.observed_devices(x, prepared, clock, caps.kind),
        current=guards.current_device(caps.kind),
    )
    if why:
        raise StatusError(Status.ERROR, why)


def device_caps(device: str) -> DeviceCaps:
    """Probe ``device`` (creates the CUDA context in this worker, never in the parent)."""
    import torch

    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        return DeviceCaps(device, "cuda", p.name, (p.major, p.minor), p.total_memory)
    from deepgap.core.envinfo import cpu_model

    return DeviceCaps(device, "cpu", cpu_model())


class WorkerState:
    """Caches of one worker: built models, fp32 references, FLOP counts."""

    def __init__(self, device: str) -> None:
        import torch

        if torch.get_num_interop_threads() != 1:  # torch allows one setting per process; tests make several
            torch.set_num_interop_threads(1)  # the paper's host-side setting, once per process
        self.default_threads = torch.get_num_threads()
        bind_device(device)  # first: every stream, event and capture below lands on this device
        self.device = device
        self.caps = device_caps(device)
        self.models: dict[tuple[str, int, str | None, int], Any] = {}
        self.refs: dict[tuple[str, int, str | None, int], tuple[Any, Any]] = {}
        self.flops: dict[tuple[str, int, str | None, int], tuple[float | None, int, str]] = {}
        self.telemetry: dict[str, Any] = {}  # telemetry backends by name, opened on first use
        self.held: dict[str, Any] = {}  # what a handler keeps for the next requests (the serving executor)

    def model(self, name: str, res: int, weights: str | None, seed: int):
        """A fresh fp32 CPU copy of the model (engines may mutate what they receive)."""
        import copy

        from deepgap.measure.models import build_model

        key = (name, res, weights, seed)
        if key not in self.models:
            self.models = {key: build_model(name, res, weights, seed)}  # keep one model in memory
        return copy.deepcopy(self.models[key])

    def model_facts(
        self, name: str, res: int, weights: str | None, seed: int
    ) -> tuple[float | None, int, str]:
        """(FLOPs per image, parameter count, weights fingerprint), computed once per model."""
        key = (name, res, weights, seed)
        if key not in self.flops:
            import torch

            from deepgap.measure.models import weights_fingerprint
            from deepgap.measure.models.flops import count_flops

            m = self.model(name, res, weights, seed)
            try:
                with torch.inference_mode():
                    flops: float | None = count_flops(m, example_batch(name, 1, res))
            except Exception:
                flops = None
            self.flops[key] = (flops, sum(p.numel() for p in m.parameters()), weights_fingerprint(m))
        return self.flops[key]

    def reference(self, name: str, res: int, weights: str | None, seed: int):
        """Fixed inputs (CORRECTNESS_IMAGES rows, seeded) and the fp32 eager logits on the CPU."""
        import torch

        key = (name, res, weights, seed)
        if key not in self.refs:
            g = torch.Generator().manual_seed(seed + 1)
            x = example_batch(name, CORRECTNESS_IMAGES, res, g)  # images, or a text model's token ids
            m = self.model(name, res, weights, seed)
            with torch.inference_mode():  # one image at a time: small memory, any batch-size limit
                self.refs = {key: (x, torch.cat([m(x[i : i + 1]).float() for i in range(x.shape[0])]))}
        return self.refs[key]


def inputs_for(spec: ConfigSpec, ref_x, dtype):
    """Random (never zero) inputs for the batch; the first rows are the reference rows (ids stay int64)."""
    import torch

    g = torch.Generator().manual_seed(1234 + spec.batch_size)
    x = example_batch(spec.model, spec.batch_size, spec.resolution, g)
    k = min(spec.batch_size, ref_x.shape[0])
    x[:k] = ref_x[:k]
    if not x.is_floating_point():
        return x, k
    x = x.to(dtype)
    if spec.memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x, k


@handles("measure", "thermal")  # thermal: payload.telemetry.mode == "thermal"
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


def _release(state: WorkerState) -> None:
    import gc

    gc.collect()
    if state.caps.kind == "cuda":
        import torch

        torch.cuda.empty_cache()


def _measure(state: WorkerState, req: MeasureRequest) -> Result:
    import numpy as np
    import torch

    from deepgap.core import correctness, stats
    from deepgap.measure.engines import get_engine
    from deepgap.measure.telemetry.session import MeasureTelemetry
    from deepgap.measure.timing import CudaEventClock, HostClock, run_protocol

    spec = req.spec
    engine = get_engine(spec.engine, req.options)
    why_not = engine.available() or engine.supports(spec, state.caps)
    if why_not:
        return Result(spec=spec, status=Status.SKIPPED, reason=why_not)
    torch.set_num_threads(spec.threads or state.default_threads)  # never inherit the last configuration's
    torch.backends.cudnn.benchmark = req.cudnn_benchmark
    flops, params, sha = state.model_facts(spec.model, spec.resolution, req.weights, req.seed)
    ref_x, ref_y = state.reference(spec.model, spec.resolution, req.weights, req.seed)
    model = state.model(spec.model, spec.resolution, req.weights, req.seed)
    cuda = state.caps.kind == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(spec.device)
    x_host, k = inputs_for(spec, ref_x, torch.float32)
    prepared = engine.prepare(model, spec, x_host)
    del model
    if x_host.is_floating_point():  # a text model's token ids stay int64
        x_host = x_host.to(prepared.input_dtype)
    if spec.include_transfer and cuda:
        x_src = x_host.pin_memory()
        x = torch.empty_like(x_host, device=spec.device)
    else:
        x_src = None
        x = x_host.to(spec.device)

    prepare_peak = None
    if cuda:  # the set-up's peak (compile, capture, calibration) apart; then the peak of the run alone
        prepare_peak = MemoryPeaks(
            allocated=int(torch.cuda.max_memory_allocated(spec.device)),
            reserved=int(torch.cuda.max_memory_reserved(spec.device)),
        )
        torch.cuda.reset_peak_memory_stats(spec.device)
    run = prepared.run
    with torch.inference_mode():
        if x_src is not None:

            def step():
                x.copy_(x_src, non_blocking=True)
                return run(x)

        else:

            def step():
                return run(x)

        out = step()  # first call: correctness on the reference rows
        agreement = correctness.compare(
            out[:k], ref_y[:k], spec.precision, "state-dict" if req.weights else "random"
        )
        del out
        clock = CudaEventClock(spec.device) if cuda else HostClock()
        check_devices(spec, state.caps, x, prepared, clock)
        # Telemetry samples the whole protocol (warm-up and latency pass at a low rate); its energy
        # window is the pipelined windows, which run back to back and last ≥ energy_window_s.
        tel = MeasureTelemetry.for_request(state.telemetry, spec.device, req.telemetry, spec.batch_size)
        if tel is not None and tel.thermal_mode:
            return tel.thermal(step, clock, spec)  # run-level thermal warm-up: load until steady
        protocol = tel.protocol(req.protocol) if tel is not None else req.protocol
        with tel if tel is not None else contextlib.nullcontext():
            timings = run_protocol(step, tel.clock(clock) if tel is not None else clock, protocol)
        check_devices(spec, state.caps, x, prepared, clock)  # the events now have their device

    pooled = timings.pooled
    lat = stats.summarize(pooled)
    tput, tlo, thi = stats.throughput_from_latency(spec.batch_size, lat)
    result = Result(
        spec=spec,
        status=Status.OK,
        latency=lat,
        throughput_ips=tput,
        throughput_ci_low_ips=tlo,
        throughput_ci_high_ips=thi,
        throughput_pipelined_ips=timings.window_throughput(spec.batch_size),
        n_repeats=len(timings.samples_s),
        warmup=req.protocol.warmup,
        cv_repeats=stats.coefficient_of_variation([float(np.median(s)) for s in timings.samples_s]),
        target_ci=req.protocol.target_ci,
        ci_met=timings.ci_met,
        flops_per_image=flops,
        params=params,
        weights_sha=sha,
        samples_s=timings.samples_s,
    )
    result.details = ResultDetails(
        setup_s=prepared.setup_s,
        engine_info=EngineInfo.from_json(prepared.info),
        correctness=Correctness.from_json(agreement.to_dict()),
        windows=[Window(iterations=n, seconds=s) for n, s in timings.windows],
        ci_halfwidth_rel=timings.ci_halfwidth_rel,
        torch_threads=torch.get_num_threads(),
    )
    if spec.include_transfer:  # say what was timed: on a CPU device there is no host→device copy
        result.details.transfer = (
            "pinned host→device copy timed in every iteration"
            if x_src is not None
            else "none: the device is the host (CPU), no copy to time"
        )
    if tel is not None:
        tel.finish(result)
    if cuda:
        result.peak_mem_allocated_bytes = int(torch.cuda.max_memory_allocated(spec.device))
        result.peak_mem_reserved_bytes = int(torch.cuda.max_memory_reserved(spec.device))
        result.details.prepare_peak_mem_bytes = prepare_peak
    final = nvml_used_bytes(spec.device) if cuda else None
    tel_details = result.details.telemetry
    sampled = tel_details.max_device_mem_used_bytes if cuda and tel_details is not None else None
    if cuda:  # the true peak: the highest sampled reading during the protocol, or the one after it
        result.device_mem_used_bytes = true_peak(final, sampled)
        result.details.device_mem_used = DeviceMemUsed(final_bytes=final, sampled_max_bytes=sampled)
    # after every timed and memory figure; a stored min_accuracy of 0 is --min-accuracy off
    if req.options.get("dataset") or req.options.get("min_accuracy") is not None:
        from deepgap.measure.accuracy.evaluate import record

        record(state, req, prepared, result)
    from deepgap.core.guards import rate_checked

    result = rate_checked(result, state.caps.name)  # above the datasheet's peak: an error that says so
    try:
        import psutil

        result.host_rss_bytes = int(psutil.Process(os.getpid()).memory_info().rss)
    except ImportError:
        pass
    return result


def true_peak(final: int | None, sampled: int | None) -> int | None:
    """Device memory used at its peak: the sampler's maximum during the protocol or the reading after it."""
    return max((v for v in (final, sampled) if v is not None), default=None)


def nvml_used_bytes(device: str) -> int | None:
    """Device-wide used memory (NVML) — includes the CUDA context and other processes."""
    from deepgap.core import nvml_access

    try:
        with nvml_access.opened() as nv:
            uuid = nvml_access.cuda_uuid(device)
            if uuid is None:
                return None
            return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByUUID(uuid)).used)
    except Exception:  # noqa: BLE001 - no NVML or no such GPU: the field stays empty
        return None


@handles("env")
def handle_env(state: WorkerState, payload: Any) -> dict[str, Any]:
    """The environment fingerprint of the worker's device."""
    from deepgap.core import envinfo

    return envinfo.collect(state.device)


@handles("idle")  # payload: TelemetrySettings
def handle_idle(state: WorkerState, settings: Any) -> dict[str, Any]:
    """The run-level idle baseline (``settings``: TelemetrySettings)."""
    from deepgap.measure.telemetry.session import measure_idle

    return measure_idle(state.telemetry, state.device, settings)


def requests(conn) -> Iterator[tuple[str, Handler, Any]]:
    """``(kind, handler, payload)`` requests from the parent until it sends None or closes the pipe."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        yield msg


def serve(conn, device: str) -> None:
    """Worker main loop: say ``ready`` (or ``failed``), then answer requests until None."""
    try:
        state = WorkerState(device)
        conn.send(("ready", state.caps))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("failed", failure(exc)))
        return
    for _kind, fn, payload in requests(conn):
        try:
            reply: tuple[str, Any] = ("ok", fn(state, payload))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the parent gets a status, never a dead pipe
            reply = ("failed", failure(exc))
        conn.send(reply)
