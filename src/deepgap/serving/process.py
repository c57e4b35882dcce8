"""The serving worker process: builds one model with one engine, then serves load levels on request.

Why a process: the parent (CLI) never touches the GPU, a crash or hang costs the run only its
status, and tenants — one process each — share a GPU the way separate services do. The worker
reuses the measurement worker's model cache (`deepgap.worker.WorkerState`), checks the engine's
outputs on the ring's uint8 images (normalised on the device) against the fp32 model on the CPU,
prepares one engine instance per batch size (one for eager, which
takes any shape), and calibrates the service curve the simulator is fed.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.records import ConfigSpec, Status
from deepgap.runner import WorkerHandle, WorkerLost
from deepgap.serving.batcher import BatchPolicy, StopRule

DYNAMIC_ENGINES = ("eager",)  # engines whose one prepared instance takes any batch size
CORRECTNESS_ROWS = 4  # ring images checked against the fp32 model on the CPU


@dataclass(frozen=True)
class SetupRequest:
    """What the worker builds and how it calibrates."""

    model: str
    engine: str
    precision: str
    memory_format: str
    resolution: int
    device: str
    buckets: tuple[int, ...]
    threads: int | None = None
    weights: str | None = None
    seed: int = 0
    pool_size: int = 256
    curve_warmup: int = 10
    curve_iterations: int = 50
    curve_min_time_s: float = 0.0
    cudnn_benchmark: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # engine options; "dataset": accuracy mode


@dataclass
class SetupReply:
    """What the worker found: the device, its service curve, correctness, and notes."""

    caps: Any
    env: dict[str, Any]
    buckets: tuple[int, ...]
    curve_samples_s: dict[int, list[float]]
    curve_parts_s: dict[int, dict[str, float]]
    correctness: dict[str, Any]
    engine_info: dict[str, Any]
    setup_s: float
    notes: list[str] = field(default_factory=list)
    peak_mem_reserved_bytes: int | None = None
    accuracy: dict[str, Any] | None = None  # top-1/top-5 on the dataset at the first batch size (accuracy mode)


@dataclass(frozen=True)
class LevelRequest:
    """One run: an arrival schedule and a policy (``closed``: single-stream instead)."""

    arrivals_s: np.ndarray | None
    policy: BatchPolicy
    stop: StopRule | None = None
    start_at: float | None = None  # perf_counter instant shared by tenants
    closed: bool = False
    min_queries: int = 0
    min_duration_s: float = 0.0


class SetupFailed(Exception):
    """The worker could not build or calibrate: status (oom/skipped/error) and reason."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _setup(state: Any, req: SetupRequest) -> tuple[Any, SetupReply]:
    import torch

    from deepgap import correctness, envinfo
    from deepgap.engines import get_engine
    from deepgap.serving.ring import InputRing
    from deepgap.serving.server import PipelinedExecutor, measure_curve
    from deepgap.worker import _inputs, _nvml_used, is_oom

    t0 = time.perf_counter()
    spec1 = ConfigSpec(model=req.model, engine=req.engine, precision=req.precision, batch_size=req.buckets[0],
                       device=req.device, memory_format=req.memory_format, threads=req.threads,
                       resolution=req.resolution, include_transfer=True)
    engine = get_engine(req.engine, req.options)
    why_not = engine.available() or engine.supports(spec1, state.caps)
    if why_not:
        raise SetupFailed(Status.SKIPPED, why_not)
    torch.set_num_threads(req.threads or state.default_threads)
    torch.backends.cudnn.benchmark = req.cudnn_benchmark
    ref_x, _ = state.reference(req.model, req.resolution, req.weights, req.seed)
    runs: dict[int, Any] = {}
    info: dict[str, Any] = {}
    notes: list[str] = []
    dtype = None
    first = None  # (Prepared, ConfigSpec) of the first batch size: what accuracy mode scores
    for b in req.buckets:
        if runs and req.engine in DYNAMIC_ENGINES:
            runs[b] = runs[req.buckets[0]]
            continue
        spec = ConfigSpec(**{**spec1.__dict__, "batch_size": b})
        x_host, _ = _inputs(spec, ref_x, torch.float32)
        try:
            prepared = engine.prepare(state.model(req.model, req.resolution, req.weights, req.seed), spec, x_host)
        except BaseException as exc:
            if not is_oom(exc) or not runs:
                raise
            notes.append(f"preparing batch {b} ran out of memory; batches stop at {max(runs)}")
            break
        runs[b] = prepared.run
        first = first or (prepared, spec)
        dtype = prepared.input_dtype
        info = dict(prepared.info)
    cuda = req.device.startswith("cuda")
    ring = InputRing(max(req.pool_size, max(runs)), req.resolution, req.seed, pin=cuda)
    executor = PipelinedExecutor(runs, req.device, dtype, req.memory_format == "channels_last", ring)
    # Correctness: the engine, fed the ring's uint8 images through the device normalisation, against the
    # fp32 model on the CPU fed the same images normalised there.
    kk = min(CORRECTNESS_ROWS, executor.buckets[0])
    ref_in = executor.norm.reference(ring.images[:kk].cpu())
    model = state.model(req.model, req.resolution, req.weights, req.seed)
    with torch.inference_mode():
        ref_out = torch.cat([model(ref_in[i : i + 1]).float() for i in range(kk)])
        del model
        executor(0, kk)
        executor.sync()
        agreement = correctness.compare(executor.output(kk).float().cpu(), ref_out, req.precision).to_dict()
    accuracy = None
    if req.options.get("dataset"):  # accuracy mode: the served engine at its first batch size, before the curve
        from types import SimpleNamespace

        from deepgap.accuracy.evaluate import evaluate

        req1 = SimpleNamespace(spec=first[1], options=req.options, weights=req.weights, seed=req.seed)
        accuracy = evaluate(state, req1, first[0], req.options.get("min_accuracy"))
    samples, parts, note = measure_curve(executor, req.curve_warmup, req.curve_iterations, req.curve_min_time_s,
                                         on_oom=is_oom)
    if note:
        notes.append(note)
    executor.buckets = sorted(samples)
    reply = SetupReply(
        caps=state.caps, env=envinfo.collect(req.device), buckets=tuple(sorted(samples)),
        curve_samples_s=samples, curve_parts_s=parts, correctness=agreement,
        engine_info={**info, "serving_depth": executor.depth,
                     "input": "uint8 NHWC ring, normalised on the device"},
        setup_s=time.perf_counter() - t0, notes=notes, accuracy=accuracy,
    )
    if executor.cuda:
        reply.peak_mem_reserved_bytes = int(torch.cuda.max_memory_reserved(req.device))
        used = _nvml_used(req.device)
        if used is not None:
            reply.env = {**reply.env, "device_mem_used_bytes_at_setup": used}
    return executor, reply


