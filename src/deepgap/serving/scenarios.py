"""``deepgap serve`` for one model: calibrate, run the scenario for real, predict it.

`deepgap.serving.serve_run` runs it (`_run_single`) through the one driver and stores it.

Every measured level is paired with the simulator's prediction for the *same* arrivals, fed the
service curve the worker calibrated moments before (same process, same engine instances, same
padding) — so "predicted vs measured" isolates what the simulator leaves out (host overheads
between batches, jitter beyond the calibration's, contention) rather than differences of setup.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.core.records import Status
from deepgap.core.result_details import Accuracy, Correctness, EngineInfo
from deepgap.drive.runner import WorkerLost
from deepgap.serving import arrivals as arr
from deepgap.serving.batcher import BatchPolicy, StopRule
from deepgap.serving.capacity import (
    DROP_AFTER_SLOS,
    CapacityResult,
    LoadSettings,
    Probe,
    candidate_policies,
    find_capacity,
    schedule,
    search_policies,
)
from deepgap.serving.details import CapacityDetails, CapacityProbe
from deepgap.serving.log import LevelSummary, summarize
from deepgap.serving.process import LevelRequest, ServingWorker, SetupFailed, SetupRequest
from deepgap.serving.rows import (
    Say,
    ServeOutcome,
    curve_rows,
    level_row,
    run_spec,
    service_of,
)
from deepgap.serving.sim import ServiceModel, simulate
from deepgap.serving.spec import DEFAULT_POLICY, ServeSpec
from deepgap.serving.storage import ServeRecord


def _timeout(n: int, rate: float | None) -> float:
    return 120.0 + (4.0 * n / rate if rate else 600.0)


def _run_single(
    spec: ServeSpec,
    device: str,
    trace: np.ndarray | None,
    store_path: str,
    say: Say,
    worker: ServingWorker,
    req: SetupRequest,
    command: str,
) -> tuple[ServeRecord, ServeOutcome]:
    """Build, calibrate and run ``spec``'s scenario in ``worker``, launched and past its prelude.

    A worker that could not start or answer (`ServingWorker.failure`) makes the run's one level a failed
    set-up, as a failed build does.
    """
    rec = ServeRecord(spec=run_spec(spec, device, [spec.model]), command=command, env={"device": device})
    out = ServeOutcome(None, os.path.abspath(store_path))
    try:
        try:
            if worker.failure is not None:
                raise worker.failure
            rec.env = worker.env or rec.env
            say(
                f"serve: building {spec.model} ({spec.engine}, {spec.precision}, {spec.memory_format}) on "
                f"{device} and calibrating batches {', '.join(map(str, req.buckets))}"
            )
            reply = worker.setup(req, spec.timeout_s)
        except (SetupFailed, WorkerLost) as exc:
            status = exc.status.value if isinstance(exc.status, Status) else str(exc.status)
            rec.levels.append(
                level_row(
                    req,
                    spec.scenario,
                    "setup",
                    None,
                    spec.qps,
                    "",
                    spec.seed,
                    None,
                    status=status,
                    reason=exc.reason.splitlines()[0],
                )
            )
            out.status, out.reason = status, exc.reason.splitlines()[0]
            out.lines.append(f"{status}: {out.reason}")
            return rec, out
        rec.curves = curve_rows(reply, req)
        service = service_of(reply, f"calibration of {spec.model}")
        for note in reply.notes:
            say(f"serve: note: {note}")
        if reply.correctness.get("flagged"):
            say(
                f"serve: WARNING: outputs differ from the fp32 reference (relL2={reply.correctness.get('rel_l2'):.3g})"
            )
        ctx = _Ctx(spec, req, worker, service, rec, out, say, trace, reply.curve_parts_s)
        {"single-stream": _single_stream, "offline": _offline, "server": _server}[spec.scenario](ctx)
        if spec.loadgen:
            from deepgap.serving.loadgen_run import run_loadgen

            run_loadgen(ctx)
        for lv in rec.levels:  # the worker's set-up, on every level of the run
            d = lv.details
            d.correctness, d.notes = Correctness.from_json(reply.correctness), reply.notes
            d.engine_info = EngineInfo.from_json(reply.engine_info)
            d.device_mem_used_bytes_at_setup = setup_memory(reply)
            d.accuracy = Accuracy.from_json(reply.accuracy) if reply.accuracy else None
    finally:
        worker.stop()
    return rec, out


def setup_memory(reply: Any) -> int | None:
    """The device memory in use after the build, for each level (the run row is opened before it)."""
    return reply.env.get("device_mem_used_bytes_at_setup")


@dataclass
class _Ctx:
    spec: ServeSpec
    req: SetupRequest
    worker: ServingWorker
    service: ServiceModel
    rec: ServeRecord
    out: ServeOutcome
    say: Say
    trace: np.ndarray | None
    parts: dict[int, dict[str, float]] = field(default_factory=dict)  # calibration parts per batch size


def _single_stream(c: _Ctx) -> None:
    minq, mind = c.spec.minimums()
    c.say(f"serve: single-stream, at least {minq} queries and {mind:g} s")
    log = c.worker.level(
        LevelRequest(None, BatchPolicy(1, 0.0), closed=True, min_queries=minq, min_duration_s=mind),
        _timeout(minq, None) + mind,
    )
    s = summarize(log, None, c.spec.slo_s, 0.99, c.spec.confidence)
    samples = np.asarray(c.service.samples_s[c.service.bucket(1)])
    pred = LevelSummary(
        **{
            **s.__dict__,
            "achieved_qps": 1.0 / float(samples.mean()),
            "latency_mean_s": float(samples.mean()),
            "latency_p90_s": float(np.percentile(samples, 90)),
            "latency_p99_s": float(np.percentile(samples, 99)),
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
    )
    c.out.lines.append(
        f"single-stream: p90 {s.latency_p90_s * 1e3:.3f} ms (MLPerf's metric), p50 "
        f"{s.latency_p50_s * 1e3:.3f} ms, p99 {s.latency_p99_s * 1e3:.3f} ms over {s.n} queries; "
        f"calibration predicted p90 {pred.latency_p90_s * 1e3:.3f} ms"
    )


def _offline(c: _Ctx) -> None:
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
        times = np.zeros(n)
        pol = BatchPolicy(int(b), 0.0)
        c.say(f"serve: offline, {n} samples at batch {b}")
        log = c.worker.level(LevelRequest(times, pol), _timeout(n, None) + 4 * n * sv.median_at(b) / b)
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
            f"; the engine alone on device-resident inputs: {engine[0]:,.1f} img/s at batch "
            f"{engine[1]} (offline / engine {best[0] / engine[0]:.3f})"
            if engine
            else ""
        )
    )


def engine_ips(c: _Ctx) -> tuple[float, int] | None:
    """(img/s, batch) of the engine alone at its best calibrated batch: the sweep's offline number."""
    rates = [(b / p["engine_s"], b) for b, p in c.parts.items() if p.get("engine_s")]
    return max(rates) if rates else None


