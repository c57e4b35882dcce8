"""``serve.setup`` and ``serve.level`` for a text model: build, check padded batches, calibrate per length.

Runs in the worker process only. Correctness is checked where padding could break it: one batch of
requests of *different* lengths, padded and masked as served, against the fp32 model on the CPU run on
each request alone at its own length (no padding at all). The service curve is calibrated at each
padded length the simulator needs (`SetupRequest.seq_lens`, longest first: a batch size that runs out
of memory there ends every length's curve), every request of a calibration batch that long.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from deepgap.measure import correctness
from deepgap.measure.models import resolve_model
from deepgap.measure.worker import inputs_for, is_oom
from deepgap.serving.run.process import CORRECTNESS_ROWS, LevelRequest, SetupReply, SetupRequest
from deepgap.serving.sim.clock import RealClock
from deepgap.serving.sim.log import RequestLog
from deepgap.serving.sim.queues import serve_queues
from deepgap.serving.sim.seqlen import Padding, queue_order
from deepgap.serving.worker.server import measure_curve, quiet_gc, run_closed
from deepgap.serving.worker.setup_common import engine_for, setup_phases, setup_reply
from deepgap.serving.worker.text_executor import TokenExecutor


def text_setup(state: Any, req: SetupRequest) -> tuple[TokenExecutor, SetupReply]:
    """Build ``req.model`` with its engine, check a padded batch, calibrate every length's curve."""
    longest = max(req.seq_lens)
    engine, spec1 = engine_for(state, req)
    ref_x, _ = state.reference(req.model, longest, req.weights, req.seed)
    x_host, _ = inputs_for(req.config(req.buckets[-1], include_transfer=True), ref_x, torch.float32)
    phases = setup_phases()
    prepared = engine.prepare(state.model(req.model, longest, req.weights, req.seed), spec1, x_host)
    phases.done(f"{req.engine} prepared")
    executor = TokenExecutor(
        prepared.run,
        req.device,
        list(req.buckets),
        resolve_model(req.model).max_seq_len,
        resolve_model(req.model).vocab_size,
        Padding(req.padding_edges, req.packed),
        req.masked,
        req.pool_size,
        req.seed,
    )
    agreement = _agreement(state, req, executor, longest)
    phases.done("outputs checked against each request alone in fp32")
    by_len: dict[int, dict[int, list[float]]] = {}
    parts_by_len: dict[int, dict[int, dict[str, float]]] = {}
    notes: list[str] = []
    for length in sorted(req.seq_lens, reverse=True):
        executor.fixed = length
        samples, parts, note = measure_curve(  # the engine alone is compared at the longest length
            executor,
            req.curve_warmup,
            req.curve_iterations,
            req.curve_min_time_s,
            on_oom=is_oom,
            engine_min_time_s=req.engine_min_time_s if length == max(req.seq_lens) else 0.0,
        )
        if note:
            notes.append(f"length {length}: {note}")
        executor.buckets = sorted(samples)  # a size that ran out of memory is gone for every length
        by_len[length], parts_by_len[length] = samples, parts
        phases.tick(f"service curve calibrated at length {length}")
    phases.done(f"service curves calibrated at {len(req.seq_lens)} length(s)")
    executor.fixed = None
    sizes = executor.buckets
    by_len = {v: {b: s[b] for b in sizes} for v, s in by_len.items()}
    parts_by_len = {v: {b: p[b] for b in sizes} for v, p in parts_by_len.items()}
    reply = setup_reply(
        state,
        req,
        executor,
        by_len[longest],  # its batches: `sizes`, every length's
        parts_by_len[longest],
        agreement,
        phases,
        engine_info={
            **dict(prepared.info),
            "serving_depth": executor.depth,
            "input": "int64 token-id ring, "
            + (
                "packed on the device (padding removed)"
                if req.packed
                else "padded on the device"
                + (" with a key padding mask" if req.masked else " (one length: no padding)")
            ),
        },
        notes=notes,
        curves_by_len=by_len,
        parts_by_len=parts_by_len,
    )
    return executor, reply


def _agreement(state: Any, req: SetupRequest, executor: TokenExecutor, longest: int) -> dict[str, Any]:
    """A batch of requests of different lengths, padded as served, against each alone in fp32."""
    kk = min(CORRECTNESS_ROWS, executor.buckets[-1])
    lengths = np.asarray([max(1, longest * (kk - i) // kk) for i in range(kk)], dtype=np.int64)
    if not req.masked:  # one length: nothing is ever padded
        lengths[:] = longest
    model = state.model(req.model, longest, req.weights, req.seed)
    ids = executor.ring[:kk].cpu()
    with torch.inference_mode():
        ref_out = torch.cat([model(ids[i : i + 1, : lengths[i]]).float() for i in range(kk)])
        del model
        executor.set_level(lengths)
        executor(0, kk)
        executor.sync()
        got = executor.output(kk).float().cpu()
    executor.set_level(lengths[:1])
    return correctness.compare(
        got, ref_out, req.precision, "state-dict" if req.weights else "random"
    ).to_dict()


def run_text_level(executor: TokenExecutor, req: LevelRequest) -> RequestLog:
    """One text level: requests in queue order with their lengths, through the batcher; tokens counted."""
    assert req.lengths is not None
    if req.closed:
        executor.set_level(req.lengths)
        log = run_closed(executor, req.min_queries, req.min_duration_s, req.max_queries, req.start_at)
    else:
        order, starts = queue_order(req.lengths, executor.pad)
        executor.set_level(req.lengths[order])
        arrivals = np.asarray(req.arrivals_s, dtype=np.float64)[order]
        with torch.inference_mode(), quiet_gc():
            clock = RealClock(time.perf_counter() + 0.005 if req.start_at is None else req.start_at)
            clock.sleep_until(0.0)
            log = serve_queues(arrivals, starts, req.policy, clock, executor, req.stop)
    log.useful_tokens, log.padded_tokens = executor.useful_tokens, executor.padded_tokens
    return log
