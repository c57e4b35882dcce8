"""LoadGen's SUT for a text model: samples of their own lengths, batched as deepgap's text server batches.

Why a SUT of its own: an image sample is any slot of the ring, so the light SUT (`sut.BatchedSut`) keeps one
FIFO and serves a batch from its first sample's slot on. A text sample has a length (LoadGen's QSL maps
sample ``s`` to ``lengths[s]``, drawn seeded from ``--seq-len-dist``), and the server pads a batch to its
longest sample or its bucket (`deepgap.serving.sim.seqlen.Padding`). So the batch is exactly LoadGen's
samples (`TokenExecutor.submit_samples`: their rows and lengths gathered), and with ``--padding buckets``
a sample joins the queue of its bucket: one queue per bucket, the event loop's policy per queue, and when
the executor is free the queue whose oldest sample arrived first goes (`deepgap.serving.sim.queues`).
Samples then leave out of issue order, so each keeps its issue-order number, and the request log is put
back into LoadGen's issue order for the per-sample comparison with its trace.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from deepgap.serving.loadgen.batched import BatchedSut
from deepgap.serving.sim.batcher import BatchPolicy, decide
from deepgap.serving.sim.log import RequestLog


class TextSut(BatchedSut):
    """`BatchedSut` with a queue per length bucket (one without buckets) and batches of LoadGen's samples.

    A queue item is one issue call's samples of that queue: [time, response ids, sample indices, taken,
    issue-order numbers].
    """

    def __init__(self, lg: Any, executor: Any, policy: BatchPolicy, lengths: np.ndarray) -> None:
        super().__init__(lg, executor, policy)
        self.queue_of = executor.pad.bucket_index(np.asarray(lengths))
        self.queue_list = self.queue_of.tolist()
        n = len(executor.pad.edges) or 1
        self.queues: list[deque] = [deque() for _ in range(n)]
        self.q_issued, self.q_taken = [0] * n, [0] * n  # each written by one thread only
        self.q_want = [1] * n
        self.chosen = 0  # the queue `_decide` picked

    def issue(self, ids: list[int], indices: list[int]) -> None:
        """LoadGen's issuing thread: each sample to its bucket's queue; a wake-up only where it matters."""
        t = time.perf_counter()
        if self.failed:
            self._respond(ids)
            return
        seq0 = self.issued
        self.arr_t.append(t)
        self.arr_n.append(len(ids))
        if len(self.queues) == 1 or len(ids) == 1:
            q0 = self.queue_list[indices[0]] if len(self.queues) > 1 else 0
            parts = [(q0, ids, indices, range(seq0, seq0 + len(ids)))]
        else:  # split the call by bucket (Offline's one call, or queries coalesced in Server)
            qs = self.queue_of[np.asarray(indices)]
            ids_a, idx_a = np.asarray(ids), np.asarray(indices)
            parts = []
            for q in np.unique(qs).tolist():
                sel = np.flatnonzero(qs == q)
                parts.append((q, ids_a[sel].tolist(), idx_a[sel].tolist(), (sel + seq0).tolist()))
        wake = False
        for q, qids, qidx, seqs in parts:
            self.queues[q].append([t, qids, qidx, 0, seqs])
            self.q_issued[q] += len(qids)
            wake = wake or self.q_issued[q] - self.q_taken[q] >= self.q_want[q]
        self.issued += len(ids)
        if wake:
            self.wake.set()

    def _decide(self, now: float, queued: int) -> tuple[int, float]:
        """Of the queues the policy lets dispatch now, the one whose oldest sample arrived first."""
        best: tuple[float, int, int] | None = None
        wait = float("inf")
        for q, qu in enumerate(self.queues):
            n = self.q_issued[q] - self.q_taken[q]
            if not n:
                continue
            d = decide(self.policy, now, n, qu[0][0], more_coming=True)
            if d.count and (best is None or qu[0][0] < best[0]):
                best = (qu[0][0], q, d.count)
            elif not d.count:
                wait = min(wait, d.wait_until_s)
        if best is None:
            return 0, wait
        self.chosen = best[1]
        return best[2], wait

    def _dispatch(self, n: int) -> tuple[Any, list[int], Any]:
        """Submit the chosen queue's oldest ``n`` samples; the batch's issue-order numbers stand for ``first``."""
        qu, q = self.queues[self.chosen], self.chosen
        ids: list[int] = []
        indices: list[int] = []
        seqs: list[int] = []
        while len(ids) < n:
            c = qu[0]
            m = min(n - len(ids), len(c[1]) - c[3])
            ids.extend(c[1][c[3] : c[3] + m])
            indices.extend(c[2][c[3] : c[3] + m])
            seqs.extend(c[4][c[3] : c[3] + m])
            c[3] += m
            if c[3] == len(c[1]):
                qu.popleft()
        self.q_taken[q] += n
        self.taken += n
        self.held = ids
        ticket = self.ex.submit_samples(indices)
        self.held = []
        return ticket, ids, np.asarray(seqs, dtype=np.int64)

    def _set_want(self, n: int) -> None:
        """Each queue: woken at its first sample when empty, else at a full batch."""
        for q in range(len(self.queues)):
            self.q_want[q] = 1 if self.q_issued[q] == self.q_taken[q] else n
        self.want = n

    def _wanted(self) -> bool:
        return any(self.q_issued[q] - self.q_taken[q] >= self.q_want[q] for q in range(len(self.queues)))

    def _drain(self) -> None:
        for qu in self.queues:
            while qu:
                c = qu.popleft()
                self._respond(c[1][c[3] :])

    def log(self, origin: float) -> RequestLog:
        """Per-request records in LoadGen's issue order (a batch's samples carry their issue-order numbers)."""
        arrival = np.repeat(
            np.frombuffer(self.arr_t, dtype=np.float64) - origin, np.frombuffer(self.arr_n, dtype=np.int64)
        )
        if not self.batches:
            e = np.zeros(0)
            return RequestLog(e, e, e, np.zeros(0, dtype=np.int64), e, e, e, n_planned=0)
        seqs = np.concatenate([b[7] for b in self.batches])
        counts = np.asarray([b[0] for b in self.batches], dtype=np.int64)
        col = np.asarray([b[1:7] for b in self.batches], dtype=np.float64)
        order = np.argsort(seqs, kind="stable")
        per = np.repeat(col, counts, axis=0)[order]
        return RequestLog(
            arrival[seqs[order]],
            per[:, 0] - origin,
            per[:, 1] - origin,
            np.repeat(counts, counts)[order],
            per[:, 2],
            per[:, 3],
            per[:, 4],
            n_planned=len(arrival),
            host_s=per[:, 5],
        )
