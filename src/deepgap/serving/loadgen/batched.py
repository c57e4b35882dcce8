"""LoadGen's light SUT: issue calls queued whole, batches formed by the event loop's rules, completed per batch.

Why a module of its own: the image SUT here and the text model's (`deepgap.serving.loadgen.text_sut`, a
queue per length bucket) share its threads, and `deepgap.serving.loadgen.sut.drive` chooses between them.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from array import array
from collections import deque
from itertools import repeat
from typing import Any

import numpy as np

from deepgap.serving.loadgen.harness import STOP_POLL_S
from deepgap.serving.sim.batcher import BatchPolicy, decide
from deepgap.serving.sim.log import RequestLog


class BatchedSut:
    """The light SUT: issue calls queued whole, batches dispatched by `decide`, completed per batch."""

    def __init__(self, lg: Any, executor: Any, policy: BatchPolicy) -> None:
        self.lg, self.ex, self.policy = lg, executor, policy
        self.top = min(policy.max_batch, executor.buckets[-1])
        self.chunks: deque = deque()  # [time, ids, indices, taken] per issue call, oldest first
        self.arr_t = array("d")  # per issue call: its time and sample count (the log's arrivals); 16 bytes
        self.arr_n = array("q")
        self.issued = self.taken = 0  # samples; each written by one thread only
        self.submitted = self.completed = 0  # batches; each written by one thread only
        self.want = 1  # the dispatch thread wants waking once this many samples are queued
        self.wake = threading.Event()
        self.stop = False
        self.batches: list[tuple] = []  # (count, dispatch, done, h2d, compute, d2h, host, first)
        self.complete_calls = 0
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        self.errors: list[BaseException] = []
        self.failed = False  # a thread raised: every sample is completed unserved so that LoadGen returns
        self.held: list[int] = []  # the samples of a batch being submitted (completed unserved if it raises)

    def _respond(self, ids: list[int]) -> None:
        """One ``QuerySamplesComplete`` for ``ids``, its responses built in a C loop."""
        self.lg.QuerySamplesComplete(list(map(self.lg.QuerySampleResponse, ids, repeat(0), repeat(0))))

    def _drain(self) -> None:
        """After a failure: complete every queued sample at once (LoadGen waits for each one to return)."""
        while self.chunks:
            c = self.chunks.popleft()
            self._respond(c[1][c[3] :])

    def issue(self, ids: list[int], indices: list[int]) -> None:
        """LoadGen's issuing thread: one append, one counter, a wake-up only when it changes a decision."""
        t = time.perf_counter()
        if self.failed:
            self._respond(ids)
            return
        self.chunks.append([t, ids, indices, 0])
        self.arr_t.append(t)
        self.arr_n.append(len(ids))
        self.issued += len(ids)
        if self.issued - self.taken >= self.want:
            self.wake.set()

    def _take(self, k: int) -> tuple[list[int], int]:
        """The oldest ``k`` queued samples' response ids and the first one's sample index."""
        ids: list[int] = []
        first_index = self.chunks[0][2][self.chunks[0][3]]
        while len(ids) < k:
            c = self.chunks[0]
            m = min(k - len(ids), len(c[1]) - c[3])
            ids.extend(c[1][c[3] : c[3] + m])
            c[3] += m
            if c[3] == len(c[1]):
                self.chunks.popleft()
        self.taken += k
        return ids, first_index

    def _decide(self, now: float, queued: int) -> tuple[int, float]:
        """(samples to dispatch now, else 0; when to look again): the event loop's `decide`."""
        d = decide(self.policy, now, queued, self.chunks[0][0], more_coming=True)
        return d.count, d.wait_until_s

    def _dispatch(self, n: int) -> tuple[Any, list[int], Any]:
        """Submit the oldest ``n`` samples: (ticket, response ids, where the batch starts in issue order).

        The ring serves the batch from the first sample's slot on (one or two copies: the same bytes).
        """
        first = self.taken
        ids, index = self._take(n)
        self.held = ids  # completed unserved should submit raise
        ticket = self.ex.submit(int(index), n)
        self.held = []
        return ticket, ids, first

    def _set_want(self, n: int) -> None:
        """Be woken once ``n`` samples are queued (a full batch, or the first one)."""
        self.want = n

    def _wanted(self) -> bool:
        return self.issued - self.taken >= self.want

    def dispatch(self) -> None:
        """The dispatch thread: the event loop's rules on live arrivals, ``depth`` batches in flight."""
        ex, pol = self.ex, self.policy
        torch = getattr(ex, "torch", None)
        ctx = torch.inference_mode() if torch is not None else contextlib.nullcontext()
        try:
            with ctx:
                flight: deque = deque()  # tickets of the batches not known to be done, oldest first
                seen = 0  # batches this thread saw done (it waited for them itself)
                while True:
                    self.wake.clear()
                    queued = self.issued - self.taken
                    busy = self.submitted - max(self.completed, seen)
                    while len(flight) > busy:
                        flight.popleft()
                    if queued and busy >= ex.depth:
                        # Pipeline full: wait for the oldest batch here (the GIL released while the device
                        # works), not for the completion thread's report: no thread hand-off per batch.
                        ex.wait(flight[0])
                        seen = self.submitted - busy + 1
                        continue
                    timeout: float | None = STOP_POLL_S
                    if queued:
                        now = time.perf_counter()
                        count, wait_until = self._decide(now, queued)
                        if count:
                            ticket, ids, first = self._dispatch(min(count, self.top))
                            flight.append(ticket)
                            self.todo.put((ticket, ids, first, now))
                            self.submitted += 1
                            continue
                        self._set_want(pol.max_batch)
                        timeout = min(wait_until - now, STOP_POLL_S)
                    else:
                        if self.stop:
                            break
                        self._set_want(1)
                    if self._wanted():
                        continue  # arrived between the check and publishing ``want``
                    self.wake.wait(timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self.errors.append(exc)
            self.failed = True
            self._respond(self.held)
            while not self.stop:  # LoadGen keeps issuing until its run is over: answer at once
                self._drain()
                self.wake.wait(STOP_POLL_S)
        finally:
            self.todo.put(None)

    def complete(self) -> None:
        """The completion thread: wait for each batch (GIL released), report it in one call."""
        ex = self.ex
        item = None
        try:
            while (item := self.todo.get()) is not None:
                ticket, ids, first, dispatch = item
                h2d, comp, d2h, host = ex.wait(ticket)
                done = time.perf_counter()
                self._respond(ids)
                self.complete_calls += 1
                self.batches.append((len(ids), dispatch, done, h2d, comp, d2h, host, first))
                self.completed += 1
                item = None
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
            self.failed = True
            if item is not None:
                self._respond(item[1])
            while (item := self.todo.get()) is not None:  # the batches still in flight, unserved
                self._respond(item[1])

    def log(self, origin: float) -> RequestLog:
        """Per-request records (times from ``origin``), expanded from the per-batch ones."""
        arrival = np.repeat(
            np.frombuffer(self.arr_t, dtype=np.float64) - origin, np.frombuffer(self.arr_n, dtype=np.int64)
        )
        rows = [(b[0], b[1] - origin, b[2] - origin, *b[3:]) for b in self.batches]
        if not rows:
            e = np.zeros(0)
            return RequestLog(e, e, e, np.zeros(0, dtype=np.int64), e, e, e, n_planned=0)
        return RequestLog.from_batches(arrival, rows, len(arrival))
