"""Pure statistics over raw latency samples (numpy/scipy, nothing hand-rolled).

Percentiles use numpy's default (linear interpolation). Confidence intervals are 95% percentile
bootstraps with a fixed seed, so the same samples always give the same interval. With fewer than
two samples an interval collapses to the point: the run count stored beside every number says
how much to trust it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np

from deepgap.core.records import LatencyStats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
_SEED = 20260423


def _bootstrap(*args, seed: int, **kw):
    """`scipy.stats.bootstrap`, imported on first use (scipy.stats costs ~1.5 s at every CLI start).

    scipy renamed random_state → rng (1.15); either is accepted, so any supported scipy works.
    """
    from scipy import stats as sps

    key = "rng" if "rng" in inspect.signature(sps.bootstrap).parameters else "random_state"
    return sps.bootstrap(*args, **kw, **{key: np.random.default_rng(seed)})


def _p99(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(x, 99, axis=axis)


def bootstrap_ci(
    samples: Sequence[float] | np.ndarray,
    statistic: Callable[..., np.ndarray] = np.median,
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, float]:
    """95% percentile-bootstrap CI of ``statistic`` (vectorized, ``axis`` keyword) over ``samples``."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < 2 or np.all(x == x[0]):
        v = float(statistic(x, axis=-1)) if x.size else float("nan")
        return v, v
    res = _bootstrap(
        (x,),
        statistic,
        n_resamples=n_resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        axis=-1,
        seed=_SEED,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def hierarchical_bootstrap_ci(
    groups: Sequence[Sequence[float] | np.ndarray],
    statistic: Callable[..., np.ndarray] = np.median,
    n_resamples: int = 1000,
    per_group: int = 1000,
    seed: int = _SEED,
) -> tuple[float, float]:
    """95% CI of ``statistic`` over samples that come in groups (worker processes, sweeps, machines).

    Two-level percentile bootstrap: each resample draws the groups with replacement, then each drawn
    group's samples with replacement. Samples of one process share that process's speed (clocks, memory
    placement, a JIT's choices), so they are not independent draws of the quantity a user will measure
    tomorrow; a bootstrap over the pooled samples treats them as if they were and gives intervals that
    other processes miss. Every group contributes ``per_group`` draws (capped at its size), so each
    process weighs the same whatever its sample count. With one group this is the ordinary bootstrap.
    """
    arrs = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    arrs = [a[np.isfinite(a)] for a in arrs]
    arrs = [a for a in arrs if a.size]
    if not arrs:
        return float("nan"), float("nan")
    if len(arrs) == 1:
        return bootstrap_ci(arrs[0], statistic, n_resamples)
    rng = np.random.default_rng(seed)
    k = int(min(per_group, min(a.size for a in arrs)))
    sizes = np.array([a.size for a in arrs])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.concatenate(arrs)
    n_groups = len(arrs)
    chosen = rng.integers(0, n_groups, size=(n_resamples, n_groups))  # level 1: processes
    u = rng.random((n_resamples, n_groups, k))  # level 2: samples within each drawn process
    idx = offsets[chosen][..., None] + (u * sizes[chosen][..., None]).astype(np.int64)
    stat = statistic(flat[idx].reshape(n_resamples, -1), axis=-1)
    alpha = (1.0 - CONFIDENCE) / 2
    lo, hi = np.quantile(stat, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


MAX_DRAWS = 12000  # samples per resample of the three-level bootstrap (memory: resamples × this indices)


def card_bootstrap(
    cards: Sequence[Sequence[Sequence[float] | np.ndarray]],
    statistic: Callable[..., np.ndarray] = np.median,
    n_resamples: int = 1000,
    per_group: int = 1000,
    seed: int = _SEED,
) -> np.ndarray:
    """Bootstrap distribution of ``statistic`` over samples grouped by card, then process (three levels).

    ``cards[c][p]`` are the samples of process (sweep) ``p`` on card ``c``. Each resample draws the cards
    with replacement, then within each drawn card as many processes as the card with the most, with
    replacement, then each drawn process's samples with replacement. Why the card level: a card is not the
    GPU type. ResNet-50 compile-freeze fp16 bs256 measured 29.6k to 31.9k img/s on four H200s, while a
    two-level interval over one card's processes was ±0.4% (issue 34): the next card a user buys is a draw
    from the cards, not from one card's processes. Every card and every process weighs the same whatever
    its sample count. Returns the ``n_resamples`` values (empty when no card has a sample); with one card
    it is `hierarchical_bootstrap_ci`'s two-level scheme.
    """
    nested = [[np.asarray(p, dtype=np.float64).ravel() for p in card] for card in cards]
    nested = [[p[np.isfinite(p)] for p in card] for card in nested]
    nested = [[p for p in card if p.size] for card in nested]
    nested = [card for card in nested if card]
    if not nested:
        return np.empty(0)
    rng = np.random.default_rng(seed)
    procs = [p for card in nested for p in card]
    sizes = np.array([p.size for p in procs])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.concatenate(procs)
    counts = np.array([len(card) for card in nested])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_cards, m = len(nested), int(counts.max())
    k = int(max(1, min(per_group, sizes.min(), MAX_DRAWS // (n_cards * m))))
    card = rng.integers(0, n_cards, size=(n_resamples, n_cards))  # level 1: cards
    proc = starts[card][..., None] + (rng.random((n_resamples, n_cards, m)) * counts[card][..., None]).astype(
        np.int64
    )  # level 2: processes within each drawn card
    u = rng.random((n_resamples, n_cards, m, k))  # level 3: samples within each drawn process
    idx = offsets[proc][..., None] + (u * sizes[proc][..., None]).astype(np.int64)
    return np.asarray(statistic(flat[idx].reshape(n_resamples, -1), axis=-1), dtype=np.float64)


def card_bootstrap_ci(
    cards: Sequence[Sequence[Sequence[float] | np.ndarray]],
    statistic: Callable[..., np.ndarray] = np.median,
    n_resamples: int = 1000,
    seed: int = _SEED,
) -> tuple[float, float]:
    """95% CI of ``statistic`` by the three-level bootstrap `card_bootstrap` (cards, processes, samples)."""
    dist = card_bootstrap(cards, statistic, n_resamples, seed=seed)
    if not dist.size:
        return float("nan"), float("nan")
    alpha = (1.0 - CONFIDENCE) / 2
    lo, hi = np.quantile(dist, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def ratio_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    statistic: Callable[..., np.ndarray] = np.median,
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, float, float]:
    """Point estimate and 95% bootstrap CI of ``statistic(a) / statistic(b)`` (independent samples).

    Used for speedups: with latencies, pass the slower side as ``a`` to get "how many times faster".
    """
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    point = float(statistic(xa, axis=-1) / statistic(xb, axis=-1))
    if xa.size < 2 or xb.size < 2:
        return point, point, point
    res = _bootstrap(
        (xa, xb),
        lambda u, v, axis=-1: statistic(u, axis=axis) / statistic(v, axis=axis),
        n_resamples=n_resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        paired=False,
        axis=-1,
        seed=_SEED,
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def min_samples(q: float, confidence: float = 0.95) -> int:
    """Fewest samples whose distribution-free ``confidence`` interval of quantile ``q`` ends below the max.

    `deepgap.analysis.tails` says why; here so that the run console (below analysis) uses the same rule.
    """
    return int(math.ceil(math.log((1 - confidence) / 2) / math.log(q)))


P99_MIN_N = min_samples(0.99)  # 368


def summarize(samples_s: Sequence[float] | np.ndarray) -> LatencyStats:
    """Distribution summary of per-iteration latencies in seconds."""
    x = np.asarray(samples_s, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    p5, p50, p90, p95, p99 = np.percentile(x, [5, 50, 90, 95, 99])
    med_lo, med_hi = bootstrap_ci(x, np.median)
    p99_lo, p99_hi = bootstrap_ci(x, _p99)
    return LatencyStats(
        n=int(x.size),
        mean_s=float(x.mean()),
        std_s=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        min_s=float(x.min()),
        p5_s=float(p5),
        median_s=float(p50),
        p90_s=float(p90),
        p95_s=float(p95),
        p99_s=float(p99),
        max_s=float(x.max()),
        median_ci_low_s=med_lo,
        median_ci_high_s=med_hi,
        p99_ci_low_s=p99_lo,
        p99_ci_high_s=p99_hi,
    )


def median_ci_halfwidth_rel(samples_s: Sequence[float] | np.ndarray, n_resamples: int = 500) -> float:
    """Half-width of the median's 95% CI relative to the median: the adaptive mode's stop rule."""
    x = np.asarray(samples_s, dtype=np.float64)
    if x.size < 5:
        return float("inf")
    lo, hi = bootstrap_ci(x, np.median, n_resamples=n_resamples)
    med = float(np.median(x))
    return (hi - lo) / 2.0 / med if med > 0 else float("inf")


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """std/mean (ddof=1) of per-repeat statistics; None with fewer than two repeats."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2 or v.mean() == 0:
        return None
    return float(v.std(ddof=1) / v.mean())


def throughput_from_latency(batch_size: int, stats: LatencyStats) -> tuple[float, float, float]:
    """Images/s = batch / median latency, with the CI carried through the (monotone) inverse."""
    return (
        batch_size / stats.median_s,
        batch_size / stats.median_ci_high_s,
        batch_size / stats.median_ci_low_s,
    )


def finite_or_none(v: object) -> float | None:
    """``float(v)`` when it is a finite number, else None: stored JSON and frames hold None, NaN and text."""
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
