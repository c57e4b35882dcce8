"""The dynamic batcher over several queues: a text server's sequence-length buckets, one executor.

Why a loop of its own beside `deepgap.serving.sim.batcher.serve_loop` (which it runs for one queue):
with buckets a batch is formed per queue, so requests no longer leave in arrival order. They are
numbered in *queue order* (`deepgap.serving.sim.seqlen.queue_order`): each queue is a contiguous,
arrival-sorted range, and a batch is still a contiguous range of request indices — what the
executors, the request ring and `RequestLog.from_batches` count on. The policy is Triton's per queue
(`batcher.decide`); when several queues may dispatch while the executor is free, the one whose oldest
request arrived first goes (no queue starves). Real and virtual clocks alike, as `serve_loop`.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from deepgap.serving.sim.batcher import BatchPolicy, Flight, StopRule, decide, serve_loop
from deepgap.serving.sim.clock import Clock
from deepgap.serving.sim.log import RequestLog


def serve_queues(
    arrivals_s: Sequence[float],
    starts: Sequence[int],
    policy: BatchPolicy,
    clock: Clock,
    pipe,
    stop: StopRule | None = None,
) -> RequestLog:
    """Serve requests in queue order (``starts``: where each queue begins) through ``pipe``.

    ``pipe`` is a pipelined executor (``submit``/``done``/``wait`` and a ``depth``); one queue is `serve_loop`.
    """
    if len(starts) <= 1:
        return serve_loop(arrivals_s, policy, clock, pipe, stop)
    arr = np.asarray(arrivals_s, dtype=np.float64)
    n = len(arr)
    at = arr.tolist()
    ends = [*starts[1:], n]
    heads = list(starts)
    flight = Flight(pipe, clock, at, stop)
    drop_after = stop.drop_after_s if stop is not None else None

    while any(h < e for h, e in zip(heads, ends, strict=True)) or flight.inflight:
        if flight.retire_done():
            break
        now = clock.now()
        next_s = math.inf
        if len(flight.inflight) < pipe.depth:
            q, count, next_s, shed = _choose(at, heads, ends, now, policy, drop_after)
            flight.dropped += shed
            if count:
                flight.submit(heads[q], count, now)
                heads[q] += count
                continue
        if flight.idle(next_s):
            break
    return flight.log(arr, any(h < e for h, e in zip(heads, ends, strict=True)))


def _choose(
    at: list[float],
    heads: list[int],
    ends: list[int],
    now: float,
    policy: BatchPolicy,
    drop_after: float | None,
) -> tuple[int, int, float, int]:
    """(queue, count, next event, dropped): the batch to dispatch now (count 0: none) and when to look again.

    Each queue's requests waiting past ``drop_after`` are shed first (``heads`` moves past them); of the
    queues the policy lets dispatch, the one whose oldest request arrived first goes.
    """
    best: tuple[float, int, int] | None = None  # (oldest arrival, queue, count)
    next_s, dropped = math.inf, 0
    for q, e in enumerate(ends):
        h = heads[q]
        if h >= e:
            continue
        tail = bisect_right(at, now, h, e)
        if drop_after is not None and h < tail:
            cut = min(tail, bisect_left(at, now - drop_after, h, e))
            dropped += cut - h
            heads[q] = h = cut
        if h >= e:
            continue
        if tail == h:
            next_s = min(next_s, at[h])
            continue
        d = decide(policy, now, tail - h, at[h], tail < e)
        if d.count:
            if best is None or at[h] < best[0]:
                best = (at[h], q, d.count)
        else:
            next_s = min(next_s, d.wait_until_s, at[tail] if tail < e else math.inf)
    return (best[1], best[2], next_s, dropped) if best is not None else (0, 0, next_s, dropped)
