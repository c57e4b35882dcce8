"""``deepgap serve`` for a decoder: calibrate, serve Poisson arrivals with continuous batching, find capacity.

Why its own driver beside `deepgap.serving.run.scenarios`: a decoder's level is judged on two bounds
(TTFT and TPOT, `deepgap.serving.sim.token_stats`), its policy is a slot count (``max_batch`` in the rows;
no delay: a newcomer is admitted at the next step), and its simulator runs on prefill and decode-step
curves (`deepgap.serving.sim.llm_service`). What it shares: the worker and its set-up failure handling,
the rate search (`deepgap.serving.capacity.search.find_capacity`), the rows and their one transaction.
Every measured level is stored beside the simulator's prediction for the same arrivals and lengths.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from deepgap.core.records import kv_cache_suffix
from deepgap.serving.capacity.search import CapacityResult, LoadSettings, Probe, find_capacity, schedule
from deepgap.serving.records.details import LevelDetails, LlmLevel
from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.process import LevelRequest, ServingWorker, SetupRequest
from deepgap.serving.run.rows import Say, ServeOutcome, capacity_row, level_row
from deepgap.serving.sim import arrivals as arr
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.capacity_stats import allowed_over
from deepgap.serving.sim.continuous import SlotStop, drop_after
from deepgap.serving.sim.llm_service import LlmLoad, LlmService, simulate_llm
from deepgap.serving.sim.log import LevelSummary
from deepgap.serving.sim.token_stats import summarize_tokens, tail_fields

# A capacity probe lasts at least this many TTFT bounds: an overloaded server's queue grows by about
# (λ/μ − 1)·T in a run of T s, so a rate up to TTFT/T above the sustainable one can still pass (10 %)
RUN_OVER_TTFT = 10.0
REAL_CEILING = 1.1  # the real search's ceiling over the calibrated curves' saturation (`search`)
DROP_AFTER_TTFTS = 2.0  # the bounded queue: a request still waiting after twice the TTFT bound is dropped


@dataclass
class LlmContext:
    """One decoder's serve run: spec, request, worker, load, bounds, the calibrated service, the record."""

    spec: Any
    req: SetupRequest
    worker: ServingWorker
    load: LlmLoad
    service: LlmService
    rec: ServeRecord
    out: ServeOutcome
    say: Say
    trace: np.ndarray | None
    ttft: float
    tpot: float
    # how the set-up prefills admissions (its engine_info's words), for the capacity rows
    admissions: str = ""

    def settings(self) -> LoadSettings:
        """Requests per level and the verdict's statistics (the TTFT bound as the search's SLO)."""
        minq, mind = self.spec.minimums()
        if self.spec.min_duration_s is None:  # `RUN_OVER_TTFT`: short runs pass overloaded rates
            mind = max(mind, RUN_OVER_TTFT * self.ttft)
        return LoadSettings(
            slo_s=self.ttft,
            confidence=self.spec.confidence,
            min_queries=minq,
            min_duration_s=mind,
            max_queries=self.spec.max_queries,
            seed=self.spec.seed,
        )

    def kv(self) -> str:
        """``, fp8 KV cache`` where the cache holds fp8 codes (`kv_cache_label`), else "": for the printed lines.

        Why: a served run with fp8 codes must never read like one with the decoder's own cache.
        """
        return kv_cache_suffix(self.req.kv_cache, ", ")

    def stop(self, n: int, rate: float, early: bool) -> SlotStop:
        """The level's bounds, bounded queue and time guard; ``early``: stop once it cannot pass."""
        return SlotStop(
            self.ttft,
            self.tpot,
            allowed_over(n, 0.99, self.spec.confidence) if early else None,
            3.0 * n / rate + 5.0,
            drop_after(self.ttft, DROP_AFTER_TTFTS),
        )


def level(
    c: LlmContext, purpose: str, slots: int, rate: float, n: int, early: bool
) -> tuple[LevelSummary, LevelSummary]:
    """Serve ``n`` Poisson (or traced) requests at ``rate`` for real and in the simulator; record the level."""
    times = schedule(rate, n, c.spec.seed, c.trace)
    ins, outs = c.load.draw(n, c.spec.seed)
    stop = c.stop(n, rate, early)
    policy = BatchPolicy(slots, 0.0)
    timeout = 180.0 + 8.0 * n / rate
    log = c.worker.level(LevelRequest(times, policy, stop, lengths=ins, out_lengths=outs), timeout)
    conf = c.spec.confidence
    s = summarize_tokens(log, rate, c.ttft, c.tpot, 0.99, conf)
    pred = summarize_tokens(
        simulate_llm(times, c.load, slots, c.service, c.spec.seed, stop), rate, c.ttft, c.tpot, 0.99, conf
    )
    d = LevelDetails(llm=llm_details(c, s, pred))
    source = "trace" if c.trace is not None else "poisson"
    c.rec.levels.append(
        level_row(
            c.req,
            "server",
            purpose,
            policy,
            rate,
            source,
            c.spec.seed,
            s,
            pred,
            log,
            phase=f"slots={slots}",
            details=d,
        )
    )
    return s, pred


def llm_details(c: LlmContext, s: LevelSummary, pred: LevelSummary) -> LlmLevel:
    """The level's `LlmLevel`: its token figures, the lengths' distributions, the simulator's figures."""
    d = LlmLevel(**asdict(s.tokens))
    d.input_len_dist, d.output_len_dist = c.load.inputs.label(), c.load.outputs.label()
    d.cache_len = c.req.cache_len
    p = pred.tokens
    d.predicted_output_tokens_per_s = p.output_tokens_per_s
    d.predicted_ttft_tail_s, d.predicted_tpot_tail_s = p.ttft_tail_s, p.tpot_tail_s
    return d


