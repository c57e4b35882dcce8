"""Whether a plan is limited by the batch grid it was measured on, and which batches to measure next.

Why its own concept: a plan can only form the batches a sweep measured. With a quantized engine measured at
batch 1 (0.62 ms) and 256 (8.2 ms) and a 3 ms SLO, the plan serves batch 1 and asks for two H200s, where
one at batch 8–32 very likely suffices: nothing between 1 and 256 was measured, and padding a batch of 9
to 256 breaks the SLO. The plan says so, and names the batches whose measurement would settle it: powers
of two in the unmeasured gap whose time, interpolated linearly between the gap's two ends (below the
smallest measured batch: in proportion to the batch), fits the SLO.
"""

from __future__ import annotations

from deepgap.serving.sim.simulator import ServiceModel

MAX_SUGGESTED = 4  # batches named; more would be a sweep of its own


def _spread(xs: list[int]) -> list[int]:
    """At most `MAX_SUGGESTED` of ``xs``, evenly spread in log (first and last kept)."""
    if len(xs) <= MAX_SUGGESTED:
        return xs
    step = (len(xs) - 1) / (MAX_SUGGESTED - 1)
    return sorted({xs[round(i * step)] for i in range(MAX_SUGGESTED)})


def _powers(lo: int, hi: int) -> list[int]:
    """Powers of two strictly between ``lo`` and ``hi``."""
    out, x = [], 1
    while x < hi:
        if x > lo:
            out.append(x)
        x *= 2
    return out


def grid_limit(sv: ServiceModel, slo_s: float) -> str:
    """'' where the measured grid does not limit the plan at ``slo_s``; else what does, and what to measure."""
    bs = list(sv.batch_sizes)
    if not bs or sv.padding == "exact":  # exact padding interpolates between measured batches: no grid
        return ""
    t = {b: sv.median_at(b) for b in bs}
    within = [b for b in bs if t[b] < slo_s]
    ms = lambda s: f"{s * 1e3:.3g} ms"  # noqa: E731
    if not within:
        gap = _powers(0, bs[0]) if bs[0] > 1 else []
        if not gap:
            return ""
        # a time proportional to the batch, through the origin: the most a smaller batch could gain
        gap = [x for x in gap if t[bs[0]] * x / bs[0] < slo_s] or gap[:1]
        return (
            f"grid-limited: no measured batch fits the {ms(slo_s)} SLO (the smallest, {bs[0]}, takes "
            f"{ms(t[bs[0]])}) and no batch below {bs[0]} was measured: measure --batch-sizes "
            + ",".join(map(str, _spread(gap)))
        )
    b = max(within)
    above = [x for x in bs if x > b]
    if not above:
        if t[b] >= slo_s / 2:
            return ""
        return (
            f"grid-limited: the largest measured batch, {b}, takes {ms(t[b])}, under half the "
            f"{ms(slo_s)} SLO, and no larger batch was measured: measure --batch-sizes {2 * b},{4 * b}"
        )
    nxt = above[0]
    gap = _powers(b, nxt)
    if not gap:
        return ""
    fits = [x for x in gap if t[b] + (x - b) * (t[nxt] - t[b]) / (nxt - b) < slo_s] or gap[:1]
    return (
        f"grid-limited: batch {b} ({ms(t[b])}) is the largest measured within the {ms(slo_s)} SLO and the "
        f"next measured, {nxt}, takes {ms(t[nxt])}; no batch between them was measured: measure "
        "--batch-sizes " + ",".join(map(str, _spread(fits)))
    )


def short(limit: str) -> str:
    """A `grid_limit` text for a table cell: 'grid-limited: measure --batch-sizes 2,8,16,64' (or '')."""
    return f"grid-limited: measure{limit.rsplit('measure', 1)[1]}" if limit else ""
