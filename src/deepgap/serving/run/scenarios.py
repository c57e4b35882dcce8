"""``deepgap serve`` for one model: calibrate, run the scenario for real, predict it.

`deepgap.serving.run.serve_run` runs it (`model_serving`, through `rows.one_model_run`) in the one driver
and stores it.

Every measured level is paired with the simulator's prediction for the *same* arrivals, fed the
service curve the worker calibrated moments before (same process, same engine instances, same
padding) — so "predicted vs measured" isolates what the simulator leaves out (host overheads
between batches, jitter beyond the calibration's, contention) rather than differences of setup.
"""

from __future__ import annotations

import math

import numpy as np

from deepgap.core.result_details import Accuracy
from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.process import LevelRequest, ServingWorker, SetupReply, SetupRequest
from deepgap.serving.run.rows import (
    ModelServing,
    Say,
    ServeOutcome,
    curve_rows,
    level_row,
    service_of,
)
from deepgap.serving.run.scenario_context import (
    ScenarioContext,
    engine_ips,
    engine_words,
    host_line,
    level_timeout,
)
from deepgap.serving.run.server_scenario import run_server
from deepgap.serving.run.spec import ServeSpec
from deepgap.serving.run.text_spec import text_lines, text_load
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.log import LevelSummary, summarize
from deepgap.serving.sim.simulator import simulate


def model_serving(
    spec: ServeSpec, device: str, trace: np.ndarray | None, say: Say, worker: ServingWorker, req: SetupRequest
) -> ModelServing:
    """How ``spec``'s scenario is run in ``worker`` once the model is built and calibrated there.

    A worker that could not start or answer (`ServingWorker.failure`) makes the run's one level a failed
    set-up, as a failed build does (`rows.one_model_run`).
    """

    def serve(reply: SetupReply, rec: ServeRecord, out: ServeOutcome) -> None:
        rec.curves = curve_rows(reply, req)
        load = text_load(spec.seq_len_dist, spec.padding, spec.model)
        service = service_of(reply, f"calibration of {spec.model}", load, spec.seed)
        if load is not None:  # each level's lengths, drawn in the worker's parent as the simulator draws them
            worker.seq_dist, worker.seed = load.dist, spec.seed
            say(
                f"serve: text requests of lengths {load.dist.label()} (mean {load.dist.mean():.1f}), "
                f"padding {load.pad.label()}, calibrated at padded lengths {', '.join(map(str, req.seq_lens))}"
            )
        for note in reply.notes:
            say(f"serve: note: {note}")
        if reply.correctness.get("flagged"):
            say(
                f"serve: WARNING: outputs differ from the fp32 reference (relL2={reply.correctness.get('rel_l2'):.3g})"
            )
        ctx = ScenarioContext(spec, req, worker, service, rec, out, say, trace, reply.curve_parts_s)
        try:
            {"single-stream": _single_stream, "offline": _offline, "server": run_server}[spec.scenario](ctx)
            if load is not None:
                text_lines(rec, out.summary, out.lines)
            if spec.loadgen:
                from deepgap.serving.run.loadgen_run import run_loadgen

                run_loadgen(ctx)
        finally:  # this set-up's own facts (`one_model_run` adds the rest), on levels a stop keeps too
            for lv in rec.levels:
                lv.details.notes = reply.notes
                lv.details.accuracy = Accuracy.from_json(reply.accuracy) if reply.accuracy else None

    building = (
        f"serve: building {spec.model} ({spec.engine}, {spec.precision}, {spec.memory_format}) on "
        f"{device} and calibrating batches {', '.join(map(str, req.buckets))}"
    )
    return ModelServing(building, serve)


