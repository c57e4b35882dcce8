"""The serving worker's handlers (``serve.*``): build one model with one engine, then serve load levels.

Runs in the worker process only (`deepgap.measure.worker`); the parent names this module
(`deepgap.serving.run.process`) and never imports it. ``serve.setup`` checks the engine's outputs on the
ring's uint8 images (normalised on the device) against the fp32 model on the CPU, prepares one engine
instance per batch size (one for eager, which takes any shape), and calibrates the service curve the
simulator is fed; ``serve.level`` and ``serve.loadgen`` run load against the executor it keeps.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from deepgap.core.progress import Phases
from deepgap.measure import correctness
from deepgap.measure.worker import handles, inputs_for, is_oom
from deepgap.serving.run.process import (
    CORRECTNESS_ROWS,
    DYNAMIC_ENGINES,
    LevelRequest,
    SetupReply,
    SetupRequest,
)
from deepgap.serving.worker.ring import InputRing
from deepgap.serving.worker.server import PipelinedExecutor, measure_curve, run_closed, run_level
from deepgap.serving.worker.setup_common import engine_for, setup_phases, setup_reply


def _setup(state: Any, req: SetupRequest) -> tuple[Any, SetupReply]:
    engine, spec1 = engine_for(state, req)
    torch.backends.cudnn.benchmark = req.cudnn_benchmark
    notes: list[str] = []
    phases = setup_phases()
    runs, info, dtype, first = _prepare(state, req, engine, notes, phases)
    phases.done(f"{req.engine} prepared for {len(runs)} batch size(s)")
    cuda = req.device.startswith("cuda")
    ring = InputRing(max(req.pool_size, max(runs)), req.resolution, req.seed, pin=cuda)
    executor = PipelinedExecutor(runs, req.device, dtype, req.memory_format == "channels_last", ring)
    agreement = _agreement(state, req, executor, ring)
    phases.done("outputs checked against fp32")
    accuracy = None
    if req.options.get(
        "dataset"
    ):  # accuracy mode: the served engine at its first batch size, before the curve
        from types import SimpleNamespace

        from deepgap.measure.accuracy.evaluate import evaluate

        req1 = SimpleNamespace(spec=first[1], options=req.options, weights=req.weights, seed=req.seed)
        accuracy = evaluate(state, req1, first[0], req.options.get("min_accuracy"))
        phases.done("accuracy evaluated")
    samples, parts, note = measure_curve(
        executor,
        req.curve_warmup,
        req.curve_iterations,
        req.curve_min_time_s,
        on_oom=is_oom,
        engine_min_time_s=req.engine_min_time_s,
    )
    phases.done("service curve calibrated")
    if note:
        notes.append(note)
    executor.buckets = sorted(samples)
    reply = setup_reply(
        state,
        req,
        executor,
        samples,
        parts,
        agreement,
        phases,
        engine_info={
            **info,
            "serving_depth": executor.depth,
            "input": "uint8 NHWC ring, normalised on the device",
        },
        notes=notes,
        accuracy=accuracy,
    )
    return executor, reply


def _prepare(state: Any, req: SetupRequest, engine: Any, notes: list[str], phases: Phases):
    """Each bucket's prepared callable (as many as fit): the runs, engine info, input dtype, the first's.

    A slow engine (a compile, a quant engine's tuning) has its batch said after 10 quiet seconds (`Phases.tick`).
    """
    ref_x, _ = state.reference(req.model, req.resolution, req.weights, req.seed)
    runs: dict[int, Any] = {}
    info: dict[str, Any] = {}
    dtype = None
    first = None  # (Prepared, ConfigSpec) of the first batch size: what accuracy mode scores
    for b in req.buckets:
        if runs and req.engine in DYNAMIC_ENGINES:
            runs[b] = runs[req.buckets[0]]
            continue
        phases.tick(f"preparing {req.engine} at batch {b}")
        spec = req.config(b, include_transfer=True)
        x_host, _ = inputs_for(spec, ref_x, torch.float32)
        try:
            prepared = engine.prepare(
                state.model(req.model, req.resolution, req.weights, req.seed), spec, x_host
            )
        except BaseException as exc:
            if not is_oom(exc) or not runs:
                raise
            notes.append(f"preparing batch {b} ran out of memory; batches stop at {max(runs)}")
            break
        runs[b] = prepared.run
        first = first or (prepared, spec)
        dtype = prepared.input_dtype
        info = dict(prepared.info)
    return runs, info, dtype, first


def _agreement(state: Any, req: SetupRequest, executor: PipelinedExecutor, ring: InputRing) -> dict[str, Any]:
    """The served engine's outputs against the fp32 model's (`deepgap.measure.correctness`)."""
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
        agreement = correctness.compare(
            executor.output(kk).float().cpu(),
            ref_out,
            req.precision,
            "state-dict" if req.weights else "random",
        ).to_dict()
    return agreement


@handles("serve.setup")
def handle_setup(state: Any, req: SetupRequest) -> SetupReply:
    """Worker handler ``serve.setup``: build and calibrate; the executor is kept for the levels."""
    if req.cache_len:  # a decoder (`deepgap.serving.worker.llm_setup`)
        from deepgap.serving.worker.llm_setup import llm_setup as setup
    elif req.seq_lens:  # a text model (`deepgap.serving.worker.text_setup`)
        from deepgap.serving.worker.text_setup import text_setup as setup
    else:
        setup = _setup
    t0 = time.perf_counter()
    executor, reply = setup(state, req)
    reply.setup_s = time.perf_counter() - t0
    state.held["executor"] = executor
    return reply


@handles("serve.level")
def handle_level(state: Any, req: LevelRequest) -> Any:
    """Worker handler ``serve.level``: one load level (or a closed single-stream run); its RequestLog."""
    executor = state.held["executor"]
    if req.out_lengths is not None:  # a decoder's level: continuous batching
        from deepgap.serving.worker.llm_setup import run_llm_level

        return run_llm_level(executor, req)
    if req.lengths is not None:
        from deepgap.serving.worker.text_setup import run_text_level

        return run_text_level(executor, req)
    if req.closed:
        return run_closed(executor, req.min_queries, req.min_duration_s, req.max_queries, req.start_at)
    return run_level(executor, req.arrivals_s, req.policy, req.stop, req.start_at)


@handles("serve.loadgen")
def handle_loadgen(state: Any, req: Any) -> Any:
    """Worker handler ``serve.loadgen``: MLCommons LoadGen against the kept executor (or the null SUT)."""
    from deepgap.serving.loadgen.sut import drive

    return drive(None if req.null else state.held["executor"], req)
