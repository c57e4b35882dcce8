"""The statistical stop rule for "the p-th percentile latency is within the SLO" (MLPerf's early stopping).

Each served request either exceeds the SLO or not. If the true p99 were above the SLO, at least 1 %
of requests would exceed it, so the count ``k`` of ``n`` requests over the SLO would be at least a
Binomial(n, 0.01) draw. We call a run a *pass* when ``P(Binomial(n, 1-p) ≤ k) ≤ 1 − confidence``
(too few violations for a p99 above the SLO to be plausible), a *fail* when
``P(Binomial(n, 1-p) ≥ k) ≤ 1 − confidence`` (too many for a p99 within it), else *inconclusive*.
This is LoadGen's early-stopping reasoning; like LoadGen it treats requests as independent, which
queueing makes optimistic (neighbouring requests share waits), so the pass rule errs on the
conservative side by counting an inconclusive run as not passing.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _binom():
    """`scipy.stats.binom`, imported on first use (scipy.stats costs ~1.5 s at every CLI start)."""
    from scipy import stats as sps

    return sps.binom


def _alpha(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return 1.0 - confidence


def verdict(n: int, n_over: int, percentile: float = 0.99, confidence: float = 0.99) -> str:
    """'pass', 'fail' or 'inconclusive' for ``n_over`` of ``n`` requests over the SLO."""
    if n <= 0:
        return "inconclusive"
    q = 1.0 - percentile
    a = _alpha(confidence)
    if _binom().cdf(n_over, n, q) <= a:
        return "pass"
    if n_over > 0 and _binom().sf(n_over - 1, n, q) <= a:
        return "fail"
    return "inconclusive"


@lru_cache(maxsize=4096)
def allowed_over(n: int, percentile: float = 0.99, confidence: float = 0.99) -> int:
    """Largest count over the SLO that still passes with ``n`` requests; −1 when even 0 cannot pass."""
    q = 1.0 - percentile
    k = int(_binom().ppf(_alpha(confidence), n, q))  # smallest k with cdf(k) ≥ α
    while k >= 0 and _binom().cdf(k, n, q) > _alpha(confidence):
        k -= 1
    return k


def min_queries(percentile: float = 0.99, confidence: float = 0.99) -> int:
    """Fewest requests that can pass at all (none over the SLO): ⌈ln(1−c) / ln(p)⌉."""
    return int(math.ceil(math.log(_alpha(confidence)) / math.log(percentile)))
