"""The dynamic batcher (Triton's policy) and the one event loop shared by the server and the simulator.

Policy, as Triton's dynamic batcher with one model instance: when the executor is free and requests
wait, dispatch ``max_batch`` of them at once if that many wait; otherwise dispatch everything waiting
once the oldest request has waited ``max_delay_s`` (or when no further request will come); otherwise
wait for the next arrival or that deadline, whichever is first. Requests leave in arrival order, so
the queue is always a contiguous range of request indices and a decision costs O(1).

`serve_loop` is the whole server minus two injected parts: a `Clock` (real or virtual) and an
``execute(first, count)`` callable that runs one batch and returns its (h2d, compute, d2h) seconds.
With a `VirtualClock` and an executor that advances it by a service time, it is a discrete-event
simulation; with a `RealClock` and an engine, it is the real server. Nothing else differs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deepgap.serving.clock import Clock
from deepgap.serving.log import RequestLog

Executor = Callable[[int, int], tuple[float, float, float]]


@dataclass(frozen=True)
class BatchPolicy:
    """Dynamic-batching policy: at most ``max_batch`` requests per batch, wait at most ``max_delay_s``."""

    max_batch: int = 8
    max_delay_s: float = 0.002

    def __post_init__(self) -> None:
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {self.max_batch!r}")
        if not (self.max_delay_s >= 0 and math.isfinite(self.max_delay_s)):
            raise ValueError(f"max_delay_s must be ≥ 0, got {self.max_delay_s!r}")

    def label(self) -> str:
        """Short text, e.g. ``max_batch=16 max_delay=2ms``."""
        return f"max_batch={self.max_batch} max_delay={self.max_delay_s * 1e3:g}ms"


@dataclass(frozen=True)
class Decision:
    """Dispatch ``count`` requests now (count > 0), or wait until ``wait_until_s``."""

    count: int = 0
    wait_until_s: float = math.inf


def decide(policy: BatchPolicy, now_s: float, queued: int, oldest_arrival_s: float, more_coming: bool) -> Decision:
    """The batcher's decision while the executor is free (pure: no clock, no queue object)."""
    if queued <= 0:
        return Decision()
    if queued >= policy.max_batch:
        return Decision(count=policy.max_batch)
    deadline = oldest_arrival_s + policy.max_delay_s
    if now_s >= deadline or not more_coming:
        return Decision(count=queued)
    return Decision(wait_until_s=deadline)


@dataclass
class StopRule:
    """When a run may end early: a conclusive SLO failure, or a wall-time guard against overload."""

    slo_s: float | None = None
    max_violations: int | None = None  # stop once more than this many requests exceeded the SLO
    max_time_s: float | None = None  # stop once the clock passes this (queued requests are dropped)

    def check(self, n_violations: int, now_s: float) -> tuple[str, str]:
        """(kind, why) to stop now — kind "violations" or "time" — or ("", "")."""
        if self.max_violations is not None and n_violations > self.max_violations:
            return "violations", (f"stopped early: {n_violations} requests over the SLO, more than the "
                                  f"{self.max_violations} a pass allows")
        if self.max_time_s is not None and now_s > self.max_time_s:
            return "time", f"stopped at the {self.max_time_s:.1f} s time limit (the server fell behind)"
        return "", ""


def serve_loop(
    arrivals_s: Sequence[float],
    policy: BatchPolicy,
    clock: Clock,
    execute: Executor,
    stop: StopRule | None = None,
) -> RequestLog:
    """Serve requests arriving at ``arrivals_s`` (sorted, seconds on ``clock``) and log each one."""
    arr = [float(t) for t in arrivals_s]
    n = len(arr)
    batches: list[tuple[int, float, float, float, float, float]] = []  # count, dispatch, done, h2d, compute, d2h
    head = tail = 0
    violations = 0
    slo = stop.slo_s if stop is not None and stop.slo_s is not None else None
    stopped = ("", "")
    max_batch = policy.max_batch
    while head < n:
        now = clock.now()
        while tail < n and arr[tail] <= now:
            tail += 1
        if tail == head:  # nothing waits: sleep until the next arrival
            clock.sleep_until(arr[tail])
            continue
        queued = tail - head
        if queued >= max_batch:
            count = max_batch
        else:
            d = decide(policy, now, queued, arr[head], tail < n)
            count = d.count
            if count == 0:
                clock.sleep_until(min(d.wait_until_s, arr[tail]) if tail < n else d.wait_until_s)
                continue
        h2d, compute, d2h = execute(head, count)
        done = clock.now()
        batches.append((count, now, done, h2d, compute, d2h))
        if slo is not None:  # arrivals are sorted: the late ones are a prefix of the batch
            violations += bisect.bisect_left(arr, done - slo, head, head + count) - head
        head += count
        if stop is not None:
            stopped = stop.check(violations, done)
            if stopped[0] and head < n:
                break
            stopped = ("", "")
    log = RequestLog.from_batches(arr[:head], batches, n)
    log.stop_kind, log.stopped = stopped
    return log
