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
                f"stopped early: {n_violations} requests over the SLO, more than the "
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


def idle_step(pipe, inflight: list, clock: Clock, next_s: float, retire) -> bool:
    """Nothing to submit now: sleep to ``next_s``, retire the oldest batch, or wait for either; True: done.

    One step of every serving loop (`serve_loop`, `deepgap.serving.sim.queues.serve_queues`).
    """
    if not inflight:
        if next_s == math.inf:
            return True
        clock.sleep_until(next_s)
    elif next_s == math.inf:
        retire()
    else:
        wait_until(pipe, inflight[0][0], clock, next_s)
    return False


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
    batches: list[tuple[int, float, float, float, float, float, float, int]] = []
    inflight: deque = deque()  # (ticket, first, count, dispatch)
    head = 0
    violations = dropped = 0
    slo = stop.slo_s if stop is not None and stop.slo_s is not None else None
    drop_after = stop.drop_after_s if stop is not None else None
    stopped = ("", "")
    max_batch = policy.max_batch

    def retire() -> None:
        nonlocal violations, stopped
        ticket, first, count, dispatch = inflight.popleft()
        h2d, compute, d2h, host = pipe.wait(ticket)
        done = clock.now()
        batches.append((count, dispatch, done, h2d, compute, d2h, host, first))
        if slo is not None:  # arrivals are sorted: the late ones are a prefix of the batch
            violations += bisect_left(at, done - slo, first, first + count) - first
        if stop is not None and not stopped[0]:
            stopped = stop.check(violations + dropped, done)

    while head < n or inflight:
        while inflight and pipe.done(inflight[0][0]):
            retire()
        if stopped[0]:
            break
        now = clock.now()
        tail = bisect_right(at, now, head)  # = max(head, searchsorted(arr, now, "right")): arr is sorted
        if drop_after is not None and head < tail:
            cut = min(tail, bisect_left(at, now - drop_after))
            if cut > head:
                dropped += cut - head
                head = cut
        next_s = math.inf
        if head < n and len(inflight) < depth:
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
                    inflight.append((pipe.submit(head, d.count), head, d.count, now))
                    head += d.count
                    continue
                next_s = min(d.wait_until_s, at[tail]) if tail < n else d.wait_until_s
        if idle_step(pipe, inflight, clock, next_s, retire):
            break
    while inflight:  # a stop leaves batches on the device: finish them, they were served
        retire()
    log = RequestLog.from_batches(arr, batches, n)
    log.n_dropped = dropped
    log.stop_kind, log.stopped = stopped if head < n else ("", "")
    return log
