"""Optional: drive the same server with MLCommons LoadGen and keep its summary beside ours.

LoadGen (``pip install mlcommons-loadgen``, module ``mlperf_loadgen``) issues queries from its own
thread on its own schedule and times each from its *scheduled* arrival, so any moment its issuing
thread waits for Python's GIL counts as latency. The SUT here is therefore light (as MLPerf's C++
harnesses, not its per-sample Python ones):

* LoadGen's "fast" SUT hands each issue call over as two lists of integers (response ids, sample
  indices); the callback appends them to a FIFO as one item, with one time stamp. Nothing per sample.
* A dispatch thread batches them with the *same* `decide` function the event loop uses and submits
  batches to the same executor, ``depth`` in flight. It sleeps off the GIL until an issue call can change
  its decision (the first arrival in an empty queue, a full batch) or its deadline (the oldest request's
  max delay): it is never woken per query, so LoadGen's issuing thread rarely waits for the GIL. With
  the pipeline full it waits for the oldest batch itself (the GIL released), so no thread hand-off sits
  between a batch finishing and the next one starting.
* A completion thread waits for each batch on the device (the GIL released) and reports it in *one*
  ``QuerySamplesComplete`` call; its responses are built by ``map`` (a C loop), not a Python loop.

Our own record of the run is per batch and per issue call; the per-request `RequestLog` is expanded
with numpy at the end. A *null SUT* (`null_request`) completes each issue call inside the callback and
serves nothing: LoadGen's and the Python binding's own latency floor at the same rate. With
``trace`` on, LoadGen's per-sample latencies are read back from its trace and matched with ours
(`deepgap.serving.loadgen_trace`). LoadGen's sample indices pick ring slots, so a batch is served from
the ring like any other (one or two copies from the first sample's slot: the bytes moved are the
same). Without the package ``--loadgen`` is refused before anything runs (exit 2); LoadGen's own log
files go to a temporary directory, never the working directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import tempfile
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from deepgap.serving.batcher import BatchPolicy, decide
from deepgap.serving.loadgen_trace import TRACE_CAP, Agreement, agreement, read_trace
from deepgap.serving.log import LevelSummary, RequestLog, summarize

SCENARIO_NAMES = {"single-stream": "SingleStream", "server": "Server", "offline": "Offline"}
SWITCH_INTERVAL_S = 2e-4  # LoadGen's issuing thread waits for the GIL at most about this long, not 5 ms
STOP_POLL_S = 0.05  # an idle dispatch thread checks for the end of the run this often
# Requests whose records go back to the parent and into the store; a longer run (MLPerf's 600 s at tens of
# thousands of samples/s) keeps deepgap's summary of it and LoadGen's, not a row per request.
LOG_CAP = 2_000_000


def available() -> str | None:
    """None when LoadGen imports, else why not."""
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return "unavailable: mlcommons-loadgen is not installed (pip install mlcommons-loadgen)"
    return None


@dataclass(frozen=True)
class LoadgenRequest:
    """One LoadGen performance run (``null``: the null SUT, nothing served)."""

    scenario: str
    policy: BatchPolicy
    qps: float | None = None
    slo_s: float | None = None
    min_queries: int = 100
    min_duration_s: float = 1.0
    expected_latency_s: float = 0.001
    seed: int = 0
    confidence: float = 0.99  # of the p99 verdict of deepgap's own summary of the run
    null: bool = False
    trace: bool = True  # LoadGen's per-sample trace, for runs of at most TRACE_CAP samples


def null_request(req: LoadgenRequest) -> LoadgenRequest:
    """The same LoadGen settings against the null SUT."""
    return dataclasses.replace(req, null=True)


@dataclass
class LoadgenResult:
    """What one LoadGen run gave: its summary, our request log, and the per-sample comparison."""

    summary: str
    parsed: dict[str, str]
    log: RequestLog | None  # None when the run served more than LOG_CAP requests (its summary is kept)
    level: LevelSummary | None = None  # deepgap's summary of the run (its own request records)
    early_stopping: str = ""  # LoadGen's early-stopping lines
    agreement: Agreement | None = None
    trace_note: str = ""  # why there is no per-sample comparison
    complete_calls: int = 0  # QuerySamplesComplete calls made
    issue_calls: int = 0  # issue callbacks LoadGen made


def parse_summary(text: str) -> dict[str, str]:
    """``key : value`` lines of LoadGen's summary."""
    out = {}
    for line in text.splitlines():
        if ":" in line and not line.lstrip().startswith("*"):
            k, v = line.split(":", 1)
            if k.strip() and v.strip():
                out[k.strip()] = v.strip()
    return out


def early_stopping(text: str) -> str:
    """LoadGen's "Early Stopping Result" block, its lines joined (empty when the summary has none)."""
    lines = text.splitlines()
    try:
        i = next(k for k, x in enumerate(lines) if x.strip().startswith("Early Stopping Result"))
    except StopIteration:
        return ""
    out = []
    for x in lines[i + 1 :]:
        if not x.strip() or x.startswith("==="):
            break
        out.append(x.strip().lstrip("* ").strip())
    return " ".join(out)