def tails_line(s: LevelSummary) -> str:
    """``TTFT p50 12.3 ms, p99 40.1 ms (n=1000); TPOT …``: each tail named by its kind and n."""
    t = s.tokens

    def one(name: str, p50, tail, kind, n) -> str:
        if p50 is None:
            return f"{name}: none (outputs of one token)"
        return f"{name} p50 {p50 * 1e3:.2f} ms, {kind} {tail * 1e3:.2f} ms (n={n})"

    stop = f"; stopped early with {t.n_unfinished} running, {t.n_queued} queued" if s.stopped else ""
    return (
        one("TTFT", t.ttft_p50_s, t.ttft_tail_s, t.ttft_tail_kind, t.ttft_n)
        + "; "
        + one("TPOT", t.tpot_p50_s, t.tpot_tail_s, t.tpot_tail_kind, t.tpot_n)
        + stop
    )


def fixed_level(c: LlmContext) -> None:
    """One level at ``--qps`` (or the trace's rate) with ``--max-batch`` slots (default: the most calibrated)."""
    spec = c.spec
    minq, mind = spec.minimums()
    rate, n = arr.fixed_load(spec.qps, c.trace, minq, mind, spec.max_queries)
    slots = spec.max_batch or c.service.max_batch
    c.say(f"serve: server, {slots} slots at {rate:,.2f} queries/s ({n} requests, {c.load.label()})")
    s, pred = level(c, "fixed", slots, rate, n, early=False)
    t, p = s.tokens, pred.tokens
    c.out.summary.update(
        server_qps=rate,
        server_achieved_qps=s.achieved_qps,
        server_output_tokens_per_s=t.output_tokens_per_s,
        server_predicted_output_tokens_per_s=p.output_tokens_per_s,
        **tail_fields(t, "server_"),
        server_verdict=s.verdict,
        server_dropped=s.n_dropped,
        server_slots=slots,
    )
    c.out.lines.append(
        f"server ({c.load.label()}, {slots} slots{c.kv()}): {rate:,.2f} queries/s offered, "
        f"{s.achieved_qps:,.2f} served, "
        f"{t.output_tokens_per_s or 0:,.1f} output tokens/s (simulator {p.output_tokens_per_s or 0:,.1f}); "
        f"{tails_line(s)}; bounds TTFT {c.ttft * 1e3:g} ms, TPOT {c.tpot * 1e3:g} ms: {s.verdict}"
        + (f", {s.n_dropped} dropped" if s.n_dropped else "")
    )


def llm_capacity_row(c: LlmContext, r: CapacityResult, predicted: float | None) -> dict[str, Any]:
    """A ``capacity`` row of a decoder: ``slo_s`` its TTFT bound, ``max_batch`` its slots, tokens in details."""
    at = r.at_capacity
    t = at.summary.tokens if at is not None else None
    return capacity_row(
        c.req,
        c.rec,
        r,
        c.ttft,
        c.spec.confidence,
        predicted,
        lambda s: s.tokens.ttft_tail_s if s.tokens else None,
        slo_tpot_s=c.tpot,
        output_tokens_per_s=t.output_tokens_per_s if t else None,
        admissions=c.admissions or None,
        **tail_fields(t),
    )


def sim_probe(c: LlmContext, slots: int, load: LoadSettings):
    """A probe that simulates one level at a rate (the search's ranking of slot counts)."""

    def probe(rate: float) -> Probe:
        n = load.n_for(rate)
        times = schedule(rate, n, load.seed, c.trace)
        log = simulate_llm(times, c.load, slots, c.service, load.seed, c.stop(n, rate, True))
        s = summarize_tokens(log, rate, c.ttft, c.tpot, 0.99, load.confidence)
        return Probe(rate, s, s.verdict == "pass")

    return probe


def real_probe(c: LlmContext, slots: int, load: LoadSettings):
    """A probe that serves one level for real (and stores it with its prediction)."""

    def probe(rate: float) -> Probe:
        n = load.n_for(rate)
        c.say(f"serve: {slots} slots at {rate:,.2f} queries/s ({n} requests)")
        s, _ = level(c, "probe", slots, rate, n, early=True)
        c.say(f"serve:   {tails_line(s)}: {s.verdict}" + (f", {s.n_dropped} dropped" if s.n_dropped else ""))
        return Probe(rate, s, s.verdict == "pass")

    return probe


def search(
    c: LlmContext, slots: int, load: LoadSettings, real: bool, start: float, tol: float
) -> CapacityResult:
    """The highest passing rate for ``slots``, simulated or measured.

    The ceiling: `LlmService.saturation_qps` is an upper bound on the curves, so the simulator never passes
    above it; the real server gets `REAL_CEILING` over it (its steps may run a little faster than calibrated).
    """
    ceiling = c.service.saturation_qps(slots, c.load) * (REAL_CEILING if real else 1.0)
    return find_capacity(
        (real_probe if real else sim_probe)(c, slots, load),
        BatchPolicy(slots, 0.0),
        c.ttft,
        start_qps=min(start, ceiling / 1.05),
        ceiling_qps=ceiling,
        growth=1.1 if real else 2.0,
        rel_tol=tol,
        floor_qps=max(start / 1000.0, load.slowest_rate_qps()) if real else None,
        source="measured" if real else "simulated",
    )