def host_line(log_summary: LevelSummary) -> str:
    """Where a batch's time goes: host issue time beside the device's copy-in, compute and copy-out."""
    s = log_summary
    return (
        f"per batch: host {s.host_mean_s * 1e3:.3f} ms, h2d {s.h2d_mean_s * 1e3:.3f} ms, compute "
        f"{s.compute_mean_s * 1e3:.3f} ms, d2h {s.d2h_mean_s * 1e3:.3f} ms "
        f"(mean batch {s.mean_batch:.1f})"
    )


def _real_probe(c: _Ctx, policy: BatchPolicy, load: LoadSettings, purpose: str) -> Callable[[float], Probe]:
    def probe(rate: float) -> Probe:
        n = load.n_for(rate)
        times = schedule(rate, n, load.seed, c.trace)
        stop = load.stop_rule(n, rate)
        c.say(f"serve: {policy.label()} at {rate:,.1f} queries/s ({n} queries)")
        log = c.worker.level(LevelRequest(times, policy, stop), _timeout(n, rate))
        s = summarize(log, rate, load.slo_s, load.percentile, load.confidence)
        pred = summarize(
            simulate(times, policy, c.service, seed=load.seed, stop=stop),
            rate,
            load.slo_s,
            load.percentile,
            load.confidence,
        )
        c.rec.levels.append(
            level_row(
                c.req,
                "server",
                purpose,
                policy,
                rate,
                "trace" if c.trace is not None else "poisson",
                load.seed,
                s,
                pred,
                log,
                phase=policy.label(),
            )
        )
        c.say(
            f"serve:   p99 {s.latency_p99_s * 1e3:.3f} ms (predicted {pred.latency_p99_s * 1e3:.3f}), "
            f"{s.verdict}" + (f", {s.n_dropped} dropped" if s.n_dropped else "") + f"; {host_line(s)}"
        )
        return Probe(rate, s, s.verdict == "pass")

    return probe


