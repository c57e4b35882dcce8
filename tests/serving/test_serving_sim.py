"""Serving: the batcher, the simulator, the statistical stop rule and the capacity search (pure, no torch).

Fake engines here have a known service time on the virtual clock, so every expected number comes
from queueing theory (M/D/1) or from the fake's definition, not from a measurement.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepgap.core.errors import UsageError
from deepgap.serving.capacity.search import (
    LoadSettings,
    Probe,
    candidate_policies,
    find_capacity,
    search_policies,
    sim_probe,
)
from deepgap.serving.sim.arrivals import fixed_load, parse_duration_s, parse_rate_qps, poisson
from deepgap.serving.sim.batcher import BatchPolicy, StopRule, decide, serve_loop
from deepgap.serving.sim.capacity_stats import allowed_over, min_queries, verdict
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.log import LevelSummary, summarize
from deepgap.serving.sim.simulator import ServiceModel, simulate


def md1_wait_cdf(t: float, lam: float, d: float) -> float:
    """Erlang's exact M/D/1 waiting-time CDF, P(W ≤ t) = (1−ρ) Σ_{k≤t/D} [λ(kD−t)]^k/k! · e^{−λ(kD−t)}."""
    rho = lam * d
    terms = [
        (lam * (k * d - t)) ** k / math.factorial(k) * math.exp(-lam * (k * d - t))
        for k in range(int(math.floor(t / d + 1e-12)) + 1)
    ]
    return (1 - rho) * math.fsum(terms)


# --- M/D/1: the simulator against queueing theory -------------------------------------------------
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_queue_wait_matches_theory(rho):
    d = 0.001  # deterministic service: 1 ms at batch 1
    mu = 1 / d
    lam = rho * mu
    t = poisson(lam, 200_000, seed=11)
    log = simulate(t, BatchPolicy(1, 0.0), ServiceModel.from_function(lambda b: d, [1]), seed=None)
    wq_theory = rho / (2 * mu * (1 - rho))
    assert log.n == len(t)
    assert abs(log.queue_s.mean() / wq_theory - 1) < 0.05  # "within a few percent"
    assert np.allclose(log.compute_s, d) and np.all(log.batch == 1)


def test_md1_waiting_time_distribution_matches_erlang():
    d, lam = 0.001, 700.0
    log = simulate(
        poisson(lam, 200_000, seed=3),
        BatchPolicy(1, 0.0),
        ServiceModel.from_function(lambda b: d, [1]),
        seed=None,
    )
    for t in (0.0005, 0.002, 0.005):
        assert abs((log.queue_s <= t).mean() - md1_wait_cdf(t, lam, d)) < 0.01


def test_capacity_search_finds_md1_capacity():
    """A fake engine of 1 ms per request, batch 1: the p99 ≤ 8 ms capacity is known in closed form."""
    from scipy.optimize import brentq

    d, slo = 0.001, 0.008
    known = brentq(lambda lam: md1_wait_cdf(slo - d, lam, d) - 0.99, 100, 999)  # P(W + D ≤ SLO) = 0.99
    service = ServiceModel.from_function(lambda b: d, [1])
    # 10k queries a level (was 60k: 840k simulated requests, 2 min on the loaded CI machine; now 140k): the
    # search brackets, bisects and retries inconclusive levels as before and lands at 0.973 × known (0.995
    # with 60k); which side of the 1.01 bound a seed lands on does not depend on n (seed 6: 1.017 / 1.022)
    load = LoadSettings(slo_s=slo, confidence=0.95, min_queries=10_000, min_duration_s=1.0, seed=5)
    res = find_capacity(
        sim_probe(service, BatchPolicy(1, 0.0), load),
        BatchPolicy(1, 0.0),
        slo,
        start_qps=500,
        ceiling_qps=1000,
        rel_tol=0.01,
    )
    # Conservative by construction (a conclusive pass needs a tail below 1 %), and close: within a few percent.
    assert 0.93 * known <= res.capacity_qps <= 1.01 * known, (res.capacity_qps, known)
    assert res.upper_qps is not None and res.upper_qps > res.capacity_qps


# --- the capacity search itself --------------------------------------------------------------------
def _threshold_probe(capacity: float, seen: list[float]):
    def probe(rate: float) -> Probe:
        seen.append(rate)
        s = LevelSummary(
            n=1000,
            n_planned=1000,
            offered_qps=rate,
            achieved_qps=rate,
            duration_s=1,
            latency_mean_s=0,
            latency_p50_s=0,
            latency_p90_s=0,
            latency_p95_s=0,
            latency_p99_s=0,
            latency_max_s=0,
            queue_mean_s=0,
            queue_p99_s=0,
            h2d_mean_s=0,
            compute_mean_s=0,
            d2h_mean_s=0,
            other_mean_s=0,
            mean_batch=1,
        )
        return Probe(rate, s, rate <= capacity)

    return probe


