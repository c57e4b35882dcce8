"""The discrete-event simulator: `serve_loop` on a `VirtualClock`, batches charged a service time.

Service times come from a batch-sweep curve — the server's own calibration, or any store's
``deepgap run`` results — as a `ServiceModel`: for a batch of ``n`` requests, the median latency at
the smallest measured batch size ≥ ``n`` (``padding="bucket"``, what the real server does: it runs
engine profiles at the measured sizes and pads) or the median interpolated linearly between measured
sizes (``padding="exact"``, a dynamic-shape engine). When raw samples are known, each batch draws its
time from them (scaled to the interpolated median), so the predicted tail carries the measured jitter.

A pipelined server (copy-in of one batch overlapping compute of the previous, ``depth`` in flight)
is modelled as two stages in tandem: per batch size the calibration measured the latency ``L`` of a
batch alone and the interval ``I`` between completions with the pipeline full. The last stage takes
``I`` (the bottleneck: normalise, engine, copy-out, one batch at a time) and the first ``L − I``
(copy-in and issue, overlapping): a batch submitted at ``t`` is done at ``max(t + L − I, previous
done) + I``. Without intervals (older curves, a CPU) ``I = L`` and depth 1: the serial server.

`TimedExecutor` is the same two-stage server on the wall clock: batches take the model's median
time and nothing computes. Real drivers (deepgap's event loop on a `RealClock`, MLCommons LoadGen's
threads) run against it, so their latencies can be compared with each other and with the simulator
on a server whose service time is known, on a CPU, in a test.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from deepgap.serving.sim.batcher import BatchPolicy, StopRule, serve_loop
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.log import RequestLog

PADDINGS = ("bucket", "exact")


@dataclass
class ServiceModel:
    """Seconds to serve a batch of ``n`` requests, from a measured (or known) batch → latency curve."""

    batch_sizes: tuple[int, ...]
    median_s: tuple[float, ...]
    samples_s: dict[int, np.ndarray] = field(default_factory=dict)  # raw latencies per measured batch
    padding: str = "bucket"
    source: str = ""  # where the curve came from, for reports
    interval_s: tuple[float, ...] | None = None  # per batch size: seconds between completions, pipeline full
    depth: int = 1  # batches the server keeps in flight

    def __post_init__(self) -> None:
        order = np.argsort(self.batch_sizes)
        self.batch_sizes = tuple(int(self.batch_sizes[i]) for i in order)
        self.median_s = tuple(float(self.median_s[i]) for i in order)
        if self.interval_s is not None:
            self.interval_s = tuple(
                min(float(self.interval_s[i]), self.median_s[j]) for j, i in enumerate(order)
            )
        if not self.batch_sizes or len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("a service curve needs distinct batch sizes")
        if any(not (m > 0 and math.isfinite(m)) for m in self.median_s):
            raise ValueError("service times must be positive")
        if self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}")
        self._median = dict(zip(self.batch_sizes, self.median_s, strict=True))
        self._interval = dict(zip(self.batch_sizes, self.interval_s or self.median_s, strict=True))
        self._ratios = {
            b: np.asarray(s, dtype=np.float64) / m
            for b, m in zip(self.batch_sizes, self.median_s, strict=True)
            if (s := self.samples_s.get(b)) is not None and len(s) > 0
        }

    @classmethod
    def from_function(
        cls,
        fn: Callable[[int], float],
        batch_sizes: Sequence[int],
        padding: str = "exact",
        source: str = "function",
    ) -> ServiceModel:
        """A deterministic model (tests, fake engines): ``fn(batch)`` seconds at each listed size."""
        return cls(
            tuple(batch_sizes), tuple(float(fn(b)) for b in batch_sizes), padding=padding, source=source
        )

    @property
    def max_batch(self) -> int:
        """Largest batch this curve covers."""
        return self.batch_sizes[-1]

    def bucket(self, n: int) -> int:
        """The measured batch size a batch of ``n`` runs at (padding mode) — ``n`` itself in exact mode."""
        if n < 1 or n > self.max_batch:
            raise ValueError(f"batch {n} outside the measured range 1..{self.max_batch}")
        if self.padding == "exact":
            return n
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, n)]

    def median_at(self, n: int) -> float:
        """Median seconds for a batch of ``n`` requests."""
        b = self.bucket(n)
        if self.padding == "bucket":
            return self._median[b]
        return float(np.interp(b, self.batch_sizes, self.median_s))

    def interval_at(self, n: int) -> float:
        """Seconds between completions of batches of ``n`` with the pipeline full (= `median_at` serially)."""
        b = self.bucket(n)
        if self.padding == "bucket":
            return self._interval[b]
        return float(np.interp(b, self.batch_sizes, [self._interval[x] for x in self.batch_sizes]))

    def time_s(self, n: int, u: float | None = None) -> float:
        """Service seconds for ``n`` requests; ``u`` ∈ [0, 1) picks a raw sample (None: the median)."""
        med = self.median_at(n)
        if u is None or not self._ratios:
            return med
        ref = self.batch_sizes[min(bisect.bisect_left(self.batch_sizes, n), len(self.batch_sizes) - 1)]
        ratios = self._ratios.get(ref)
        if ratios is None:
            return med
        return med * float(ratios[int(u * len(ratios))])

    def saturation_qps(self, max_batch: int) -> float:
        """Highest sustainable request rate with batches of at most ``max_batch`` (all batches full)."""
        cap = min(max_batch, self.max_batch)
        sizes = sorted({b for b in self.batch_sizes if b <= cap} | {cap})
        return max(b / self.interval_at(b) for b in sizes)

    def describe(self) -> list[dict[str, float]]:
        """The curve as rows (batch, median seconds, images/s)."""
        return [
            {
                "batch_size": b,
                "median_s": m,
                "interval_s": self._interval[b],
                "throughput_ips": b / self._interval[b],
            }
            for b, m in zip(self.batch_sizes, self.median_s, strict=True)
        ]


def simulate(
    arrivals_s: Sequence[float],
    policy: BatchPolicy,
    service: ServiceModel,
    seed: int | None = 0,
    stop: StopRule | None = None,
) -> RequestLog:
    """Serve ``arrivals_s`` on a virtual clock; ``seed`` draws sampled service times (None: medians)."""
    if policy.max_batch > service.max_batch:
        raise ValueError(
            f"max_batch {policy.max_batch} exceeds the service curve's largest batch {service.max_batch}"
        )
    own = getattr(service, "simulate", None)  # a text model's service (`sim.text_service.TextService`)
    if own is not None:
        return own(arrivals_s, policy, seed, stop)
    clock = VirtualClock()
    rng = np.random.default_rng(seed) if seed is not None else None
    draws = rng.random(len(arrivals_s)) if rng is not None else None
    return serve_loop(arrivals_s, policy, clock, VirtualPipeline(service, clock, draws), stop)


class VirtualPipeline:
    """The server's executor on a virtual clock: two stages in tandem (see the module docstring)."""

    def __init__(self, service: ServiceModel, clock: VirtualClock, draws: np.ndarray | None) -> None:
        self.service, self.clock, self.draws = service, clock, draws
        self.depth = service.depth
        self.k = 0
        self.last_done = -math.inf
        self._at: dict[int, tuple[float, float, np.ndarray | None]] = {}  # per batch size, computed once
        self._u = None if draws is None else np.asarray(draws, dtype=np.float64).tolist()

    def _service_at(self, n: int) -> tuple[float, float, np.ndarray | None]:
        """(median, interval, raw-sample ratios or None) for a batch of ``n``, computed once per size.

        What `ServiceModel.time_s`, `median_at` and `interval_at` compute; a dict lookup per batch instead
        (this is the simulator's hot loop: the planner and capacity searches run it for every policy).
        """
        sv = self.service
        ratios = None
        if sv._ratios:
            ref = sv.batch_sizes[min(bisect.bisect_left(sv.batch_sizes, n), len(sv.batch_sizes) - 1)]
            ratios = sv._ratios.get(ref)
        got = self._at[n] = (sv.median_at(n), sv.interval_at(n), ratios)
        return got

    def submit(self, first: int, count: int) -> tuple[float, float, float]:
        """Schedule a batch: (done time, first-stage seconds, last-stage seconds)."""
        med, interval, ratios = self._at.get(count) or self._service_at(count)
        u = None if self._u is None else self._u[self.k % len(self._u)]
        self.k += 1
        total = med if u is None or ratios is None else med * float(ratios[int(u * len(ratios))])  # time_s
        scale = total / med
        last = min(total, interval * scale)
        now = self.clock.now()
        done = max(now + total - last, self.last_done) + last
        self.last_done = done
        if self.depth == 1:  # serial: the loop's executor is busy until then
            self.clock.sleep_until(done)
        return done, total - last, last

    def done(self, ticket: tuple[float, float, float]) -> bool:  # noqa: D102
        return ticket[0] <= self.clock.now()

    def wait_until(self, ticket: tuple[float, float, float], clock: VirtualClock, t_s: float) -> None:  # noqa: D102
        clock.sleep_until(min(ticket[0], t_s))

    def wait(self, ticket: tuple[float, float, float]) -> tuple[float, float, float, float]:  # noqa: D102
        self.clock.sleep_until(ticket[0])
        return 0.0, ticket[2] if self.depth > 1 else ticket[1] + ticket[2], 0.0, 0.0


