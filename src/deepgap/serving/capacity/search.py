"""Capacity at an SLO: the highest arrival rate whose p99 latency is conclusively within it.

`find_capacity` brackets and bisects the rate with any *probe* (a simulated run or a real one): a
probe runs at one rate and returns the early-stopping verdict (`capacity_stats`). The search keeps
the highest rate that passed and the lowest that did not, and stops when they are within
``rel_tol`` of each other: the capacity is the highest passing rate, so it is a conservative figure.
`search_policies` runs it in the simulator over a grid of (max batch, max delay) policies; the real
server then verifies the best few (simulation is cheap, traffic is not).

Finite runs see an overloaded queue grow by about (λ/μ − 1)·T over a run of T seconds, so a rate
slightly above the saturation throughput μ can still pass a short run: the bias is at most about
SLO / T (0.75 % for a 15 ms SLO and 2 s runs). Probes are therefore never shorter than ``min_duration_s``.

An *inconclusive* verdict (too many requests over the SLO to pass, too few to fail: a handful of Poisson
collisions in a run of a thousand) is not a fail: the simulated probe runs again with twice the queries
until the verdict is pass or fail or it has run `RETRY_FACTOR` times its queries (at most
``max_queries``), and a rate still inconclusive there is
reported as such. (Counting it as a fail once sent the search down to 0.74 q/s for a 1.8 ms model at a
2.5 ms SLO.) Every zero capacity carries its reason in ``note``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deepgap.serving.sim import arrivals as arr
from deepgap.serving.sim.batcher import BatchPolicy, StopRule
from deepgap.serving.sim.capacity_stats import allowed_over, min_queries
from deepgap.serving.sim.log import LevelSummary, summarize
from deepgap.serving.sim.simulator import ServiceModel, simulate

DELAY_FRACTIONS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35)  # max_delay candidates, as fractions of the SLO
# The bounded queue drops a request that waited this many SLOs: certainly late, and far enough out that
# shedding it does not shorten the queue of requests near the p99 (which would flatter the verdict).
DROP_AFTER_SLOS = 2.0
# An inconclusive simulated run is repeated with up to this many times its queries (two doublings): enough
# to settle a few chance collisions far below capacity; right at capacity a run stays inconclusive at any n
# (the true tail sits on the SLO), and that rate is then not counted as carried.
RETRY_FACTOR = 4


@dataclass(frozen=True)
class LoadSettings:
    """How long each run at one rate is, and the verdict's statistics."""

    slo_s: float
    percentile: float = 0.99
    confidence: float = 0.99
    min_queries: int = 1000
    min_duration_s: float = 2.0
    max_queries: int = 200_000
    seed: int = 0
    # A real run's length bounds how low a search steps: at ``min_queries`` requests a rate of 1 query/s
    # is 1,000 s of serving, and a host too loaded to pass at its first rates stepped down to 0.4 q/s
    # for 20 minutes (a CPU test under load). Below `slowest_rate_qps` the SLO counts as unreachable.
    max_run_s: float = 300.0

    def slowest_rate_qps(self) -> float:
        """The lowest rate a real run is probed at: its fewest requests fill ``max_run_s``."""
        return self.n_for(1e-9) / self.max_run_s

    def n_for(self, rate_qps: float) -> int:
        """Requests in a run at ``rate_qps``: both minimums, and enough for a pass to be possible."""
        n = arr.n_queries(
            rate_qps,
            max(self.min_queries, 2 * min_queries(self.percentile, self.confidence)),
            self.min_duration_s,
            bounded=False,
        )
        return min(n, self.max_queries)

    def stop_rule(self, n: int, rate_qps: float) -> StopRule:
        """Stop once the run can no longer pass, or runs far longer than planned."""
        planned_s = n / rate_qps
        return StopRule(
            slo_s=self.slo_s,
            max_violations=allowed_over(n, self.percentile, self.confidence),
            max_time_s=3.0 * planned_s + 5.0,
            drop_after_s=DROP_AFTER_SLOS * self.slo_s if math.isfinite(self.slo_s) else None,
        )


@dataclass
class Probe:
    """One run of a capacity search."""

    rate_qps: float
    summary: LevelSummary
    passed: bool
    log: object = None  # the RequestLog (kept for storage; None when not kept)


