"""The server scenario: dynamic batching under Poisson (or traced) arrivals, and the capacity search.

Every measured level is paired with the simulator's prediction for the same arrivals (`sim.simulator`);
`--find-capacity` brackets and bisects the highest rate that meets the objective, for each candidate policy
the simulator ranks first, measured for real (`capacity.search`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from deepgap.core.stats import P99_MIN_N
from deepgap.serving.capacity.search import (
    DROP_AFTER_SLOS,
    CapacityResult,
    LoadSettings,
    Probe,
    candidate_policies,
    capacity_words,
    find_capacity,
    schedule,
    search_policies,
)
from deepgap.serving.records.details import engine_ratio_note
from deepgap.serving.run.process import LevelRequest
from deepgap.serving.run.rows import capacity_row, level_row, simulated_rows
from deepgap.serving.run.scenario_context import (
    ScenarioContext,
    engine_details,
    engine_ips,
    engine_words,
    host_line,
    level_timeout,
)
from deepgap.serving.run.spec import DEFAULT_POLICY
from deepgap.serving.sim import arrivals as arr
from deepgap.serving.sim.batcher import BatchPolicy, StopRule
from deepgap.serving.sim.log import summarize
from deepgap.serving.sim.simulator import simulate


def _level(
    c: ScenarioContext,
    purpose: str,
    policy: BatchPolicy,
    rate: float,
    times: Any,
    stop: StopRule,
    load: LoadSettings,
    slo_s: float | None,
) -> tuple[Any, Any, Any]:
    """Serve ``times`` for real and simulate them, record the level: (measured, predicted summary, log).

    ``slo_s``: the verdict's bound (a fixed level's may be None: no verdict; ``load``'s is infinite then).
    """
    log = c.worker.level(LevelRequest(times, policy, stop), level_timeout(len(times), rate))
    s = summarize(log, rate, slo_s, load.percentile, load.confidence)
    pred = summarize(
        simulate(times, policy, c.service, seed=load.seed, stop=stop),
        rate,
        slo_s,
        load.percentile,
        load.confidence,
    )
    source = "trace" if c.trace is not None else "poisson"
    c.rec.levels.append(
        level_row(
            c.req, "server", purpose, policy, rate, source, load.seed, s, pred, log, phase=policy.label()
        )
    )
    return s, pred, log


def _real_probe(
    c: ScenarioContext, policy: BatchPolicy, load: LoadSettings, purpose: str
) -> Callable[[float], Probe]:
    def probe(rate: float) -> Probe:
        n = load.n_for(rate)
        times = schedule(rate, n, load.seed, c.trace)
        stop = load.stop_rule(n, rate)
        c.say(f"serve: {policy.label()} at {rate:,.1f} queries/s ({n} queries)")
        s, pred, _ = _level(c, purpose, policy, rate, times, stop, load, load.slo_s)
        tail = s.tail_words()  # a probe stopped early has too few requests for a p99: their max, named
        if s.n >= P99_MIN_N:
            tail += f" (n={s.n}; predicted {pred.latency_p99_s * 1e3:.3f})"
        c.say(
            f"serve:   {tail}, {s.verdict}"
            + (f", {s.n_dropped} dropped" if s.n_dropped else "")
            + f"; {host_line(s)}"
        )
        return Probe(rate, s, s.verdict == "pass")

    return probe


def run_server(c: ScenarioContext) -> None:
    """Measure each level of the spec's rates (or search the capacity), each beside its prediction."""
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
        rate, n = arr.fixed_load(spec.qps, c.trace, minq, mind, spec.max_queries)
        times = schedule(rate, n, spec.seed, c.trace)
        stop = StopRule(
            max_time_s=3.0 * n / rate + 5.0, drop_after_s=DROP_AFTER_SLOS * spec.slo_s if spec.slo_s else None
        )
        c.say(f"serve: server, {policy.label()} at {rate:,.1f} queries/s ({n} queries)")
        s, pred, log = _level(c, "fixed", policy, rate, times, stop, load, spec.slo_s)
        overloaded = bool(s.n_dropped or log.stop_kind == "time")
        c.out.summary.update(
            server_qps=rate,
            server_p99_s=s.latency_p99_s,
            **s.tail_fields("server"),
            server_predicted_p99_s=pred.latency_p99_s,
            server_verdict=s.verdict,
            server_achieved_qps=s.achieved_qps,
            server_dropped=s.n_dropped,
            server_late=s.n_over_slo,
            server_overloaded=overloaded,
            server_host_mean_s=s.host_mean_s,
        )
        verdict = f", SLO {spec.slo_s * 1e3:g} ms: {s.verdict}" if spec.slo_s else ""
        sim = f" (simulator {pred.latency_p99_s * 1e3:.3f} ms)" if s.n >= P99_MIN_N else ""
        c.out.lines.append(
            f"server: {rate:,.1f} queries/s offered, {s.achieved_qps:,.1f} served, {s.tail_words()}{sim}, "
            f"mean batch {s.mean_batch:.2f}{verdict}"
        )
        c.out.lines.append(f"server: {host_line(s)}")
        if overloaded:
            c.out.lines.append(
                f"server: OVERLOADED at {rate:,.1f} queries/s: {s.n_dropped} of {s.n_planned} requests "
                f"dropped (waited over {DROP_AFTER_SLOS:g}× the {spec.slo_s * 1e3:g} ms SLO: the queue is "
                f"bounded), {s.n_over_slo} served late"
                if spec.slo_s
                else f"server: OVERLOADED at {rate:,.1f} queries/s: {log.stopped}"
            )
        return
    _find_capacity(c, load)


