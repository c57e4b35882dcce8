"""Parent side of ``deepgap serve --loadgen``: LoadGen runs of the measured scenario, stored as levels.

After the scenario is measured, the same worker is driven by MLCommons LoadGen and each LoadGen run is
stored as a ``loadgen`` level beside deepgap's own.

The worker side (`deepgap.serving.loadgen`) runs inside the serving process and must not import the
drivers; this half belongs to them.
"""

from __future__ import annotations

from typing import Any

from deepgap.serving.batcher import BatchPolicy
from deepgap.serving.details import LevelDetails
from deepgap.serving.loadgen import SCENARIO_NAMES, LoadgenRequest, available
from deepgap.serving.log import summarize
from deepgap.serving.rows import level_row
from deepgap.serving.spec import DEFAULT_POLICY


def run_loadgen(c: Any) -> None:
    """Parent side: one LoadGen run of the scenario just measured, stored as a ``loadgen`` level."""
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
        c.rec.levels.append(level_row(c.req, spec.scenario, "loadgen", policy, qps, "loadgen", spec.seed,
                                      None, status="skipped", reason=why))
        c.out.lines.append(f"loadgen: {why}")
        return
    minq, mind = spec.minimums()
    # Server: LoadGen's own verdict is the second driver's capacity. Start at deepgap's capacity and step
    # down until LoadGen calls the run VALID (at most LOADGEN_STEPS), so the two capacities can be compared
    # as rates, not as one pass/fail at the edge, where a p99 is at its most sensitive.
    rates = [qps * f for f in LOADGEN_STEPS] if spec.scenario == "server" else [qps]
    best = None
    for rate in rates:
        p = _one_run(c, spec, policy, rate, minq, mind)
        if spec.scenario != "server":
            break
        if p.get("Result is") == "VALID":
            best = rate
            break
    if spec.scenario == "server":
        c.out.summary["loadgen_capacity_qps"] = best
        c.out.summary["loadgen_capacity_ratio"] = best / qps if best else None
        c.out.lines.append(
            f"loadgen: Server capacity {best:,.1f}/s = {best / qps:.3f} of deepgap's {qps:,.1f}/s"
            if best else f"loadgen: Server INVALID at every rate down to {rates[-1]:,.1f}/s "
            f"({LOADGEN_STEPS[-1]:.2f} of deepgap's)")


# Rates tried for LoadGen's Server, as fractions of deepgap's capacity: the highest VALID one is its capacity.
LOADGEN_STEPS = (1.0, 0.975, 0.95, 0.925, 0.9)


def _one_run(c: Any, spec: Any, policy: BatchPolicy, qps: float | None, minq: int,
             mind: float) -> dict[str, str]:
    """One LoadGen run at ``qps`` stored as a ``loadgen`` level; returns LoadGen's parsed summary."""
    req = LoadgenRequest(spec.scenario, policy, qps, spec.slo_s, minq, mind,
                         expected_latency_s=c.service.median_at(1), seed=spec.seed)
    c.say(f"serve: MLCommons LoadGen, {SCENARIO_NAMES[spec.scenario]}" + (f" at {qps:,.1f}/s" if qps else ""))
    res = c.worker.loadgen(req, 300.0 + 4 * mind)
    log = res["log"]
    rate = qps if spec.scenario == "server" else None
    summ = summarize(log, rate, spec.slo_s, 0.99, spec.confidence) if log.n else None
    c.rec.levels.append(level_row(
        c.req, spec.scenario, "loadgen", policy, qps, "loadgen", spec.seed, summ, None, log,
        status="ok" if log.n else "error", reason="" if log.n else "LoadGen issued no query",
        details=LevelDetails(loadgen_summary=res["summary"], loadgen=res["parsed"])))
    p = res["parsed"]
    c.out.summary["loadgen"] = p
    c.out.lines.append("loadgen: " + ", ".join(f"{k} = {p[k]}" for k in (
        "Result is", "Scheduled samples per second", "Samples per second", "Completed samples per second",
        "QPS w/o loadgen overhead",
        "90.0th percentile latency (ns)", "99.00 percentile latency (ns)") if k in p))
    return p