@pytest.mark.parametrize("start", [10.0, 1234.5, 20_000.0])
def test_capacity_search_brackets_and_bisects(start):
    seen: list[float] = []
    res = find_capacity(
        _threshold_probe(1234.5, seen), BatchPolicy(4, 0.0), 0.01, start_qps=start, rel_tol=0.02
    )
    assert 1234.5 / 1.02 <= res.capacity_qps <= 1234.5
    assert res.upper_qps > 1234.5 and (res.upper_qps - res.capacity_qps) / res.capacity_qps <= 0.02
    assert len(seen) <= 16 and not res.note


def test_capacity_search_never_probes_above_the_ceiling_and_reports_unreachable():
    seen: list[float] = []
    res = find_capacity(
        _threshold_probe(1e9, seen), BatchPolicy(1, 0.0), 0.01, start_qps=500, ceiling_qps=800
    )
    assert max(seen) < 800 and res.capacity_qps >= 800 / 1.02 / 1.02
    seen.clear()
    res = find_capacity(_threshold_probe(0.0, seen), BatchPolicy(1, 0.0), 0.01, start_qps=500, growth=1.1)
    assert res.capacity_qps == 0 and "not met" in res.note and len(seen) <= 8


def test_policy_search_prefers_batching_when_batches_are_cheap():
    """Batch cost 2 ms + 0.1 ms/request: batch 1 saturates at 476/s, so a larger max batch must win."""
    service = ServiceModel.from_function(lambda b: 0.002 + 0.0001 * b, [1, 2, 4, 8, 16], padding="bucket")
    load = LoadSettings(slo_s=0.02, min_queries=1000, min_duration_s=1.0)
    ranked = search_policies(service, load)
    best = ranked[0]
    assert best.policy.max_batch >= 4 and best.capacity_qps > 1.5 * service.saturation_qps(1)
    assert best.capacity_qps <= service.saturation_qps(best.policy.max_batch) * 1.05
    assert all(
        p.max_delay_s + service.median_at(p.max_batch) < 0.02 for p in candidate_policies(service, 0.02)
    )


# --- the batcher --------------------------------------------------------------------------------------
def test_decide_rules():
    pol = BatchPolicy(4, 0.002)
    assert decide(pol, 0.0, 0, 0.0, True).count == 0
    assert decide(pol, 0.0, 5, 0.0, True).count == 4  # a full batch goes at once
    d = decide(pol, 0.001, 2, 0.0, True)
    assert d.count == 0 and d.wait_until_s == pytest.approx(0.002)  # wait for the oldest's deadline
    assert decide(pol, 0.002, 2, 0.0, True).count == 2  # deadline reached: what is there
    assert decide(pol, 0.001, 2, 0.0, False).count == 2  # nothing more will come: no point waiting


def test_batcher_honours_max_batch_and_max_delay():
    arrivals = np.arange(0, 0.2, 0.001)  # one request per ms
    service = ServiceModel.from_function(lambda b: 0.0001, [1, 2, 3, 4])
    pol = BatchPolicy(4, 0.0025)
    log = simulate(arrivals, pol, service)
    assert log.batch.max() <= 4
    assert log.queue_s.max() <= 0.0025 + 1e-12  # nobody waits past max delay when the server is idle
    # Requests at 0, 1, 2 ms wait for the deadline of the first (2.5 ms): batches of three.
    assert list(log.batch[:6]) == [3, 3, 3, 3, 3, 3]
    assert log.dispatch_s[0] == pytest.approx(0.0025)


def test_burst_is_split_into_full_batches_immediately():
    log = simulate(
        np.zeros(10), BatchPolicy(4, 0.5), ServiceModel.from_function(lambda b: 0.01, [1, 2, 3, 4])
    )
    assert list(log.batch) == [4] * 4 + [4] * 4 + [2] * 2
    assert log.dispatch_s[0] == 0.0 and log.dispatch_s[4] == pytest.approx(
        0.01
    )  # no waiting with a full batch
    assert log.dispatch_s[8] == pytest.approx(0.02)  # the tail goes at once: no request will join it


def test_serve_loop_stops_once_a_pass_is_impossible():
    svc = ServiceModel.from_function(lambda b: 0.01, [1])  # 100/s capacity, offered 200/s: overloaded
    t = poisson(200, 2000, seed=1)
    log = simulate(t, BatchPolicy(1, 0.0), svc, stop=StopRule(slo_s=0.05, max_violations=allowed_over(2000)))
    s = summarize(log, 200, 0.05)
    assert log.n < 2000 and log.stop_kind == "violations" and s.verdict in ("fail", "inconclusive")