def _capacity_row(c: ScenarioContext, r: CapacityResult, predicted: float | None) -> dict[str, Any]:
    return capacity_row(
        c.req, c.rec, r, r.slo_s, c.spec.confidence, predicted, lambda s: s.latency_p99_s, **engine_details(c)
    )


def _find_capacity(c: ScenarioContext, load: LoadSettings) -> None:
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
    measured = _verify(c, load, ranked)
    verified = {m.policy for m in measured}
    c.rec.capacities.extend(simulated_rows(ranked, measured, lambda r, p: _capacity_row(c, r, p)))
    _report_capacity(c, load, ranked, measured, verified)


def _verify(c: ScenarioContext, load: LoadSettings, ranked: list[CapacityResult]) -> list[CapacityResult]:
    """Search the capacity of the simulator's best ``verify_policies`` policies for real, from its prediction."""
    spec, sv = c.spec, c.service
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
            floor_qps=max(start / 1000.0, load.slowest_rate_qps()),
            source="measured",
        )
        measured.append(m)
        c.rec.capacities.append(_capacity_row(c, m, r.capacity_qps))
        c.say(f"serve: {r.policy.label()}: measured {capacity_words(m)}, simulated {r.capacity_qps:,.1f}")
    return measured


def _report_capacity(
    c: ScenarioContext,
    load: LoadSettings,
    ranked: list[CapacityResult],
    measured: list[CapacityResult],
    verified: set[Any],
) -> None:
    """The best measured capacity against the simulator's prediction and the engine alone: summary, lines."""
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
    ratio = best.capacity_qps / engine[0] if engine else None
    note = engine_ratio_note(ratio)  # the console line's, and `--json`'s where there is one
    if engine:
        c.out.summary.update(engine_ips=engine[0], engine_batch=engine[1], capacity_vs_engine=ratio)
        if note:
            c.out.summary["capacity_vs_engine_note"] = note.strip(" ()")
    # no probe passed: there is no capacity to state (capacity_qps is 0.0 above), and no ratio to the prediction
    if best.capacity_qps <= 0:
        c.out.summary["capacity_note"] = why = _no_capacity(best)  # as where no batch fits the SLO
        c.out.lines.append(
            f"server capacity at p99 ≤ {load.slo_s * 1e3:g} ms: none found with {best.policy.label()}: {why}"
        )
        return
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
            f"server capacity / the engine alone ({engine_words(c)}): {ratio:.3f}{_bracket(best, engine[0])}{note}"
        )


def _bracket(best: CapacityResult, engine_ips: float) -> str:
    """The ratio's upper end: the search stops with the capacity below its lowest failing rate (``--capacity-tol``).

    Why: the capacity is the highest passing rate, a conservative figure up to the bracket's width (3% by
    default) under the rate the server can hold; a ratio read against a goal needs both ends.
    """
    if not best.upper_qps:
        return ""
    return f" (< {best.upper_qps / engine_ips:.3f}: the lowest failing rate, {best.upper_qps:,.1f}/s)"


def _no_capacity(best: CapacityResult) -> str:
    """Why a real search passed at no rate: its probes were too small for a verdict, or each one failed.

    Why said: the line read "0.0 queries/s … measured/predicted nan" when a query cap (``--max-queries``)
    left every probe without the requests a p99 needs, which is a setting to change, not a capacity of 0.
    """
    verdicts = {p.summary.verdict for p in best.probes}
    if verdicts <= {"inconclusive"}:
        return (
            f"every probe ({len(best.probes)}) was inconclusive: too few requests for a p99 verdict; "
            "raise --max-queries (or --min-duration)"
        )
    lowest = min((p.rate_qps for p in best.probes), default=float("nan"))
    return f"no probe passed, down to {lowest:,.1f} queries/s"
