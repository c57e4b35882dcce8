"""LoadGen's systems under test, run in the serving worker: the batched executor, and a null SUT.

Why apart from `harness` (the request, the settings LoadGen reads, its summary parsed): these are the
threads that answer LoadGen's queries against the served engine (`batched.BatchedSut`; a text model's
`text_sut.TextSut`) or against nothing (`NullSut`, LoadGen's own floor), and `drive`, which runs one
LoadGen test with one of them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from array import array
from itertools import repeat
from typing import Any

import numpy as np

from deepgap.serving.loadgen.batched import BatchedSut
from deepgap.serving.loadgen.harness import (
    SWITCH_INTERVAL_S,
    LoadgenRequest,
    LoadgenResult,
    early_stopping,
    expected_samples,
    loadgen_settings,
    parse_summary,
)
from deepgap.serving.loadgen.text_sut import TextSut
from deepgap.serving.loadgen.trace import TRACE_CAP, agreement, read_trace
from deepgap.serving.sim.log import RequestLog, summarize

# Requests whose records go back to the parent and into the store; a longer run (MLPerf's 600 s at tens of
# thousands of samples/s) keeps deepgap's summary of it and LoadGen's, not a row per request.
LOG_CAP = 2_000_000


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


def _run_test(lg: Any, sut: Any, qsl: Any, settings: Any, traced: bool) -> tuple[str, Any]:
    """One LoadGen test, its logs in a folder of its own: the summary's text and the trace (None: untraced)."""
    with tempfile.TemporaryDirectory(prefix="deepgap-loadgen-") as d:
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = d
        log_settings.log_output.copy_summary_to_stdout = False
        log_settings.enable_trace = traced
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        path = os.path.join(d, "mlperf_log_summary.txt")
        summary = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                summary = fh.read()
        trace_path = os.path.join(d, "mlperf_log_trace.json")
        return summary, (read_trace(trace_path) if traced and os.path.exists(trace_path) else None)


def _pool_size(executor: Any, req: LoadgenRequest) -> int:
    """The QSL's samples: a text model's sample lengths, else the executor's input ring (or its pool)."""
    return int(
        len(req.sample_lengths)
        if req.sample_lengths is not None
        else executor.ring.size
        if executor is not None and hasattr(executor, "ring")
        else getattr(executor, "pool_size", 256)
    )


def _trace_note(req: LoadgenRequest, traced: bool) -> str:
    """Why a run has no per-sample comparison with LoadGen's trace ("" where it was traced)."""
    if not req.trace:
        return "tracing off"
    if traced:
        return ""
    return (
        f"no per-sample comparison: about {expected_samples(req):,.0f} samples, more "
        f"than the {TRACE_CAP:,} LoadGen's trace is kept for"
    )


def drive(executor: Any, req: LoadgenRequest) -> LoadgenResult:
    """Run LoadGen against ``executor`` (inside the worker; ``req.null``: no executor is used)."""
    import mlperf_loadgen as lg

    settings = loadgen_settings(lg, req)
    text = req.sample_lengths is not None and not req.null  # a text model: samples with their lengths
    if text:
        executor.set_samples(req.sample_lengths)
    sut_obj = (
        NullSut(lg)
        if req.null
        else TextSut(lg, executor, req.policy, req.sample_lengths)
        if text
        else BatchedSut(lg, executor, req.policy)
    )
    calls = [0]

    def issue(ids, indices) -> None:
        calls[0] += 1
        sut_obj.issue(ids, indices)

    n_pool = _pool_size(executor, req)
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
        summary, trace = _run_test(lg, sut, qsl, settings, bool(traced))
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
    if text:  # what the batches held: the samples' own tokens, and what the engine ran, padding included
        log.useful_tokens, log.padded_tokens = executor.useful_tokens, executor.padded_tokens
    rate = req.qps if req.scenario == "server" else None
    level = summarize(log, rate, req.slo_s, 0.99, req.confidence) if log.n else None
    matched = agreement(trace, log.latency_s) if trace is not None else None
    return LoadgenResult(
        summary,
        parse_summary(summary),
        log if log.n <= LOG_CAP else None,
        level,
        early_stopping(summary),
        matched,
        _trace_note(req, bool(traced)) if trace is None else "",
        sut_obj.complete_calls,
        calls[0],
    )