def test_padding_and_interpolation():
    sm = ServiceModel((1, 4, 16), (0.001, 0.002, 0.004), padding="bucket")
    assert sm.bucket(3) == 4 and sm.median_at(3) == 0.002 and sm.median_at(5) == 0.004
    ex = ServiceModel((1, 4, 16), (0.001, 0.002, 0.004), padding="exact")
    assert ex.median_at(10) == pytest.approx(0.003)
    assert sm.saturation_qps(16) == pytest.approx(4000) and sm.saturation_qps(4) == pytest.approx(2000)
    with pytest.raises(ValueError):
        sm.bucket(17)
    sampled = ServiceModel((1,), (0.001,), {1: np.array([0.001, 0.003])})
    assert {sampled.time_s(1, 0.0), sampled.time_s(1, 0.9)} == {0.001, 0.003}


def test_virtual_clock_and_loop_agree_on_time():
    clock = VirtualClock()
    log = serve_loop(
        [0.0, 0.5], BatchPolicy(1, 0.0), clock, lambda first, n: (clock.advance(0.1), (0, 0.1, 0))[1]
    )
    assert list(log.done_s) == pytest.approx([0.1, 0.6]) and clock.now() == pytest.approx(0.6)


# --- the statistical criterion ---------------------------------------------------------------------------
def test_early_stopping_rule():
    assert min_queries(0.99, 0.99) == 459  # ⌈ln 0.01 / ln 0.99⌉
    assert verdict(459, 0) == "pass" and verdict(458, 0) == "inconclusive"
    assert verdict(10_000, allowed_over(10_000)) == "pass"
    assert verdict(10_000, allowed_over(10_000) + 1) != "pass"
    assert verdict(10_000, 130) == "fail" and verdict(10_000, 100) == "inconclusive"
    assert allowed_over(100) == -1 and allowed_over(20_000) > allowed_over(10_000)


def test_seeded_poisson_is_reproducible_and_has_its_rate():
    a, b = poisson(500, 50_000, seed=4), poisson(500, 50_000, seed=4)
    assert np.array_equal(a, b) and not np.array_equal(a, poisson(500, 50_000, seed=5))
    assert abs((len(a) - 1) / a[-1] / 500 - 1) < 0.02 and np.all(np.diff(a) >= 0)


@pytest.mark.parametrize("text", ["abc", "", "0", "-3", "nan", "inf"])
def test_a_rate_that_is_no_positive_number_is_one_usage_error(text):
    with pytest.raises(UsageError, match=f"--qps must be a positive rate, got {text!r}"):
        parse_rate_qps(text)
    assert parse_rate_qps(" 250 ") == 250.0


@pytest.mark.parametrize("text", ["1e30s", "90000", "86400001ms"])
def test_a_latency_bound_past_a_day_is_one_usage_error(text):
    """``capacity --slo-p99 1e30s`` planned a table at "p99 ≤ 1e+33 ms" and exited 0."""
    with pytest.raises(UsageError, match="is over a day"):
        parse_duration_s(text, "slo-p99")
    assert parse_duration_s("86400s", "slo-p99") == 86400.0


def test_a_real_search_steps_no_lower_than_a_run_of_max_run_s():
    """Runs are at least ``min_queries`` long, so the lowest real rate is bounded by a run's wall time."""
    load = LoadSettings(slo_s=0.25, min_queries=1000, max_run_s=300.0)
    assert load.slowest_rate_qps() == pytest.approx(load.n_for(1e-9) / 300.0)
    assert load.n_for(load.slowest_rate_qps()) / load.slowest_rate_qps() == pytest.approx(300.0)
    seen: list[float] = []
    res = find_capacity(
        _threshold_probe(0.0, seen),
        BatchPolicy(1, 0.0),
        0.25,
        start_qps=300,
        floor_qps=load.slowest_rate_qps(),
    )
    assert res.capacity_qps == 0 and min(seen) >= load.slowest_rate_qps() and "not met" in res.note


def test_fixed_load_takes_qps_else_replays_the_trace_whole_at_its_own_rate():
    """`fixed_load`, both servers' fixed level: the minimums may lengthen a trace, never cut it."""
    trace = np.arange(50) * 0.1  # 10 queries/s over 4.9 s
    assert fixed_load(200.0, None, 100, 1.0) == (200.0, 200)
    assert fixed_load(200.0, trace, 10, 0.01) == (200.0, 10)  # --qps rescales: the minimums decide
    rate, n = fixed_load(None, trace, 10, 0.01)
    assert rate == pytest.approx(10.0) and n == 50
    assert fixed_load(None, trace, 80, 0.01)[1] == 80


def test_a_searched_capacity_is_said_with_its_upper_bound_where_it_has_one():
    from deepgap.serving.capacity.search import CapacityResult, capacity_words

    res = CapacityResult(BatchPolicy(512, 0.0), 2.0, capacity_qps=158.534, upper_qps=160.924)
    assert capacity_words(res, 2) == "158.53 queries/s (upper bound 160.92)"
    res.upper_qps = None  # every rate tried passed: no bound to state
    assert capacity_words(res) == "158.5 queries/s"