def loadgen_settings(lg: Any, req: LoadgenRequest) -> Any:
    """LoadGen's TestSettings for ``req``: min duration and query count as asked, PerformanceOnly."""
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, SCENARIO_NAMES[req.scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_query_count = int(req.min_queries)
    settings.min_duration_ms = int(round(req.min_duration_s * 1000))
    settings.schedule_rng_seed = settings.sample_index_rng_seed = settings.qsl_rng_seed = int(req.seed) + 1
    if req.scenario == "server":
        settings.server_target_qps = float(req.qps)
        settings.server_target_latency_ns = int((req.slo_s or 0.015) * 1e9)
        settings.server_coalesce_queries = True  # queries due together arrive in one issue call
    elif req.scenario == "offline":
        settings.offline_expected_qps = float(req.qps or 1000.0)
    else:
        settings.single_stream_expected_latency_ns = int(req.expected_latency_s * 1e9)
    return settings


def expected_samples(req: LoadgenRequest) -> float:
    """About how many samples the run issues (whether it may be traced)."""
    rate = req.qps if req.scenario != "single-stream" else 1.0 / max(req.expected_latency_s, 1e-6)
    return max(float(req.min_queries), (rate or 0.0) * req.min_duration_s)


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

    def dispatch(self) -> None:
        """The dispatch thread: the event loop's rules on live arrivals, ``depth`` batches in flight."""
        ex, pol = self.ex, self.policy
        held: list[int] = []
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
                        d = decide(pol, now, queued, self.chunks[0][0], more_coming=True)
                        if d.count:
                            n = min(d.count, self.top)
                            first = self.taken
                            ids, index = self._take(n)
                            held = ids  # completed unserved should submit raise
                            ticket = ex.submit(int(index), n)
                            held = []
                            flight.append(ticket)
                            self.todo.put((ticket, ids, first, now))
                            self.submitted += 1
                            continue
                        self.want, timeout = pol.max_batch, min(d.wait_until_s - now, STOP_POLL_S)
                    else:
                        if self.stop:
                            break
                        self.want = 1
                    if self.issued - self.taken >= self.want:
                        continue  # arrived between the check and publishing ``want``
                    self.wake.wait(timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self.errors.append(exc)
            self.failed = True
            self._respond(held)
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


class NullSut:
    """The null SUT: each issue call completed at once, inside LoadGen's callback; nothing served."""

    def __init__(self, lg: Any) -> None:
        self.lg = lg
        # per issue call: issued, completed, samples
        self.t0, self.t1, self.n = array("d"), array("d"), array("q")
        self.complete_calls = 0

    def issue(self, ids: list[int], indices: list[int]) -> None:  # noqa: D102
        t = time.perf_counter()
        self.lg.QuerySamplesComplete(list(map(self.lg.QuerySampleResponse, ids, repeat(0), repeat(0))))
        self.t0.append(t)
        self.t1.append(time.perf_counter())
        self.n.append(len(ids))
        self.complete_calls += 1

    def log(self, origin: float) -> RequestLog:  # noqa: D102
        counts = np.frombuffer(self.n, dtype=np.int64)
        t0 = np.repeat(np.frombuffer(self.t0, dtype=np.float64) - origin, counts)
        t1 = np.repeat(np.frombuffer(self.t1, dtype=np.float64) - origin, counts)
        z = np.zeros(len(t0))
        return RequestLog(t0, t0.copy(), t1, np.repeat(counts, counts), z, z, z.copy(), n_planned=len(t0))


def drive(executor: Any, req: LoadgenRequest) -> LoadgenResult:
    """Run LoadGen against ``executor`` (inside the worker; ``req.null``: no executor is used)."""
    import mlperf_loadgen as lg

    settings = loadgen_settings(lg, req)
    sut_obj = NullSut(lg) if req.null else BatchedSut(lg, executor, req.policy)
    calls = [0]

    def issue(ids, indices) -> None:
        calls[0] += 1
        sut_obj.issue(ids, indices)

    n_pool = int(
        executor.ring.size
        if executor is not None and hasattr(executor, "ring")
        else getattr(executor, "pool_size", 256)
    )
    sut = lg.ConstructFastSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(n_pool, n_pool, lambda s: None, lambda s: None)
    threads = (
        []
        if req.null
        else [
            threading.Thread(target=sut_obj.dispatch, name="deepgap-loadgen-dispatch", daemon=True),
            threading.Thread(target=sut_obj.complete, name="deepgap-loadgen-complete", daemon=True),
        ]
    )
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    for t in threads:
        t.start()
    traced = req.trace and expected_samples(req) <= TRACE_CAP
    origin = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="deepgap-loadgen-") as d:
            log_settings = lg.LogSettings()
            log_settings.log_output.outdir = d
            log_settings.log_output.copy_summary_to_stdout = False
            log_settings.enable_trace = bool(traced)
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
            path = os.path.join(d, "mlperf_log_summary.txt")
            summary = ""
            if os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    summary = fh.read()
            trace_path = os.path.join(d, "mlperf_log_trace.json")
            trace = read_trace(trace_path) if traced and os.path.exists(trace_path) else None
    finally:
        if not req.null:
            sut_obj.stop = True
            sut_obj.wake.set()
            for t in threads:
                t.join(60)
        sys.setswitchinterval(switch)
        lg.DestroyQSL(qsl)
        lg.DestroyFastSUT(sut)
    if not req.null and sut_obj.errors:
        raise sut_obj.errors[0]
    log = sut_obj.log(origin)
    rate = req.qps if req.scenario == "server" else None
    level = summarize(log, rate, req.slo_s, 0.99, req.confidence) if log.n else None
    note = (
        "tracing off"
        if not req.trace
        else (
            ""
            if traced
            else f"no per-sample comparison: about {expected_samples(req):,.0f} samples, more "
            f"than the {TRACE_CAP:,} LoadGen's trace is kept for"
        )
    )
    matched = agreement(trace, log.latency_s) if trace is not None else None
    return LoadgenResult(
        summary,
        parse_summary(summary),
        log if log.n <= LOG_CAP else None,
        level,
        early_stopping(summary),
        matched,
        note if trace is None else "",
        sut_obj.complete_calls,
        calls[0],
    )