class TimedExecutor:
    """A simulated server on the wall clock (``time.perf_counter``): the executor protocol, no work.

    ``submit`` returns at once; a batch is done at ``max(now + L − I, previous done) + I`` (medians of
    ``service``), as `VirtualPipeline`; ``wait`` sleeps until then (the GIL released).
    """

    def __init__(self, service: ServiceModel, pool_size: int = 256) -> None:
        self.service, self.pool_size = service, pool_size
        self.depth = service.depth
        self.buckets = list(service.batch_sizes)
        self.last_done = -math.inf
        self.batches = 0

    def submit(self, first: int, count: int) -> tuple[float, float, float]:
        """Schedule a batch: (done instant, first-stage seconds, last-stage seconds)."""
        sv = self.service
        total, last = sv.median_at(count), sv.interval_at(count)
        done = max(time.perf_counter() + total - last, self.last_done) + last
        self.last_done = done
        self.batches += 1
        return done, total - last, last

    def done(self, ticket: tuple[float, float, float]) -> bool:  # noqa: D102
        return time.perf_counter() >= ticket[0]

    def wait_until(self, ticket: tuple[float, float, float], clock, t_s: float) -> None:
        """Sleep until the batch is done or ``clock`` (a `RealClock`) reaches ``t_s``."""
        until = min(ticket[0], getattr(clock, "origin_s", 0.0) + t_s) - time.perf_counter()
        if until > 0:
            time.sleep(until)

    def wait(self, ticket: tuple[float, float, float]) -> tuple[float, float, float, float]:  # noqa: D102
        left = ticket[0] - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return 0.0, ticket[1] + ticket[2], 0.0, 0.0
