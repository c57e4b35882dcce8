"""Per-request records of one serving run and their summary (latency parts, percentiles, SLO count).

A request's latency runs from its scheduled arrival to the end of its batch's device→host copy, and
splits into queue wait (arrival → dispatch), host→device copy, compute, device→host copy, and
``other`` (the rest: gathering inputs into the pinned batch buffer, launch and synchronization
overheads). Parts are per batch, shared by the requests in it. ``host_s`` is the launching thread's
own time to issue the request's batch (inside the latency, overlapping the device's work when the
executor pipelines). Dropped requests (a bounded queue under overload) are counted, not logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.core.stats import P99_MIN_N
from deepgap.serving.sim.capacity_stats import verdict


class Served:
    """A log of served requests: ``n`` and latency from its arrival and done columns, defined once.

    Its logs: this module's `RequestLog` and a decoder's `continuous.TokenLog`.
    """

    arrival_s: np.ndarray
    done_s: np.ndarray

    @property
    def n(self) -> int:
        """Requests served."""
        return len(self.arrival_s)

    @property
    def latency_s(self) -> np.ndarray:
        """Arrival → done: the result on the host (a decoder's: its last token)."""
        return self.done_s - self.arrival_s


@dataclass
class RequestLog(Served):
    """Column arrays, one entry per request, in arrival order."""

    arrival_s: np.ndarray
    dispatch_s: np.ndarray
    done_s: np.ndarray
    batch: np.ndarray  # requests in the request's batch
    h2d_s: np.ndarray
    compute_s: np.ndarray
    d2h_s: np.ndarray
    n_planned: int = 0
    stopped: str = ""  # why the run ended before every planned request was served
    stop_kind: str = ""  # "violations" (it could no longer pass) | "time" (it fell behind) | ""
    host_s: np.ndarray | None = None  # per request: host time issuing its batch (None: not measured)
    n_dropped: int = 0  # requests shed by a bounded queue (never served)
    useful_tokens: int = 0  # a text level: the served requests' own tokens (0: not a text level)
    padded_tokens: int = 0  # a text level: tokens the engine ran, padding included

    @classmethod
    def from_batches(cls, arrival_s, batches: list[tuple], n_planned: int) -> RequestLog:
        """Expand per-batch records to per-request columns.

        A record is (count, dispatch, done, h2d, compute, d2h[, host, first]); ``first`` indexes
        ``arrival_s`` (all arrivals of the run); without it batches are consecutive from 0.
        """
        width = max((len(b) for b in batches), default=6)
        a = np.asarray(batches, dtype=np.float64).reshape(-1, width)
        counts = a[:, 0].astype(np.int64)
        col = [np.repeat(a[:, j], counts) for j in range(width)]
        arrival = np.asarray(arrival_s, dtype=np.float64)
        if width >= 8:  # gather each batch's contiguous range, vectorised
            starts = a[:, 7].astype(np.int64)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            arrival = arrival[np.repeat(starts, counts) + offsets]
        else:
            arrival = arrival[: int(counts.sum())]
        return cls(
            arrival,
            col[1],
            col[2],
            col[0].astype(np.int64),
            col[3],
            col[4],
            col[5],
            n_planned=n_planned,
            host_s=col[6] if width >= 7 else None,
        )

    @property
    def queue_s(self) -> np.ndarray:
        """Arrival → dispatch."""
        return self.dispatch_s - self.arrival_s

    @property
    def other_s(self) -> np.ndarray:
        """Latency not covered by queue, copies and compute."""
        return self.latency_s - self.queue_s - self.h2d_s - self.compute_s - self.d2h_s

    def columns(self) -> dict[str, np.ndarray]:
        """Every column, for storage."""
        return {
            "arrival_s": self.arrival_s,
            "dispatch_s": self.dispatch_s,
            "done_s": self.done_s,
            "batch": self.batch,
            "queue_s": self.queue_s,
            "h2d_s": self.h2d_s,
            "compute_s": self.compute_s,
            "d2h_s": self.d2h_s,
            "latency_s": self.latency_s,
        }


@dataclass
class LevelSummary:
    """One run at one load level: what was offered, what came out, and the SLO verdict."""

    n: int
    n_planned: int
    offered_qps: float | None
    achieved_qps: float
    duration_s: float
    latency_mean_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p95_s: float
    latency_p99_s: float
    latency_max_s: float
    queue_mean_s: float
    queue_p99_s: float
    h2d_mean_s: float
    compute_mean_s: float
    d2h_mean_s: float
    other_mean_s: float
    mean_batch: float
    slo_s: float | None = None
    n_dropped: int = 0
    host_mean_s: float = 0.0
    n_over_slo: int | None = None
    verdict: str = "none"  # pass | fail | inconclusive | none (no SLO)
    stopped: str = ""
    extra: dict = field(default_factory=dict)
    useful_tokens_per_s: float | None = None  # a text level: its requests' own tokens per second
    padded_tokens_per_s: float | None = None  # a text level: tokens the engine ran per second, padding in
    tokens: Any = None  # a decoder's level: its `deepgap.serving.sim.token_stats.TokenStats`

    def tail_words(self) -> str:
        """What every console line calls a level's tail.

        ``p99 6.128 ms`` where n supports a p99 (≥ `P99_MIN_N` requests), else ``max 31.000 ms (n=348, too few
        for a p99)``.
        """
        if self.n >= P99_MIN_N:
            return f"p99 {self.latency_p99_s * 1e3:.3f} ms"
        return f"max {self.latency_max_s * 1e3:.3f} ms (n={self.n}, too few for a p99)"

    def tail_fields(self, prefix: str) -> dict[str, float | str]:
        """``{prefix}_tail_s`` and ``{prefix}_tail_kind`` for ``serve --json``: the tail the console names.

        Why beside ``{prefix}_p99_s`` (kept: scripts read it): a level of 20 requests has no p99; its
        tail is its max, and the JSON says which (``p99`` or ``max``), as `tail_words` does.
        """
        kind = "p99" if self.n >= P99_MIN_N else "max"
        return {
            f"{prefix}_tail_s": self.latency_p99_s if kind == "p99" else self.latency_max_s,
            f"{prefix}_tail_kind": kind,
        }


def summarize(
    log: RequestLog,
    offered_qps: float | None,
    slo_s: float | None = None,
    percentile: float = 0.99,
    confidence: float = 0.99,
) -> LevelSummary:
    """Summary of a run; with an SLO, the early-stopping verdict for "p``percentile`` ≤ SLO"."""
    lat = log.latency_s
    if lat.size == 0:
        raise ValueError("no request was served")
    span = float(log.done_s.max() - log.arrival_s.min())
    n_over = int((lat > slo_s).sum()) if slo_s is not None else None
    v = "none" if n_over is None else judged(log, n_over, percentile, confidence)
    return LevelSummary(
        **latency_fields(log, offered_qps, span, lat, log.queue_s),
        h2d_mean_s=float(log.h2d_s.mean()),
        compute_mean_s=float(log.compute_s.mean()),
        d2h_mean_s=float(log.d2h_s.mean()),
        other_mean_s=float(log.other_s.mean()),
        mean_batch=float(log.batch.mean()),
        slo_s=slo_s,
        n_over_slo=n_over,
        verdict=v,
        stopped=log.stopped,
        n_dropped=log.n_dropped,
        host_mean_s=float(np.mean(log.host_s)) if log.host_s is not None else 0.0,
        useful_tokens_per_s=log.useful_tokens / span if log.padded_tokens and span > 0 else None,
        padded_tokens_per_s=log.padded_tokens / span if log.padded_tokens and span > 0 else None,
    )


def judged(log, n_over: int, percentile: float, confidence: float, n: int | None = None) -> str:
    """The verdict on ``n_over`` of ``n`` requests (default ``log.n``) over a bound, as the run's stop requires.

    ``log``: any log with ``n``, ``n_planned``, ``n_dropped`` and ``stop_kind`` (images', a decoder's).
    ``n``: the requests judged, where more than the logged ones are known (a decoder's TTFT: the requests a
    stop left decoding or queued past the bound); an image's log holds every request its loop counted.
    """
    n = log.n if n is None else n
    if log.stop_kind == "time":
        # Fell behind: the unserved requests were already later than any SLO a run is meant for.
        return verdict(log.n_planned, n_over + (log.n_planned - n), percentile, confidence)
    if log.stop_kind == "violations":  # it cannot pass any more: a fail where what it served says so
        # (26 of 578 requests over a p99 SLO is 4.5%: conclusively above 1%, a fail, not "inconclusive"
        # against the 2,000 it had planned); else judged against the planned count, as before
        served = verdict(n + log.n_dropped, n_over + log.n_dropped, percentile, confidence)
        planned = verdict(log.n_planned, n_over + log.n_dropped, percentile, confidence)
        return "fail" if "fail" in (served, planned) else planned
    # a dropped request counts as one over the SLO
    return verdict(n + log.n_dropped, n_over + log.n_dropped, percentile, confidence)


def latency_fields(log, offered_qps: float | None, span: float, lat: np.ndarray, queue: np.ndarray) -> dict:
    """`LevelSummary`'s counts, rates and latency and queue statistics (``lat``: each request's latency)."""
    p50, p90, p95, p99 = np.percentile(lat, [50, 90, 95, 99])
    return {
        "n": log.n,
        "n_planned": log.n_planned,
        "offered_qps": offered_qps,
        "achieved_qps": log.n / span if span > 0 else float("nan"),
        "duration_s": span,
        "latency_mean_s": float(lat.mean()),
        "latency_p50_s": float(p50),
        "latency_p90_s": float(p90),
        "latency_p95_s": float(p95),
        "latency_p99_s": float(p99),
        "latency_max_s": float(lat.max()),
        "queue_mean_s": float(queue.mean()),
        "queue_p99_s": float(np.percentile(queue, 99)),
    }