@dataclass
class CapacityResult:
    """Outcome of a capacity search for one batching policy."""

    policy: BatchPolicy
    slo_s: float
    capacity_qps: float  # highest passing rate; 0 when none passed
    upper_qps: float | None  # lowest failing rate seen (None: never failed)
    probes: list[Probe] = field(default_factory=list)
    source: str = "simulated"  # simulated | measured
    note: str = ""

    @property
    def at_capacity(self) -> Probe | None:
        """The passing probe at the capacity rate."""
        ok = [p for p in self.probes if p.passed and p.rate_qps == self.capacity_qps]
        return ok[-1] if ok else None


def capacity_words(res: CapacityResult, digits: int = 1) -> str:
    """A searched capacity with its upper bound where the search has one: "158.53 queries/s (upper bound 160.92)".

    Why the bound: when the predicted rate passes and every rate above it fails or is stopped early, the
    capacity is the prediction itself, and "measured 158.53, simulated 158.53" reads as an exact prediction
    where the search only says the capacity lies between the two rates (session 51).
    """
    words = f"{res.capacity_qps:,.{digits}f} queries/s"
    return words if res.upper_qps is None else f"{words} (upper bound {res.upper_qps:,.{digits}f})"


ProbeFn = Callable[[float], Probe]


def find_capacity(
    probe: ProbeFn,
    policy: BatchPolicy,
    slo_s: float,
    start_qps: float,
    ceiling_qps: float | None = None,
    growth: float = 2.0,
    rel_tol: float = 0.02,
    max_probes: int = 24,
    floor_qps: float | None = None,
    source: str = "simulated",
) -> CapacityResult:
    """Bracket, then bisect (geometrically) the highest rate at which ``probe`` passes.

    Args:
        probe: runs one load level and says whether it passed.
        policy: the batching policy under test, recorded in the result.
        slo_s: the p99 objective the probes were judged against, recorded in the result.
        start_qps: first rate tried (a prediction, when one exists).
        ceiling_qps: a rate known to be unsustainable (e.g. a bit above the saturation throughput);
            the search never probes above it and reports it as the upper bound.
        growth: factor between rates while bracketing upwards; downwards the factor starts there and
            squares after each failure, so an unreachable SLO is recognised in a few runs.
        rel_tol: stop when (upper − lower) / lower ≤ this.
        max_probes: hard limit on runs.
        floor_qps: below this the SLO counts as unreachable (default: ``start_qps`` / 1000).
        source: "simulated" or "measured".
    """
    res = CapacityResult(policy=policy, slo_s=slo_s, capacity_qps=0.0, upper_qps=None, source=source)
    lo, hi = 0.0, ceiling_qps  # highest pass, lowest fail (the ceiling counts as a fail, never probed)
    down = max(growth, 1.05)
    floor = floor_qps if floor_qps is not None else start_qps / 1000.0
    rate = start_qps if ceiling_qps is None else min(start_qps, ceiling_qps / (1 + rel_tol))
    for _ in range(max_probes):
        p = probe(rate)
        res.probes.append(p)
        if p.passed:
            lo = max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo == 0.0:  # nothing passed yet: step down, by a factor that squares each time
            rate = (hi or rate) / down
            down = down * down
            if rate < floor:
                res.note = no_pass_note(res.probes)
                break
            continue
        if hi is not None and (hi - lo) / lo <= rel_tol:
            break
        rate = lo * growth if hi is None else min(lo * growth, math.sqrt(lo * hi))
    else:
        res.note = f"stopped after {max_probes} runs" + (f"; {no_pass_note(res.probes)}" if lo == 0.0 else "")
    res.capacity_qps = lo
    res.upper_qps = hi
    return res


def no_pass_note(probes: Sequence[Probe]) -> str:
    """Why no rate passed, from the lowest rate probed: its verdict and the counts behind it."""
    if not probes:
        return "no rate was probed"
    p = min(probes, key=lambda q: q.rate_qps)
    s = p.summary
    counts = (
        f"{s.n_over_slo} of {s.n} requests over the SLO" if s.n_over_slo is not None else f"{s.n} requests"
    )
    if s.n < s.n_planned:  # stopped early: say so, beside what was planned
        counts += f"; {s.n_planned:,} planned, stopped when it could no longer pass"
    if s.verdict == "inconclusive":
        return (
            f"inconclusive even at {p.rate_qps:.3g} queries/s ({counts}, after {s.n} queries): too few "
            "requests to tell a p99 within the SLO from one above it"
        )
    why = f"; {s.stopped}" if s.stopped else ""  # "stopped early: …" or "stopped at the … time limit"
    # a decoder's level a stop ended before any request finished has no latency: its TTFT tail says it
    tail = s.tail_words() if math.isfinite(s.latency_p99_s) else "none finished"
    return f"the SLO is not met even at {p.rate_qps:.3g} queries/s ({counts}: {tail}{why})"


