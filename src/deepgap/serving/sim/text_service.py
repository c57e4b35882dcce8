"""The simulator for a text model: batch times per padded length, requests of drawn lengths.

A text batch's time depends on its size and on the length it is padded to. The worker calibrates a
batch curve at each of a few padded lengths (`deepgap.serving.sim.seqlen.calibration_lengths`: the
buckets requests use, or lengths spanning the distribution when a batch is padded to its longest);
`TextService` charges a batch of ``n`` padded to ``P`` the curve's time at ``n`` (padded to a calibrated
batch size, as the server does), interpolated linearly in ``P`` between the calibrated lengths (exact
at them: with buckets every ``P`` is calibrated). Its `simulate` draws the level's lengths with the
same seed as the real level (`SeqLenDist.draw`), orders requests into their queues as the real server
does (`seqlen.queue_order`) and runs the same loop (`deepgap.serving.sim.queues.serve_queues`) on a
virtual clock; it counts useful and padded tokens from the batches it formed.

For the capacity search's policy ranking, which asks "how long does a batch of ``n`` take", the
answer is a mixture: 256 batches of ``n`` requests drawn from the distribution, padded as served
(`samples_s`, `median_at`, `interval_at`, `saturation_qps` read it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deepgap.serving.sim.batcher import BatchPolicy, StopRule
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.log import RequestLog
from deepgap.serving.sim.queues import serve_queues
from deepgap.serving.sim.seqlen import Padding, SeqLenDist, queue_order, token_counts
from deepgap.serving.sim.simulator import ServiceModel, VirtualPipeline

MIXTURE_BATCHES = 256


@dataclass
class TextService:
    """Batch curves per calibrated padded length, the requests' length distribution and the padding."""

    curves: dict[int, ServiceModel]  # padded length → its batch curve (same batch sizes for all)
    dist: SeqLenDist
    pad: Padding
    seed: int = 0  # the levels' seed: lengths drawn for a level of n requests are `dist.draw(n, seed)`
    source: str = ""
    padding: str = "bucket"  # the batch dimension is padded to a calibrated size, as for images
    _mix: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.lengths = tuple(sorted(self.curves))
        if not self.lengths:
            raise ValueError("a text service needs at least one calibrated length")
        first = self.curves[self.lengths[0]]
        if any(c.batch_sizes != first.batch_sizes for c in self.curves.values()):
            raise ValueError("every calibrated length needs the same batch sizes")
        self.batch_sizes, self.depth = first.batch_sizes, first.depth

    @property
    def max_batch(self) -> int:  # noqa: D102
        return self.batch_sizes[-1]

    def bucket(self, n: int) -> int:
        """The calibrated batch size a batch of ``n`` runs at."""
        return self.curves[self.lengths[0]].bucket(n)

    def time_at(self, n: int, padded: float) -> tuple[float, float, np.ndarray | None]:
        """(median, interval, raw-sample ratios or None) of a batch of ``n`` padded to ``padded``."""
        ls = self.lengths
        med = [self.curves[v].median_at(n) for v in ls]
        iv = [self.curves[v].interval_at(n) for v in ls]
        near = ls[min(bisect.bisect_left(ls, padded), len(ls) - 1)]
        c = self.curves[near]
        ratios = c._ratios.get(c.bucket(n)) if c._ratios else None
        return float(np.interp(padded, ls, med)), float(np.interp(padded, ls, iv)), ratios

    def _mixture(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(medians, intervals) of `MIXTURE_BATCHES` batches of ``b`` drawn requests, padded as served."""
        if b not in self._mix:
            lens = self.dist.draw(MIXTURE_BATCHES * b, self.seed + b).reshape(MIXTURE_BATCHES, b)
            # with buckets a batch shares its first request's bucket; otherwise it pads to its longest, or
            # (packed) does its tokens' work (`Padding.effective_len`)
            eff = np.asarray([self.pad.effective_len(row[:1] if self.pad.edges else row, b) for row in lens])
            got = {p: self.time_at(b, p)[:2] for p in np.unique(eff)}
            t = np.asarray([got[p] for p in eff])
            self._mix[b] = (t[:, 0], t[:, 1])
        return self._mix[b]

    @property
    def samples_s(self) -> dict[int, np.ndarray]:
        """Per calibrated batch size: the times of batches drawn from the distribution."""
        return {b: self._mixture(b)[0] for b in self.batch_sizes}

    def median_at(self, n: int) -> float:
        """Median seconds of a batch of ``n`` drawn requests."""
        return float(np.median(self._mixture(self.bucket(n))[0]))

    def interval_at(self, n: int) -> float:
        """Mean seconds between completions of batches of ``n`` drawn requests, the pipeline full."""
        return float(np.mean(self._mixture(self.bucket(n))[1]))

    def saturation_qps(self, max_batch: int) -> float:
        """Highest sustainable request rate with batches of at most ``max_batch`` (all batches full)."""
        cap = min(max_batch, self.max_batch)
        sizes = sorted({b for b in self.batch_sizes if b <= cap} | {cap})
        return max(b / self.interval_at(b) for b in sizes)

    def simulate(
        self,
        arrivals_s: Sequence[float],
        policy: BatchPolicy,
        seed: int | None = 0,
        stop: StopRule | None = None,
    ) -> RequestLog:
        """The level on a virtual clock: the real level's lengths, queues and padding (module docstring)."""
        arr = np.asarray(arrivals_s, dtype=np.float64)
        lengths = self.dist.draw(len(arr), self.seed)
        order, starts = queue_order(lengths, self.pad)
        clock = VirtualClock()
        draws = np.random.default_rng(seed).random(len(arr)) if seed is not None else None
        pipe = VirtualTextPipeline(self, clock, draws, lengths[order])
        log = serve_queues(arr[order], starts, policy, clock, pipe, stop)
        log.useful_tokens, log.padded_tokens = token_counts(lengths[order], pipe.shapes, self.pad.packed)
        return log


class VirtualTextPipeline(VirtualPipeline):
    """`VirtualPipeline`'s two stages, a batch charged at its padded length (its waits are inherited)."""

    def __init__(self, service: TextService, clock: VirtualClock, draws: np.ndarray | None, lengths) -> None:
        self.text, self.clock, self.lengths = service, clock, lengths
        self.depth = service.depth
        self.k = 0
        self.last_done = -math.inf
        self._u = None if draws is None else np.asarray(draws, dtype=np.float64).tolist()
        self._at_len: dict[tuple[int, float], tuple[float, float, np.ndarray | None]] = {}
        self.shapes: list[tuple[int, int, int]] = []  # (first, count, padded length) per batch

    def submit(self, first: int, count: int) -> tuple[float, float, float]:
        """Schedule a batch: (done time, first-stage seconds, last-stage seconds)."""
        lens = self.lengths[first : first + count]
        padded = self.text.pad.pad_to(int(lens.max()))
        self.shapes.append((first, count, padded))
        key = (count, self.text.pad.effective_len(lens, self.text.bucket(count)))
        med, interval, ratios = self._at_len.get(key) or self._at_len.setdefault(key, self.text.time_at(*key))
        u = None if self._u is None else self._u[self.k % len(self._u)]
        self.k += 1
        total = med if u is None or ratios is None else med * float(ratios[int(u * len(ratios))])
        last = min(total, interval * total / med)
        done = max(self.clock.now() + total - last, self.last_done) + last
        self.last_done = done
        if self.depth == 1:
            self.clock.sleep_until(done)
        return done, total - last, last
