"""Parent side of ``deepgap serve --loadgen``: LoadGen runs of the measured scenario, stored as levels.

After the scenario is measured, the same worker is driven by MLCommons LoadGen and each LoadGen run is
stored as a ``loadgen`` level beside deepgap's own. In the server scenario a null-SUT run at deepgap's
capacity comes first (stored as ``loadgen-null``): LoadGen's own latency floor through the same Python
path, so a LoadGen p99 can be read as floor + serving. LoadGen's min duration is ``--loadgen-duration``
(default: the scenario's minimum; MLPerf's submission runs last 600 s), its min query count the
scenario's, and its early-stopping verdict is reported with every run.

LoadGen's worker side (`deepgap.serving.loadgen`, below `run`) cannot import the drivers; this half is theirs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from deepgap.serving.loadgen.harness import (
    SCENARIO_NAMES,
    LoadgenRequest,
    LoadgenResult,
    available,
    null_request,
)
from deepgap.serving.records.details import LevelDetails, LoadgenRun
from deepgap.serving.run.rows import level_row
from deepgap.serving.run.spec import DEFAULT_POLICY
from deepgap.serving.run.text_spec import text_tokens_line
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.capacity_stats import min_queries


def run_loadgen(c: Any) -> None:
    """Parent side: LoadGen runs of the scenario just measured, each stored as a ``loadgen`` level."""
    spec, s = c.spec, c.out.summary
    why = available()
    if spec.scenario == "single-stream":
        policy, qps = BatchPolicy(1, 0.0), None
    elif spec.scenario == "offline":
        policy, qps = BatchPolicy(int(s.get("offline_batch", 1)), 0.0), s.get("offline_ips")
    else:
        mb = s.get("capacity_max_batch") or min(spec.max_batch or DEFAULT_POLICY[0], c.service.max_batch)
        md = s.get("capacity_max_delay_s")
        if md is None:
            md = spec.max_delay_s if spec.max_delay_s is not None else DEFAULT_POLICY[1]
        policy, qps = BatchPolicy(int(mb), float(md)), s.get("capacity_qps") or s.get("server_qps")
        if not qps:
            why = why or "unavailable: no sustainable rate was found to drive LoadGen at"
    if why:
        c.rec.levels.append(
            level_row(
                c.req,
                spec.scenario,
                "loadgen",
                policy,
                qps,
                "loadgen",
                spec.seed,
                None,
                status="skipped",
                reason=why,
            )
        )
        c.out.lines.append(f"loadgen: {why}")
        return
    minq, mind = loadgen_minimums(spec)
    s["loadgen_min_duration_s"], s["loadgen_min_queries"] = mind, minq
    full = (
        ""
        if mind >= MLPERF_DURATION_S
        else f" (MLPerf's full run: --loadgen-duration {MLPERF_DURATION_S:g}s)"
    )
    c.out.lines.append(
        f"loadgen: LoadGen {SCENARIO_NAMES[spec.scenario]}, PerformanceOnly, min duration {mind:g} s, min "
        f"query count {minq}"
        + (
            f", target p99 {spec.slo_s * 1e3:g} ms, early stopping at 99 % confidence"
            if spec.scenario == "server" and spec.slo_s
            else ""
        )
        + full
    )
    if spec.scenario == "server":  # the harness's own floor at the same rate, through the same Python path
        p = _one_run(c, spec, policy, qps, minq, mind, null=True)
        s["loadgen_floor_p99_s"] = _p99_s(p)
    # Server capacity: LoadGen's own verdict is the second driver's capacity. Start at deepgap's capacity and
    # step down until LoadGen calls the run VALID (at most LOADGEN_STEPS), so the two capacities can be
    # compared as rates, not as one pass/fail at the edge, where a p99 is at its most sensitive. A fixed
    # --qps gets one LoadGen run at that rate.
    search = spec.scenario == "server" and spec.find_capacity
    rates = [qps * f for f in LOADGEN_STEPS] if search else [qps]
    best = None
    for rate in rates:
        p = _one_run(c, spec, policy, rate, minq, mind)
        if p.get("Result is") == "VALID":
            best = rate
            s["loadgen_p99_s"] = _p99_s(p)
            break
    if search:
        s["loadgen_capacity_qps"] = best
        s["loadgen_capacity_ratio"] = best / qps if best else None
        c.out.lines.append(
            f"loadgen: Server capacity {best:,.1f}/s = {best / qps:.3f} of deepgap's {qps:,.1f}/s"
            if best
            else f"loadgen: Server INVALID at every rate down to {rates[-1]:,.1f}/s "
            f"({LOADGEN_STEPS[-1]:.2f} of deepgap's)"
        )


# Rates tried for LoadGen's Server, as fractions of deepgap's capacity: the highest VALID one is its capacity.
LOADGEN_STEPS = (1.0, 0.975, 0.95, 0.925, 0.9)
MLPERF_DURATION_S = 600.0  # MLPerf's min duration for a submission run


def loadgen_minimums(spec: Any) -> tuple[int, float]:
    """(min query count, min duration s) of each LoadGen run.

    The duration is ``--loadgen-duration``, else the scenario's minimum. The query count is the
    scenario's, and when it confirms a capacity at least what deepgap's own probes run (twice the queries
    early stopping needs to certify a p99 with none late), so that LoadGen's early stopping can pass.
    """
    minq, mind = spec.minimums()
    if spec.scenario == "server" and spec.find_capacity:
        minq = max(minq, 2 * min_queries(0.99, spec.confidence))
    return minq, (spec.loadgen_duration_s if getattr(spec, "loadgen_duration_s", None) else mind)


def _p99_s(parsed: dict[str, str]) -> float | None:
    v = parsed.get("99.00 percentile latency (ns)")
    try:
        return float(v) * 1e-9 if v is not None else None
    except ValueError:
        return None


def _one_run(
    c: Any, spec: Any, policy: BatchPolicy, qps: float | None, minq: int, mind: float, null: bool = False
) -> dict[str, str]:
    """One LoadGen run at ``qps`` stored as a ``loadgen`` level; returns LoadGen's parsed summary."""
    req = LoadgenRequest(
        spec.scenario,
        policy,
        qps,
        spec.slo_s,
        minq,
        mind,
        expected_latency_s=c.service.median_at(1),
        seed=spec.seed,
        confidence=spec.confidence,
    )
    dist = getattr(c.worker, "seq_dist", None)
    if dist is not None:  # a text model: LoadGen's sample s is this long (a seeded draw from --seq-len-dist)
        n = max(c.req.pool_size, max(c.req.buckets))
        req = dataclasses.replace(req, sample_lengths=dist.draw(n, spec.seed))
    req = null_request(req) if null else req
    what = "null SUT (nothing served: the harness floor)" if null else SCENARIO_NAMES[spec.scenario]
    c.say(f"serve: MLCommons LoadGen, {what}" + (f" at {qps:,.1f}/s" if qps else ""))
    res: LoadgenResult = c.worker.loadgen(req, 300.0 + 4 * mind)
    summ, a = res.level, res.agreement
    run = LoadgenRun(
        sut="null" if null else "batched",
        min_duration_s=mind,
        min_queries=minq,
        early_stopping=res.early_stopping or None,
        complete_calls=res.complete_calls,
        issue_calls=res.issue_calls,
        trace_note=res.trace_note or None,
    )
    if a is not None:
        run.agree, run.margin_s, run.diff_p50_s = a.agrees, a.margin_s, a.diff_p50_s
        run.diff_p99_s, run.issue_delay_p99_s = a.diff_p99_s, a.issue_delay_p99_s
    c.rec.levels.append(
        level_row(
            c.req,
            spec.scenario,
            "loadgen-null" if null else "loadgen",
            policy,
            qps,
            "loadgen",
            spec.seed,
            summ,
            None,
            res.log,
            status="ok" if summ else "error",
            reason="" if summ else "LoadGen issued no query",
            details=LevelDetails(loadgen_summary=res.summary, loadgen=res.parsed, loadgen_run=run),
        )
    )
    p = res.parsed
    c.out.summary["loadgen_null" if null else "loadgen"] = p
    head = "loadgen (null SUT): " if null else "loadgen: "
    c.out.lines.append(
        head
        + ", ".join(
            f"{k} = {p[k]}"
            for k in (
                "Result is",
                "Scheduled samples per second",
                "Samples per second",
                "Completed samples per second",
                "QPS w/o loadgen overhead",
                "90.0th percentile latency (ns)",
                "99.00 percentile latency (ns)",
            )
            if k in p
        )
        + (f"; early stopping: {res.early_stopping}" if res.early_stopping else "")
    )
    if summ is not None and summ.padded_tokens_per_s:
        c.out.lines.append(f"loadgen:   {text_tokens_line(summ)}")
    if a is not None:
        c.out.lines.append(f"loadgen:   {a.line()}")
    elif res.trace_note:
        c.out.lines.append(f"loadgen:   {res.trace_note}")
    return p