def sim_probe(
    service: ServiceModel,
    policy: BatchPolicy,
    load: LoadSettings,
    trace_s: Sequence[float] | None = None,
    keep_log: bool = False,
) -> ProbeFn:
    """A probe that simulates one run at a rate (Poisson with ``load.seed``, or the trace rescaled)."""

    def probe(rate_qps: float) -> Probe:
        n = load.n_for(rate_qps)
        cap = min(load.max_queries, RETRY_FACTOR * n)
        while True:  # an inconclusive run gets twice the queries (module docstring)
            times = schedule(rate_qps, n, load.seed, trace_s)
            log = simulate(times, policy, service, seed=load.seed, stop=load.stop_rule(n, rate_qps))
            s = summarize(log, rate_qps, load.slo_s, load.percentile, load.confidence)
            if s.verdict != "inconclusive" or n >= cap:
                return Probe(rate_qps, s, s.verdict == "pass", log if keep_log else None)
            n = min(2 * n, cap)

    return probe


def schedule(rate_qps: float, n: int, seed: int, trace_s: Sequence[float] | None = None):
    """``n`` arrival times at ``rate_qps``: a seeded Poisson process, or the trace rescaled and repeated."""
    if trace_s is None:
        return arr.poisson(rate_qps, n, seed)
    import numpy as np

    t = arr.rescale(np.asarray(trace_s, dtype=np.float64), rate_qps)
    return arr.extend(t, n)[:n]


def candidate_policies(
    service: ServiceModel,
    slo_s: float,
    max_batches: Sequence[int] | None = None,
    delay_fractions: Sequence[float] = DELAY_FRACTIONS,
    delays_s: Sequence[float] | None = None,
) -> list[BatchPolicy]:
    """Policies worth trying: batch caps whose own service time fits the SLO, delays as SLO fractions.

    ``delays_s`` replaces the fractions with fixed delays (a user's ``--max-delay``).
    """
    caps = [b for b in (max_batches or service.batch_sizes) if b <= service.max_batch]
    delays = list(delays_s) if delays_s is not None else [f * slo_s for f in delay_fractions]
    out = []
    for b in sorted(set(caps)):
        s = service.median_at(b)
        if s >= slo_s:
            continue
        for d in sorted(
            {0.0 if b == 1 else round(d, 9) for d in delays}
        ):  # waiting never helps a batch of one
            if s + d < slo_s:
                out.append(BatchPolicy(int(b), d))
    return out


def search_policies(
    service: ServiceModel,
    load: LoadSettings,
    policies: Sequence[BatchPolicy] | None = None,
    trace_s: Sequence[float] | None = None,
    rel_tol: float = 0.03,
    coarse_max_queries: int = 6000,
) -> list[CapacityResult]:
    """Simulated capacity of each policy, best first (a coarse pass, then the leaders refined)."""
    policies = list(policies) if policies is not None else candidate_policies(service, load.slo_s)
    coarse = LoadSettings(**{**load.__dict__, "max_queries": min(load.max_queries, coarse_max_queries)})
    results: list[CapacityResult] = []
    best = 0.0
    # Highest saturation first: a policy whose saturation throughput is below the best capacity found
    # cannot beat it (capacity ≤ saturation), so it is recorded as pruned instead of simulated.
    for pol in sorted(policies, key=lambda p: (-service.saturation_qps(p.max_batch), p.max_delay_s)):
        ceiling = service.saturation_qps(pol.max_batch) * 1.05
        if ceiling <= best:
            results.append(
                CapacityResult(pol, load.slo_s, 0.0, ceiling, note="pruned: saturation below the best")
            )
            continue
        r = find_capacity(
            sim_probe(service, pol, coarse, trace_s),
            pol,
            load.slo_s,
            start_qps=0.6 * ceiling,
            ceiling_qps=ceiling,
            rel_tol=2 * rel_tol,
        )
        best = max(best, r.capacity_qps)
        results.append(r)
    results.sort(key=lambda r: -r.capacity_qps)
    refined = []
    for r in results[:3]:
        ceiling = service.saturation_qps(r.policy.max_batch) * 1.05
        start = r.capacity_qps if r.capacity_qps > 0 else 0.5 * ceiling
        refined.append(
            find_capacity(
                sim_probe(service, r.policy, load, trace_s),
                r.policy,
                load.slo_s,
                start_qps=start,
                ceiling_qps=ceiling,
                growth=1.1,
                rel_tol=rel_tol,
            )
        )
    rest = results[3:]
    return sorted(refined, key=lambda r: -r.capacity_qps) + rest
