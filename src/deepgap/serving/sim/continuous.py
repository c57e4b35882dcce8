"""Continuous (in-flight) batching: the one event loop of a served decoder, real or simulated.

Why its own loop and not `deepgap.serving.sim.batcher.serve_loop`: a decoder's request is not one batch
call but a prefill and then one decode step per output token, and the batch changes at every step. The
server keeps ``slots`` sequences in a static KV cache (`deepgap.measure.models.llama_net`'s
``prefill_slots`` and ``decode_slots``). At each iteration it

1. admits the requests that have arrived, in arrival order, into free slots (at most ``max_prefill`` at
   once), and prefills them together (their first token comes out of the prefill: its end is their
   time to first token);
2. runs one decode step over all slots (rows without a sequence run too: static shapes), which gives
   every running sequence its next token;
3. retires the sequences that have their output length, freeing their slots for the next admission.

Output lengths are the requests' own (drawn from a stated distribution, no end-of-sequence token), so
the loop knows when each ends without reading a token. As with images, only the clock and the executor
differ between the real server (a `RealClock`, the model) and the simulator (a `VirtualClock`, curves);
the executor's ``prefill(first, count, slots)`` and ``decode(active)`` return when their work is done.

Overload is bounded as for images: a request that waited longer than ``drop_after_s`` for a slot is
dropped (counted over both bounds) instead of admitted late; a run stops early once either bound has
more requests over it than a pass allows, or once it falls far behind (``max_time_s``). A request is
over the TTFT bound as soon as that is certain: at its admission (its prefill ends past the bound), or
while it still waits in the queue longer than the bound.

What a stopped run leaves behind is logged, not lost. A request's row (`TokenLog`'s arrays) needs its
last token, so the arrays hold the finished requests; beside them the log keeps the TTFTs of the
requests admitted but still decoding (``unfinished_ttft_s``) and the count of those still waiting past
the TTFT bound (``n_queued_late``), so a verdict counts every violation the loop counted (an overloaded
level once passed on the 83 requests that had finished before it stopped: the late ones had vanished);
and the tokens actually produced (``output_tokens``, partial outputs included) over the level's window
(first arrival → last token, ``start_s`` → ``end_s``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np

from deepgap.serving.sim.clock import Clock
from deepgap.serving.sim.log import Served


@dataclass(frozen=True)
class SlotStop:
    """When a decoder's run may end early, and its bounded queue (all None: run to the end)."""

    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    max_violations: int | None = None  # stop once either bound has more requests over it than this
    max_time_s: float | None = None
    drop_after_s: float | None = None


@dataclass
class TokenLog(Served):
    """Per served request (arrival order): arrival, admission, first and last token; the level's facts."""

    arrival_s: np.ndarray
    admit_s: np.ndarray  # its prefill started (it left the queue)
    first_s: np.ndarray  # its first token (the prefill's end)
    done_s: np.ndarray  # its last token
    input_len: np.ndarray
    output_len: np.ndarray
    prefill_batch: np.ndarray  # requests prefilled together with it
    slots: int
    n_planned: int
    n_dropped: int = 0
    steps: int = 0  # decode steps run
    mean_active: float = 0.0  # sequences per decode step, on average (of ``slots``)
    stopped: str = ""
    stop_kind: str = ""  # "violations" | "time" | ""
    # what a stopped run left unfinished (module docstring); all empty or 0 for a run served to its end
    unfinished_ttft_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # admitted, still decoding
    n_queued: int = 0  # arrived, still waiting for a slot when the run ended
    queued_wait_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # their waits: TTFTs at least
    n_queued_late: int = 0  # of those, waiting longer than the TTFT bound already (over it, whatever follows)
    output_tokens: int = 0  # every output token produced, partial outputs of unfinished requests included
    input_tokens: int = 0  # every prompt token prefilled
    start_s: float = 0.0  # the level's first arrival
    end_s: float = 0.0  # its last token

    @property
    def ttft_s(self) -> np.ndarray:
        """Arrival → first token (queue wait and prefill)."""
        return self.first_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Mean seconds between a request's later tokens: (last − first) / (output − 1)."""
        return (self.done_s - self.first_s) / np.maximum(self.output_len - 1, 1)

    def columns(self) -> dict[str, np.ndarray]:
        """``serve_requests`` columns: dispatch = admission, compute = its prefill, done = last token.

        So a request's TTFT is ``queue_s + compute_s`` (arrival → admission → first token); no copies
        are timed apart (h2d, d2h 0).
        """
        zero = np.zeros(self.n)
        return {
            "arrival_s": self.arrival_s,
            "dispatch_s": self.admit_s,
            "done_s": self.done_s,
            "batch": self.prefill_batch,
            "queue_s": self.admit_s - self.arrival_s,
            "h2d_s": zero,
            "compute_s": self.first_s - self.admit_s,
            "d2h_s": zero,
            "latency_s": self.latency_s,
        }


