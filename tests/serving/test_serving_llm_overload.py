"""An overloaded decoder level never passes (session 18's H200 run: 102.9 q/s "pass" with 256 slots).

The case on a virtual clock: Llama-3.1-8B-like costs (a 35 ms decode step over 256 slots, a prefill of
8 ms + 27 µs per padded prompt token), prompts uniform:64:256, outputs of 128 tokens. 256 slots turn over
once per ~128 steps (≥ 4.5 s), so no more than 256 / (127 × 35 ms) ≈ 58 q/s can be served, whatever the
prefill. At ~100 q/s the loop stops early on TTFT violations counted at admission and in the queue; the
old log kept only the requests that had finished (the first ones admitted, all on time) and judged them
"pass". The real server's loop (a scripted executor) and the simulator (the same curves) are both judged.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepgap.serving.capacity.search import LoadSettings, Probe, find_capacity, schedule
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.capacity_stats import allowed_over
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.continuous import SlotStop, drop_after, serve_continuous
from deepgap.serving.sim.llm_service import LlmLoad, LlmService, simulate_llm
from deepgap.serving.sim.seqlen import parse_seq_len_dist
from deepgap.serving.sim.token_stats import summarize_tokens

SLOTS, STEP_S, OUT = 256, 0.035, 128
PREFILL_FIXED_S, PREFILL_PER_TOKEN_S = 8e-3, 27e-6
TTFT, TPOT = 2.0, 0.1  # MLPerf's Llama-3.1-8B Server bounds
LOAD = LlmLoad(parse_seq_len_dist("uniform:64:256", 128, 4096), parse_seq_len_dist(f"fixed:{OUT}", 128, 4096))


def _prefill_s(count: int, length: int) -> float:
    return PREFILL_FIXED_S + PREFILL_PER_TOKEN_S * count * length


SERVICE = LlmService(
    {v: {b: np.full(3, _prefill_s(b, v)) for b in (1, 8, 64, 256)} for v in (64, 128, 256)},
    {SLOTS: np.full(5, STEP_S)},
    LOAD.cache_len,
)


class Scripted:
    """The real server's executor on a virtual clock: a prefill and a decode step charge the costs above."""

    def __init__(self, clock: VirtualClock, inputs: np.ndarray) -> None:
        self.clock, self.inputs = clock, inputs

    def prefill(self, first, count, slots):
        self.clock.advance(_prefill_s(count, int(self.inputs[first : first + count].max())))

    def decode(self, active):
        self.clock.advance(STEP_S)


def _stop(n: int, rate: float) -> SlotStop:
    """The capacity probe's stop rule (`LlmContext.stop` with ``early``)."""
    return SlotStop(TTFT, TPOT, allowed_over(n, 0.99, 0.99), 3.0 * n / rate + 5.0, drop_after(TTFT, 2.0))


def _levels(rate: float, n: int):
    """(real, simulated) summaries of one level: the scripted server's loop and the simulator's."""
    times = schedule(rate, n, 0)
    ins, outs = LOAD.draw(n, 0)
    clock = VirtualClock()
    real = serve_continuous(times, ins, outs, SLOTS, clock, Scripted(clock, ins), _stop(n, rate))
    sim = simulate_llm(times, LOAD, SLOTS, SERVICE, 0, _stop(n, rate), draw_seed=None)
    return [(log, summarize_tokens(log, rate, TTFT, TPOT)) for log in (real, sim)]


def test_an_overloaded_level_that_stopped_early_fails_with_every_violation_counted():
    rate, n = 102.9, 1029  # session 18's level: n_planned 1029, 83 finished, "pass"
    for log, s in _levels(rate, n):
        # stopped as soon as it could no longer pass: a fail, or inconclusive where too few were over yet
        # to call the p99 over the bound (as for images), never a pass
        assert log.stop_kind == "violations"
        assert s.verdict != "pass" and s.tokens.ttft_verdict in ("fail", "inconclusive")
        # the violations the loop stopped on reach the verdict: more than a pass of 1029 allows
        assert s.tokens.n_over_ttft > allowed_over(n) and s.n_over_slo >= s.tokens.n_over_ttft
        assert s.tokens.n_unfinished + s.tokens.n_queued > 0 and s.tokens.ttft_tail_kind.startswith("≥")
        # tokens/s: every token produced (partial outputs too) over first arrival → last token; never more
        # than full steps could give
        finished = int(log.output_len.sum())
        assert s.tokens.output_tokens > finished and s.tokens.window_s == pytest.approx(
            log.end_s - log.start_s
        )
        assert s.tokens.output_tokens_per_s <= SLOTS / STEP_S


def test_a_sustainable_rate_still_passes_and_reports_its_offered_tokens():
    sat = SERVICE.saturation_qps(SLOTS, LOAD)
    rate = 30.0
    assert rate < 0.7 * sat
    for log, s in _levels(rate, 1000):
        assert log.stop_kind == "" and log.n == 1000 and s.tokens.n_unfinished == s.tokens.n_queued == 0
        assert s.verdict == "pass" and s.tokens.ttft_tail_kind == "p99"
        assert s.tokens.output_tokens == 1000 * OUT
        # over its window, which ends with the last request's own ~4.5 s of decode: a little under the offered
        assert 0.8 * rate * OUT < s.tokens.output_tokens_per_s < rate * OUT


def test_saturation_is_an_upper_bound_and_the_simulated_search_stays_under_it():
    sat = SERVICE.saturation_qps(SLOTS, LOAD)
    # slots / ((output − 1) · step + slots · cheapest prefill per prompt, at the mean prompt of 160)
    per_prompt = min(_prefill_s(b, 160) / b for b in (1, 8, 64, 256))
    assert sat == pytest.approx(SLOTS / ((OUT - 1) * STEP_S + SLOTS * per_prompt))
    assert sat < SLOTS / ((OUT - 1) * STEP_S) < 60
    settings = LoadSettings(slo_s=TTFT, min_queries=1000, min_duration_s=20.0, max_queries=2000)

    def probe(rate):
        n = settings.n_for(rate)
        s = summarize_tokens(
            simulate_llm(schedule(rate, n, 0), LOAD, SLOTS, SERVICE, 0, _stop(n, rate)), rate, TTFT, TPOT
        )
        return Probe(rate, s, s.verdict == "pass")

    r = find_capacity(probe, BatchPolicy(SLOTS, 0.0), TTFT, 0.6 * sat, sat, rel_tol=0.05)
    assert 0.6 * sat <= r.capacity_qps < sat
