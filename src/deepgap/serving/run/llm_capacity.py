"""A decoder's capacity: the highest Poisson rate whose TTFT and TPOT p99 both stay within their bounds.

As for images (`deepgap.serving.run.server_scenario`): every calibrated slot count is searched in the
simulator first (a coarse pass, then the best three refined), and the best ``--verify-policies`` are
searched for real, each starting at its simulated capacity. The capacity is reported in queries/s and in
output tokens/s (measured at that rate), beside the simulator's prediction; simulated-only rows are
labelled ``unverified (simulated only)``.
"""

from __future__ import annotations

from deepgap.serving.capacity.search import CapacityResult, LoadSettings, capacity_words
from deepgap.serving.run.llm_scenario import LlmContext, llm_capacity_row, search, tails_line
from deepgap.serving.run.rows import simulated_rows
from deepgap.serving.sim.token_stats import tail_fields

REFINED = 3


def find_llm_capacity(c: LlmContext) -> None:
    """Search every slot count in the simulator, verify the best for real, store and print the capacity."""
    spec, sv = c.spec, c.service
    load = c.settings()
    caps = [s for s in sv.batch_sizes if not spec.max_batch or s <= spec.max_batch]
    c.say(
        f"serve: simulating slots {', '.join(map(str, caps))} at TTFT p99 ≤ {c.ttft * 1e3:g} ms and TPOT p99 ≤ "
        f"{c.tpot * 1e3:g} ms on the calibrated curves"
    )
    coarse = LoadSettings(**{**load.__dict__, "max_queries": min(load.max_queries, 6000)})
    tol = spec.rel_tol
    ranked = [search(c, s, coarse, False, 0.6 * sv.saturation_qps(s, c.load), 2 * tol) for s in caps]
    ranked.sort(key=lambda r: -r.capacity_qps)
    top = [
        search(
            c,
            r.policy.max_batch,
            load,
            False,
            r.capacity_qps or 0.5 * sv.saturation_qps(r.policy.max_batch, c.load),
            tol,
        )
        for r in ranked[:REFINED]
    ]
    ranked = sorted(top, key=lambda r: -r.capacity_qps) + ranked[REFINED:]
    measured = []
    for r in ranked[: spec.verify_policies]:
        s = r.policy.max_batch
        start = r.capacity_qps if r.capacity_qps > 0 else 0.5 * sv.saturation_qps(s, c.load)
        m = search(c, s, load, True, start, tol)
        measured.append(m)
        c.rec.capacities.append(llm_capacity_row(c, m, r.capacity_qps))
        c.say(f"serve: {s} slots: measured {capacity_words(m, 2)}, simulated {r.capacity_qps:,.2f}")
    c.rec.capacities.extend(simulated_rows(ranked, measured, lambda r, p: llm_capacity_row(c, r, p)))
    _report(c, ranked, measured, load.min_duration_s)


def _report(
    c: LlmContext, ranked: list[CapacityResult], measured: list[CapacityResult], run_s: float
) -> None:
    """The best measured capacity in queries/s and output tokens/s, beside the simulator's."""
    best = max(measured, key=lambda m: m.capacity_qps)
    sim = next(r for r in ranked if r.policy == best.policy)
    at = best.at_capacity
    t = at.summary.tokens if at is not None else None
    bounds = f"TTFT p99 ≤ {c.ttft * 1e3:g} ms and TPOT p99 ≤ {c.tpot * 1e3:g} ms"
    c.out.summary.update(
        capacity_qps=best.capacity_qps,
        capacity_predicted_qps=sim.capacity_qps,
        capacity_upper_qps=best.upper_qps,
        capacity_slots=best.policy.max_batch,
        capacity_max_batch=best.policy.max_batch,
        capacity_output_tokens_per_s=t.output_tokens_per_s if t else None,
        **tail_fields(t, "capacity_"),
        slo_ttft_s=c.ttft,
        slo_tpot_s=c.tpot,
        capacity_sim_best_qps=ranked[0].capacity_qps,
        capacity_sim_best_slots=ranked[0].policy.max_batch,
        capacity_note=best.note,
        capacity_min_run_s=run_s,
    )
    if best.capacity_qps <= 0:
        c.out.lines.append(f"server capacity at {bounds}{c.kv()}: 0 — {best.note or 'no rate passed'}")
        return
    ratio = best.capacity_qps / sim.capacity_qps if sim.capacity_qps else float("nan")
    c.out.lines.append(
        f"server capacity at {bounds} ({c.load.label()}{c.kv()}): {best.capacity_qps:,.2f} queries/s, "
        f"{(t.output_tokens_per_s or 0) if t else 0:,.1f} output tokens/s with {best.policy.max_batch} slots "
        f"(simulator predicted {sim.capacity_qps:,.2f} queries/s; measured/predicted {ratio:.3f}); simulated best "
        f"of {len(ranked)} slot counts: {ranked[0].policy.max_batch} slots at {ranked[0].capacity_qps:,.2f}; "
        f"probes of at least {run_s:g} s, so a rate up to {c.ttft / run_s:.0%} above the sustainable one can pass"
    )
    if at is not None:
        c.out.lines.append(f"server capacity: {tails_line(at.summary)}")