def _server(c: _Ctx) -> None:
    spec, sv = c.spec, c.service
    minq, mind = spec.minimums()
    load = LoadSettings(
        slo_s=spec.slo_s or math.inf,
        confidence=spec.confidence,
        min_queries=minq,
        min_duration_s=mind,
        max_queries=spec.max_queries,
        seed=spec.seed,
    )
    if not spec.find_capacity:
        policy = BatchPolicy(
            min(spec.max_batch or DEFAULT_POLICY[0], sv.max_batch),
            spec.max_delay_s if spec.max_delay_s is not None else DEFAULT_POLICY[1],
        )
        rate = spec.qps or arr.trace_rate_qps(c.trace)
        n = arr.n_queries(rate, minq, mind)
        if c.trace is not None and not spec.qps:  # a trace replays whole (the minimums may lengthen it)
            n = max(n, len(c.trace))
        times = schedule(rate, n, spec.seed, c.trace)
        stop = StopRule(
            max_time_s=3.0 * n / rate + 5.0, drop_after_s=DROP_AFTER_SLOS * spec.slo_s if spec.slo_s else None
        )
        c.say(f"serve: server, {policy.label()} at {rate:,.1f} queries/s ({n} queries)")
        log = c.worker.level(LevelRequest(times, policy, stop), _timeout(n, rate))
        s = summarize(log, rate, spec.slo_s, 0.99, spec.confidence)
        pred = summarize(
            simulate(times, policy, sv, seed=spec.seed, stop=stop), rate, spec.slo_s, 0.99, spec.confidence
        )
        c.rec.levels.append(
            level_row(
                c.req,
                "server",
                "fixed",
                policy,
                rate,
                "trace" if c.trace is not None else "poisson",
                spec.seed,
                s,
                pred,
                log,
                phase=policy.label(),
            )
        )
        overloaded = bool(s.n_dropped or log.stop_kind == "time")
        c.out.summary.update(
            server_qps=rate,
            server_p99_s=s.latency_p99_s,
            server_predicted_p99_s=pred.latency_p99_s,
            server_verdict=s.verdict,
            server_achieved_qps=s.achieved_qps,
            server_dropped=s.n_dropped,
            server_late=s.n_over_slo,
            server_overloaded=overloaded,
            server_host_mean_s=s.host_mean_s,
        )
        verdict = f", SLO {spec.slo_s * 1e3:g} ms: {s.verdict}" if spec.slo_s else ""
        c.out.lines.append(
            f"server: {rate:,.1f} queries/s offered, {s.achieved_qps:,.1f} served, p99 "
            f"{s.latency_p99_s * 1e3:.3f} ms (simulator {pred.latency_p99_s * 1e3:.3f} ms), "
            f"mean batch {s.mean_batch:.2f}{verdict}"
        )
        c.out.lines.append(f"server: {host_line(s)}")
        if overloaded:
            c.out.lines.append(
                f"server: OVERLOADED at {rate:,.1f} queries/s: {s.n_dropped} of {s.n_planned} requests "
                f"dropped (waited over {DROP_AFTER_SLOS:g}× the {spec.slo_s * 1e3:g} ms SLO: the queue is "
                f"bounded), "
                f"{s.n_over_slo} served late"
                if spec.slo_s
                else f"server: OVERLOADED at {rate:,.1f} queries/s: {log.stopped}"
            )
        return
    _find_capacity(c, load)


def _capacity_row(c: _Ctx, r: CapacityResult, predicted: float | None) -> dict[str, Any]:
    return {
        "tenant": "",
        "source": r.source,
        "model": c.req.model,
        "engine": c.req.engine,
        "precision": c.req.precision,
        "device": c.req.device,
        "device_name": c.rec.env.get("device_name", ""),
        "memory_format": c.req.memory_format,
        "resolution": c.req.resolution,
        "slo_s": r.slo_s,
        "percentile": 0.99,
        "confidence": c.spec.confidence,
        "max_batch": r.policy.max_batch,
        "max_delay_s": r.policy.max_delay_s,
        "capacity_qps": r.capacity_qps,
        "upper_qps": r.upper_qps,
        "predicted_qps": predicted,
        "n_probes": len(r.probes),
        "note": r.note,
        "details": CapacityDetails(
            probes=[
                CapacityProbe(
                    rate_qps=p.rate_qps,
                    verdict=p.summary.verdict,
                    n=p.summary.n,
                    p99_s=p.summary.latency_p99_s,
                    n_over_slo=p.summary.n_over_slo,
                )
                for p in r.probes
            ]
        ),
    }