def _single_stream(c: ScenarioContext) -> None:
    minq, mind = c.spec.minimums()
    maxq = c.spec.max_queries
    c.say(f"serve: single-stream, until {minq} queries and {mind:g} s (at most {maxq} queries)")
    req = LevelRequest(
        None, BatchPolicy(1, 0.0), closed=True, min_queries=minq, min_duration_s=mind, max_queries=maxq
    )
    log = c.worker.level(req, level_timeout(minq, None) + mind)
    s = summarize(log, None, c.spec.slo_s, 0.99, c.spec.confidence)
    samples = np.asarray(c.service.samples_s[c.service.bucket(1)])
    pred = LevelSummary(
        **{
            **s.__dict__,
            "achieved_qps": 1.0 / float(samples.mean()),
            "latency_mean_s": float(samples.mean()),
            "latency_p90_s": float(np.percentile(samples, 90)),
            "latency_p99_s": float(np.percentile(samples, 99)),
            "useful_tokens_per_s": None,  # not predicted: a copy of the measured level's would read as one
            "padded_tokens_per_s": None,
        }
    )
    c.rec.levels.append(
        level_row(
            c.req,
            "single-stream",
            "single-stream",
            BatchPolicy(1, 0.0),
            None,
            "closed",
            c.spec.seed,
            s,
            pred,
            log,
        )
    )
    c.out.summary.update(
        single_stream_p90_s=s.latency_p90_s,
        single_stream_p99_s=s.latency_p99_s,
        single_stream_mean_s=s.latency_mean_s,
        single_stream_n=s.n,
        single_stream_predicted_p90_s=pred.latency_p90_s,
        **s.tail_fields("single_stream"),
    )
    c.out.lines.append(
        f"single-stream: p90 {s.latency_p90_s * 1e3:.3f} ms (MLPerf's metric), p50 "
        f"{s.latency_p50_s * 1e3:.3f} ms, {s.tail_words()} over {s.n} queries; "
        f"calibration predicted p90 {pred.latency_p90_s * 1e3:.3f} ms"
    )


def _offline(c: ScenarioContext) -> None:
    minq, mind = c.spec.minimums()
    sv = c.service
    cands = (
        [c.spec.max_batch]
        if c.spec.max_batch
        else sorted(sv.batch_sizes, key=lambda b: -b / sv.interval_at(b))[:3]
    )
    best: tuple[float, int] | None = None
    for b in cands:
        n = max(minq, math.ceil(mind / sv.interval_at(b)) * b)
        n = int(math.ceil(n / b) * b)
        n = min(n, max(b, c.spec.max_queries // b * b))  # --max-queries caps it, in whole batches
        times = np.zeros(n)
        pol = BatchPolicy(int(b), 0.0)
        c.say(f"serve: offline, {n} samples at batch {b}")
        log = c.worker.level(LevelRequest(times, pol), level_timeout(n, None) + 4 * n * sv.median_at(b) / b)
        s = summarize(log, None, None)
        pred = summarize(simulate(times, pol, sv, seed=c.spec.seed), None, None)
        c.rec.levels.append(
            level_row(c.req, "offline", "offline", pol, None, "all-at-once", c.spec.seed, s, pred, log)
        )
        c.say(f"serve:   {s.achieved_qps:,.1f} samples/s; {host_line(s)}")
        if best is None or s.achieved_qps > best[0]:
            best = (s.achieved_qps, b, pred.achieved_qps)
    assert best is not None
    c.out.summary.update(offline_ips=best[0], offline_batch=best[1], offline_predicted_ips=best[2])
    engine = engine_ips(c)
    if engine:
        c.out.summary.update(
            engine_ips=engine[0], engine_batch=engine[1], offline_vs_engine=best[0] / engine[0]
        )
    c.out.lines.append(
        f"offline: {best[0]:,.1f} samples/s at batch {best[1]} (calibration predicted "
        f"{best[2]:,.1f}); tried batches {', '.join(map(str, cands))}"
        + (
            f"; the engine alone ({engine_words(c)}): offline / engine {best[0] / engine[0]:.3f}"
            if engine
            else ""
        )
    )