def process_main(conn: Any, device: str, req: SetupRequest) -> None:
    """Worker entry point: set up, reply, then serve ("level", LevelRequest) requests until None."""
    from deepgap.serving.server import run_closed, run_level
    from deepgap.worker import WorkerState, is_oom, requests

    try:
        state = WorkerState(device)
        executor, reply = _setup(state, req)
    except SetupFailed as exc:
        conn.send(("failed", (exc.status, exc.reason)))
        return
    except BaseException as exc:  # noqa: BLE001 - becomes a stored status, never a traceback on screen
        status = Status.OOM if is_oom(exc) else Status.ERROR
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
        conn.send(("failed", (status, msg if status == Status.OOM else f"{msg}\n{traceback.format_exc()[-2000:]}")))
        return
    conn.send(("ready", reply))
    for kind, payload in requests(conn):
        try:
            if kind == "level" and payload.closed:
                out = run_closed(executor, payload.min_queries, payload.min_duration_s, start_at=payload.start_at)
            elif kind == "level":
                out = run_level(executor, payload.arrivals_s, payload.policy, payload.stop, payload.start_at)
            elif kind == "loadgen":
                from deepgap.serving.loadgen import drive

                conn.send(("loadgen", drive(executor, payload)))
                continue
            else:
                raise ValueError(f"unknown request {kind!r}")
            conn.send(("log", out))
        except BaseException as exc:  # noqa: BLE001
            status = Status.OOM if is_oom(exc) else Status.ERROR
            conn.send(("failed", (status, f"{type(exc).__name__}: {exc}".splitlines()[0][:400])))


class ServingWorker(WorkerHandle):
    """Parent-side handle of one serving worker (reuses the measurement worker's pipe handling)."""

    def start_serving(self, req: SetupRequest, timeout_s: float) -> SetupReply:
        """Start the process, build and calibrate; raises `SetupFailed` or `WorkerLost`."""
        kind, payload = self.spawn(process_main, (self.device, req), f"deepgap-serve-{req.model}", timeout_s)
        if kind != "ready":
            self.stop()
            raise SetupFailed(*payload)
        self.caps = payload.caps
        return payload

    def send_level(self, req: LevelRequest) -> None:
        """Send a level without waiting (tenants start together)."""
        try:
            self.conn.send(("level", req))
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerLost(Status.CRASH, "serving worker was gone before the request") from None

    def receive_log(self, timeout_s: float):
        """The RequestLog of the level sent last; raises `SetupFailed` for a failure inside it."""
        kind, payload = self._recv(timeout_s)
        if kind != "log":
            raise SetupFailed(*payload)
        return payload

    def loadgen(self, req: Any, timeout_s: float) -> dict[str, Any]:
        """Run MLCommons LoadGen against the worker's server; its summary and our request log."""
        try:
            self.conn.send(("loadgen", req))
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerLost(Status.CRASH, "serving worker was gone before the request") from None
        kind, payload = self._recv(timeout_s)
        if kind != "loadgen":
            raise SetupFailed(*payload)
        return payload

    def level(self, req: LevelRequest, timeout_s: float):
        """Run one level and return its RequestLog."""
        self.send_level(req)
        return self.receive_log(timeout_s)