def _find_capacity(c: _Ctx, load: LoadSettings) -> None:
    spec, sv = c.spec, c.service
    caps = [b for b in sv.batch_sizes if not spec.max_batch or b <= spec.max_batch]
    cands = candidate_policies(
        sv, load.slo_s, caps, delays_s=None if spec.max_delay_s is None else [spec.max_delay_s]
    )
    if not cands:
        why = (
            f"no batch size is served within the SLO: batch {sv.batch_sizes[0]} takes "
            f"{sv.median_at(sv.batch_sizes[0]) * 1e3:.3f} ms ≥ {load.slo_s * 1e3:g} ms"
        )
        c.out.summary.update(capacity_qps=0.0, capacity_note=why)
        c.out.lines.append(f"server capacity: 0 — {why}")
        return
    c.say(f"serve: simulating {len(cands)} batching policies on the calibrated curve")
    ranked = search_policies(sv, load, cands, c.trace, rel_tol=spec.rel_tol)
    measured: list[CapacityResult] = []
    for r in ranked[: spec.verify_policies]:
        ceiling = sv.saturation_qps(r.policy.max_batch) * 1.3
        start = r.capacity_qps if r.capacity_qps > 0 else 0.5 * sv.saturation_qps(r.policy.max_batch)
        m = find_capacity(
            _real_probe(c, r.policy, load, "probe"),
            r.policy,
            load.slo_s,
            start_qps=start,
            ceiling_qps=ceiling,
            growth=1.1,
            rel_tol=spec.rel_tol,
            source="measured",
        )
        measured.append(m)
        c.rec.capacities.append(_capacity_row(c, m, r.capacity_qps))
        c.say(
            f"serve: {r.policy.label()}: measured {m.capacity_qps:,.1f} queries/s, simulated {r.capacity_qps:,.1f}"
        )
    verified = {m.policy for m in measured}
    for r in ranked:  # the simulator's search: a policy never run for real is labelled as such
        row = _capacity_row(c, r, r.capacity_qps)
        row["details"].verified = r.policy in verified
        if r.policy not in verified:
            row["note"] = "; ".join(x for x in ("unverified (simulated only)", row["note"]) if x)
        c.rec.capacities.append(row)
    best = max(measured, key=lambda m: m.capacity_qps)
    at = best.at_capacity
    engine = engine_ips(c)
    sim = next(r for r in ranked if r.policy == best.policy)
    pred = sim.capacity_qps
    # Each capacity is the highest passing rate below the lowest failing one: a bracket as wide as the
    # search's rel_tol. The real search starts at the prediction, so measured == predicted means that
    # both brackets coincide, i.e. agreement within that width (not to the last query per second).
    c.out.summary.update(
        capacity_qps=best.capacity_qps,
        capacity_predicted_qps=pred,
        capacity_max_batch=best.policy.max_batch,
        capacity_upper_qps=best.upper_qps,
        capacity_predicted_upper_qps=sim.upper_qps,
        capacity_max_delay_s=best.policy.max_delay_s,
        slo_p99_s=load.slo_s,
        capacity_sim_best_qps=ranked[0].capacity_qps,
        capacity_sim_best_policy=ranked[0].policy.label(),
        capacity_sim_best_verified=ranked[0].policy in verified,
    )
    if at is not None:
        c.out.summary.update(
            capacity_host_mean_s=at.summary.host_mean_s,
            capacity_h2d_mean_s=at.summary.h2d_mean_s,
            capacity_compute_mean_s=at.summary.compute_mean_s,
            capacity_mean_batch=at.summary.mean_batch,
            capacity_p99_s=at.summary.latency_p99_s,
        )
    if engine:
        c.out.summary.update(
            engine_ips=engine[0], engine_batch=engine[1], capacity_vs_engine=best.capacity_qps / engine[0]
        )
    c.out.lines.append(
        f"server capacity at p99 ≤ {load.slo_s * 1e3:g} ms: {best.capacity_qps:,.1f} queries/s with "
        f"{best.policy.label()} (simulator predicted {pred:,.1f}; measured/predicted "
        f"{best.capacity_qps / pred if pred else float('nan'):.3f}); simulated best of {len(ranked)} policies: "
        f"{ranked[0].policy.label()} at {ranked[0].capacity_qps:,.1f}"
        f"{'' if ranked[0].policy in verified else ' (unverified: simulated only)'}"
    )
    if at is not None:
        c.out.lines.append(f"server capacity: {host_line(at.summary)}")
    if engine:
        c.out.lines.append(
            f"server capacity / the engine alone ({engine[0]:,.1f} img/s at batch "
            f"{engine[1]}, "
            f"device-resident inputs): {best.capacity_qps / engine[0]:.3f}"
        )