class _Run:
    """The loop's state: per request its times, per slot its request and tokens left."""

    def __init__(self, arrivals, in_lens, out_lens, slots: int, stop: SlotStop | None) -> None:
        n = len(arrivals)
        self.at = np.asarray(arrivals, dtype=np.float64).tolist()
        self.ins = np.asarray(in_lens, dtype=np.int64)
        self.out = np.asarray(out_lens, dtype=np.int64)
        self.admit, self.first, self.done = (np.full(n, np.nan) for _ in range(3))
        self.batch = np.zeros(n, dtype=np.int64)
        self.slot_req = np.full(slots, -1, dtype=np.int64)
        self.left = np.zeros(slots, dtype=np.int64)
        self.free = list(range(slots - 1, -1, -1))
        self.stop = stop or SlotStop()
        self.over = [0, 0]  # requests over the TTFT bound, over the TPOT bound
        self.dropped = self.steps = self.active_sum = 0
        self.tokens_out = self.tokens_in = 0
        self.last_s = self.at[0] if n else 0.0  # the time of the last token produced
        self.stopped = ("", "")

    def retire(self, slot: int, t: float) -> None:
        r = int(self.slot_req[slot])
        self.done[r] = t
        self.slot_req[slot] = -1
        self.free.append(slot)
        s = self.stop
        if s.slo_tpot_s is not None and self.out[r] > 1:
            self.over[1] += (t - self.first[r]) / (self.out[r] - 1) > s.slo_tpot_s

    def queued_late(self, now: float, head: int) -> int:
        """Requests still waiting at ``now`` that arrived more than the TTFT bound ago: over it already."""
        if self.stop.slo_ttft_s is None or head >= len(self.at):
            return 0
        return max(0, bisect_left(self.at, now - self.stop.slo_ttft_s, head) - head)

    def check(self, now: float, head: int) -> None:
        s = self.stop
        if s.max_violations is None and s.max_time_s is None:
            return
        over = max(self.over[0] + self.queued_late(now, head), self.over[1])
        if s.max_violations is not None and over + self.dropped > s.max_violations:
            self.stopped = ("violations", "stopped early: more requests over a bound than a pass allows")
        elif s.max_time_s is not None and now > s.max_time_s:
            self.stopped = (
                "time",
                f"stopped at the {s.max_time_s:.1f} s time limit (the server fell behind)",
            )


def serve_continuous(
    arrivals_s,
    input_lens,
    output_lens,
    slots: int,
    clock: Clock,
    executor,
    stop: SlotStop | None = None,
    max_prefill: int | None = None,
) -> TokenLog:
    """Serve requests arriving at ``arrivals_s`` (sorted) with continuous batching; log each one."""
    n = len(arrivals_s)
    st = _Run(arrivals_s, input_lens, output_lens, slots, stop)
    at, head, cap = st.at, 0, max_prefill or slots
    while (head < n or len(st.free) < slots) and not st.stopped[0]:
        now = clock.now()
        tail = bisect_right(at, now, head)
        if st.stop.drop_after_s is not None and head < tail:
            cut = min(tail, bisect_left(at, now - st.stop.drop_after_s))
            st.dropped += max(0, cut - head)
            head = max(head, cut)
        k = min(tail - head, len(st.free), cap)
        if k:
            _admit(st, executor, clock, head, k, now)
            head += k
        if len(st.free) < slots:
            _decode(st, executor, clock, at[head] if head < n and st.free else math.inf)
        elif head < n and k == 0:
            clock.sleep_until(at[head])
        st.check(clock.now(), head)
    return _log(st, slots, head, clock.now())


