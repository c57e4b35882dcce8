"""The dynamic batcher (Triton's policy) and the one event loop shared by the server and the simulator.

Policy, as Triton's dynamic batcher with one model instance: when the executor is free and requests
wait, dispatch ``max_batch`` of them at once if that many wait; otherwise dispatch everything waiting
once the oldest request has waited ``max_delay_s`` (or when no further request will come); otherwise
wait for the next arrival or that deadline, whichever is first. Requests leave in arrival order, so
the queue is always a contiguous range of request indices and a decision costs O(1).

`serve_loop` is the whole server minus two injected parts: a `Clock` (real or virtual) and an
executor. A pipelined executor (``submit``/``done``/``wait_until``/``wait`` and a ``depth``) keeps up
to ``depth`` batches in flight, so the policy's "executor free" means "fewer than ``depth`` in
flight"; a plain ``execute(first, count)`` callable returning (h2d, compute, d2h) seconds is depth 1.
With a `VirtualClock` and an executor that advances it by a service time, it is a discrete-event
simulation; with a `RealClock` and an engine, it is the real server. Nothing else differs. The loop
does O(log n) work per batch (binary searches over the sorted arrival array), never per request.

Overload: with ``StopRule.drop_after_s`` the queue is bounded in time: a request that has waited
longer than that when a batch is formed is dropped (counted in the log, and as over the SLO) rather
than served late, so an overloaded server keeps serving fresh requests at its own pace.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from deepgap.serving.sim.clock import Clock
from deepgap.serving.sim.log import RequestLog

Executor = Callable[[int, int], tuple[float, ...]]


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


def decide(
    policy: BatchPolicy, now_s: float, queued: int, oldest_arrival_s: float, more_coming: bool
) -> Decision:
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
    drop_after_s: float | None = None  # bounded queue: requests waiting longer than this are dropped

    def check(self, n_violations: int, now_s: float) -> tuple[str, str]:
        """(kind, why) to stop now — kind "violations" or "time" — or ("", "")."""
        if self.max_violations is not None and n_violations > self.max_violations:
            return "violations", (
                f"stopped early: {n_violations} requests over the SLO or dropped, more than the "
                f"{self.max_violations} a pass allows"
            )
        if self.max_time_s is not None and now_s > self.max_time_s:
            return "time", f"stopped at the {self.max_time_s:.1f} s time limit (the server fell behind)"
        return "", ""


class _Sync:
    """A plain ``execute(first, count)`` callable as a pipeline of depth 1 (it returns when done)."""

    depth = 1

    def __init__(self, execute: Executor) -> None:
        self.execute = execute

    def submit(self, first: int, count: int) -> tuple[float, ...]:
        return tuple(self.execute(first, count))

    @staticmethod
    def done(ticket: tuple[float, ...]) -> bool:
        return True

    @staticmethod
    def wait(ticket: tuple[float, ...]) -> tuple[float, ...]:
        return (*ticket[:3], ticket[3] if len(ticket) > 3 else 0.0)


def wait_until(pipe, ticket, clock: Clock, t_s: float) -> None:
    """Return when ``ticket`` is done or the clock reaches ``t_s``, whichever is first."""
    own = getattr(pipe, "wait_until", None)
    if own is not None:
        own(ticket, clock, t_s)
        return
    while not pipe.done(ticket) and clock.now() < t_s:
        time.sleep(0)  # yield the GIL to the threads that feed the device


class Flight:
    """The batches on the device and those done, the requests over the SLO and the stop rule's verdict.

    What every serving loop (`serve_loop`, `deepgap.serving.sim.queues.serve_queues`) keeps the same way;
    the loops differ only in how they pick the next batch. A batch is a contiguous, arrival-sorted range
    of request indices, so its late requests are a prefix found by one binary search.
    """

    def __init__(self, pipe, clock: Clock, at: list[float], stop: StopRule | None) -> None:
        self.pipe, self.clock, self.at, self.stop = pipe, clock, at, stop
        self.slo = stop.slo_s if stop is not None else None
        self.batches: list[tuple[int, float, float, float, float, float, float, int]] = []
        self.inflight: deque = deque()  # (ticket, first, count, dispatch)
        self.violations = self.dropped = 0
        self.stopped = ("", "")

    def submit(self, first: int, count: int, now: float) -> None:
        """Send requests ``first`` … ``first + count - 1`` to the executor, dispatched at ``now``."""
        self.inflight.append((self.pipe.submit(first, count), first, count, now))

    def retire(self) -> None:
        """Wait for the oldest batch in flight and log it."""
        ticket, first, count, dispatch = self.inflight.popleft()
        h2d, compute, d2h, host = self.pipe.wait(ticket)
        done = self.clock.now()
        self.batches.append((count, dispatch, done, h2d, compute, d2h, host, first))
        if self.slo is not None:
            self.violations += bisect_left(self.at, done - self.slo, first, first + count) - first
        if self.stop is not None and not self.stopped[0]:
            self.stopped = self.stop.check(self.violations + self.dropped, done)

    def retire_done(self) -> bool:
        """Retire the batches already done, oldest first; True: the stop rule says stop."""
        while self.inflight and self.pipe.done(self.inflight[0][0]):
            self.retire()
        return bool(self.stopped[0])

    def idle(self, next_s: float) -> bool:
        """Nothing to submit now: sleep to ``next_s``, retire the oldest batch, or wait for either; True: done."""
        if not self.inflight:
            if next_s == math.inf:
                return True
            self.clock.sleep_until(next_s)
        elif next_s == math.inf:
            self.retire()
        else:
            wait_until(self.pipe, self.inflight[0][0], self.clock, next_s)
        return False

    def log(self, arr: np.ndarray, left: bool) -> RequestLog:
        """Finish what a stop left on the device (it was served) and log every request; ``left``: some never went."""
        while self.inflight:
            self.retire()
        log = RequestLog.from_batches(arr, self.batches, len(arr))
        log.n_dropped = self.dropped
        log.stop_kind, log.stopped = self.stopped if left else ("", "")
        return log


def serve_loop(
    arrivals_s: Sequence[float],
    policy: BatchPolicy,
    clock: Clock,
    execute,
    stop: StopRule | None = None,
) -> RequestLog:
    """Serve requests arriving at ``arrivals_s`` (sorted, seconds on ``clock``) and log each one."""
    arr = np.asarray(arrivals_s, dtype=np.float64)
    n = len(arr)
    at = arr.tolist()  # bisect on a list, not a numpy call per scalar: the simulator's hot loop
    pipe = execute if hasattr(execute, "submit") else _Sync(execute)
    depth = pipe.depth
    flight = Flight(pipe, clock, at, stop)
    head = 0
    drop_after = stop.drop_after_s if stop is not None else None
    max_batch = policy.max_batch
    while head < n or flight.inflight:
        if flight.retire_done():
            break
        now = clock.now()
        tail = bisect_right(at, now, head)  # = max(head, searchsorted(arr, now, "right")): arr is sorted
        if drop_after is not None and head < tail:
            cut = min(tail, bisect_left(at, now - drop_after))
            if cut > head:
                flight.dropped += cut - head
                head = cut
        next_s = math.inf
        if head < n and len(flight.inflight) < depth:
            queued = tail - head
            if queued == 0:
                next_s = at[tail]
            else:
                d = (
                    Decision(count=max_batch)
                    if queued >= max_batch
                    else decide(policy, now, queued, at[head], tail < n)
                )
                if d.count:
                    flight.submit(head, d.count, now)
                    head += d.count
                    continue
                next_s = min(d.wait_until_s, at[tail]) if tail < n else d.wait_until_s
        if flight.idle(next_s):
            break
    return flight.log(arr, head < n)
