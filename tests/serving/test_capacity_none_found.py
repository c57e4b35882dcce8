"""A real capacity search that passed at no rate says why, instead of "0.0 queries/s … measured/predicted nan".

Session 33: ``serve --find-capacity --max-queries 200`` left every probe too small for a p99 verdict, and the
console stated a capacity of 0.0 queries/s and a ratio of nan to the simulator's.
"""

from __future__ import annotations

from types import SimpleNamespace

from deepgap.serving.capacity.search import CapacityResult, Probe
from deepgap.serving.run.server_scenario import _no_capacity
from deepgap.serving.sim.batcher import BatchPolicy


def _result(*verdicts: str) -> CapacityResult:
    probes = [
        Probe(rate_qps=100.0 / (i + 1), summary=SimpleNamespace(verdict=v), passed=False)
        for i, v in enumerate(verdicts)
    ]
    return CapacityResult(BatchPolicy(2, 0.0), 0.02, 0.0, None, probes, "measured")


def test_probes_too_small_for_a_verdict_name_the_setting_to_change():
    why = _no_capacity(_result("inconclusive", "inconclusive", "inconclusive"))
    assert why.startswith("every probe (3) was inconclusive") and "raise --max-queries" in why


def test_probes_that_failed_name_the_lowest_rate_tried():
    assert _no_capacity(_result("fail", "inconclusive", "fail")) == "no probe passed, down to 33.3 queries/s"
