"""Optional: drive the same server with MLCommons LoadGen and keep its summary beside ours.

LoadGen (``pip install mlcommons-loadgen``, module ``mlperf_loadgen``) issues queries from its own
threads on its own schedule, so here arrivals are live: ``issue_queries`` time-stamps them into a
queue, and a serving thread batches them with the *same* `decide` function the event loop uses and
runs them on the same executor, then reports completion to LoadGen. We store LoadGen's
``mlperf_log_summary.txt`` (its latencies, its validity verdict) and our own per-request records of
that run. LoadGen's sample indices pick ring slots, so a batch of LoadGen's samples is served from
the ring like any other (one or two copies from the first sample's slot: the bytes moved are the
same). Without the package ``--loadgen`` is refused before anything runs (exit 2); LoadGen's own
log files go to a temporary directory, never the working directory.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepgap.serving.batcher import BatchPolicy, decide
from deepgap.serving.clock import RealClock
from deepgap.serving.log import RequestLog

IDLE_POLL_S = 1e-4  # how often an idle serving thread checks the batch in flight
SCENARIO_NAMES = {"single-stream": "SingleStream", "server": "Server", "offline": "Offline"}


def available() -> str | None:
    """None when LoadGen imports, else why not."""
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return "unavailable: mlcommons-loadgen is not installed (pip install mlcommons-loadgen)"
    return None


@dataclass(frozen=True)
class LoadgenRequest:
    """One LoadGen performance run."""

    scenario: str
    policy: BatchPolicy
    qps: float | None = None
    slo_s: float | None = None
    min_queries: int = 100
    min_duration_s: float = 1.0
    expected_latency_s: float = 0.001
    seed: int = 0


def parse_summary(text: str) -> dict[str, str]:
    """``key : value`` lines of LoadGen's summary."""
    out = {}
    for line in text.splitlines():
        if ":" in line and not line.lstrip().startswith("*"):
            k, v = line.split(":", 1)
            if k.strip() and v.strip():
                out[k.strip()] = v.strip()
    return out


def drive(executor: Any, req: LoadgenRequest) -> dict[str, Any]:
    """Run LoadGen against ``executor`` (inside the worker); returns its summary and our RequestLog."""
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, SCENARIO_NAMES[req.scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_query_count = int(req.min_queries)
    settings.min_duration_ms = int(req.min_duration_s * 1000)
    settings.schedule_rng_seed = settings.sample_index_rng_seed = settings.qsl_rng_seed = int(req.seed) + 1
    if req.scenario == "server":
        settings.server_target_qps = float(req.qps)
        settings.server_target_latency_ns = int((req.slo_s or 0.015) * 1e9)
        if hasattr(settings, "server_coalesce_queries"):  # queries due together arrive in one issue call
            settings.server_coalesce_queries = True
    elif req.scenario == "offline":
        settings.offline_expected_qps = float(req.qps or 1000.0)
    else:
        settings.single_stream_expected_latency_ns = int(req.expected_latency_s * 1e9)
    clock = RealClock()
    pending: deque = deque()  # (LoadGen id, sample index, arrival s); deque appends are thread-safe
    rows: list[tuple[float, float, float, int, float, float, float]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    arrived = threading.Event()  # set by LoadGen's thread on every issue: the serving thread sleeps on it

    def issue(samples) -> None:
        t = clock.now()
        pending.extend((s.id, s.index, t) for s in samples)
        arrived.set()

    def complete(ticket: Any, batch: list, dispatch: float) -> None:
        h2d, comp, d2h, _ = executor.wait(ticket)
        done = clock.now()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(b[0], 0, 0) for b in batch])
        rows.extend((b[2], dispatch, done, len(batch), h2d, comp, d2h) for b in batch)

    def serve() -> None:
        # The event loop's rules on live arrivals: `decide` while fewer than ``depth`` batches are in
        # flight (the pipelined executor overlaps the next copy-in with the current compute).
        inflight: deque = deque()
        top = executor.buckets[-1]
        try:
            with executor.torch.inference_mode():
                while not (stop.is_set() and not pending and not inflight):
                    arrived.clear()
                    while inflight and executor.done(inflight[0][0]):
                        complete(*inflight.popleft())
                    if pending and len(inflight) < executor.depth:
                        now = clock.now()
                        d = decide(req.policy, now, len(pending), pending[0][2], more_coming=True)
                        if d.count:
                            batch = [pending.popleft() for _ in range(min(d.count, top, len(pending)))]
                            inflight.append((executor.submit(int(batch[0][1]), len(batch)), batch, now))
                            continue
                    if len(inflight) >= executor.depth:
                        complete(*inflight.popleft())
                    else:
                        # Sleep off the GIL until LoadGen issues or a short poll of the GPU is due: a spinning
                        # loop (sleep(0)) fights LoadGen's issuing thread for the GIL at every query.
                        arrived.wait(IDLE_POLL_S if inflight else 10 * IDLE_POLL_S)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    n_pool = int(executor.ring.size)
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(n_pool, n_pool, lambda s: None, lambda s: None)
    worker = threading.Thread(target=serve, name="deepgap-loadgen-serve", daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)  # LoadGen's issuing thread waits for the GIL at most this long, not 5 ms
    worker.start()
    try:
        with tempfile.TemporaryDirectory(prefix="deepgap-loadgen-") as d:
            log_settings = lg.LogSettings()
            log_settings.log_output.outdir = d
            log_settings.log_output.copy_summary_to_stdout = False
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
            path = os.path.join(d, "mlperf_log_summary.txt")
            summary = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    finally:
        stop.set()
        worker.join(60)
        sys.setswitchinterval(switch)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    if errors:
        raise errors[0]
    a = np.asarray(rows, dtype=np.float64).reshape(-1, 7)
    a = a[np.argsort(a[:, 0], kind="stable")]
    log = RequestLog(a[:, 0], a[:, 1], a[:, 2], a[:, 3].astype(np.int64), a[:, 4], a[:, 5], a[:, 6], n_planned=len(a))
    return {"summary": summary, "parsed": parse_summary(summary), "log": log}