def _log(st: _Run, slots: int, head: int, now: float) -> TokenLog:
    """The finished requests' rows, and what a stop left: the running requests' TTFTs, the queue."""
    served = ~np.isnan(st.done)
    arr = np.asarray(st.at, dtype=np.float64)
    running = st.slot_req[st.slot_req >= 0]
    waiting = np.arange(head, bisect_right(st.at, now, head) if head < len(arr) else head)
    return TokenLog(
        arr[served],
        st.admit[served],
        st.first[served],
        st.done[served],
        st.ins[served],
        st.out[served],
        st.batch[served],
        slots,
        n_planned=len(arr),
        n_dropped=st.dropped,
        steps=st.steps,
        mean_active=st.active_sum / st.steps if st.steps else 0.0,
        stopped=st.stopped[1],
        stop_kind=st.stopped[0],
        unfinished_ttft_s=st.first[running] - arr[running],
        n_queued=len(waiting),
        queued_wait_s=now - arr[waiting],
        n_queued_late=st.queued_late(now, head),
        output_tokens=st.tokens_out,
        input_tokens=st.tokens_in,
        start_s=float(arr[0]) if len(arr) else 0.0,
        end_s=float(st.last_s),
    )


def _admit(st: _Run, executor, clock: Clock, head: int, k: int, now: float) -> None:
    """Prefill requests ``head … head+k-1`` into free slots; their first token is the prefill's end."""
    slots = [st.free.pop() for _ in range(k)]
    executor.prefill(head, k, slots)
    t = clock.now()
    st.admit[head : head + k], st.first[head : head + k], st.batch[head : head + k] = now, t, k
    st.tokens_out += k  # each newcomer's first token
    st.tokens_in += int(st.ins[head : head + k].sum())
    st.last_s = t
    if st.stop.slo_ttft_s is not None:
        st.over[0] += sum(t - st.at[r] > st.stop.slo_ttft_s for r in range(head, head + k))
    for r, s in zip(range(head, head + k), slots, strict=True):
        st.slot_req[s], st.left[s] = r, st.out[r] - 1
        if st.left[s] <= 0:
            st.retire(s, t)


def _decode(st: _Run, executor, clock: Clock, next_arrival_s: float) -> None:
    """One decode step over every slot: a token for each running sequence; retire those complete.

    An executor with ``decode_steps(k, until_s, active)`` (the simulator's) runs up to ``k`` steps at once (none
    retires a sequence before the ``k``-th), stopping after the first that ends at or past ``until_s``
    (a newcomer that would be admitted there): the same steps and times as one at a time, without a
    Python iteration per step.
    """
    active = st.slot_req >= 0
    many = getattr(executor, "decode_steps", None)
    if many is not None:
        k = many(int(st.left[active].min()), next_arrival_s, active)
    else:
        executor.decode(active)
        k = 1
    t = clock.now()
    st.steps += k
    st.active_sum += k * int(active.sum())
    st.tokens_out += k * int(active.sum())
    st.last_s = t
    st.left[active] -= k
    for s in np.nonzero(active & (st.left <= 0))[0].tolist():
        st.retire(s, t)


def drop_after(slo_ttft_s: float | None, factor: float) -> float | None:
    """The bounded queue's wait: ``factor`` × the TTFT bound (None without one)."""
    return factor * slo_ttft_s if slo_ttft_s is not None and math.isfinite(slo_ttft_s) else None
