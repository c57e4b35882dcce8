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


def run_loadgen(c: Any) -> None:
    """Parent side: one LoadGen run of the scenario just measured, stored as a ``loadgen`` level."""
    from deepgap.serving.scenarios import level_row
    from deepgap.serving.spec import DEFAULT_POLICY

    spec, s = c.spec, c.out.summary
    why = available()
    if spec.scenario == "single-stream":
        policy, qps = BatchPolicy(1, 0.0), None
    elif spec.scenario == "offline":
        policy, qps = BatchPolicy(int(s.get("offline_batch", 1)), 0.0), s.get("offline_ips")
    else:
        mb = s.get("capacity_max_batch") or min(spec.max_batch or DEFAULT_POLICY[0], c.service.max_batch)
        md = s.get("capacity_max_delay_s")
        md = md if md is not None else (spec.max_delay_s if spec.max_delay_s is not None else DEFAULT_POLICY[1])
        policy, qps = BatchPolicy(int(mb), float(md)), s.get("capacity_qps") or s.get("server_qps")
        if not qps:
            why = why or "unavailable: no sustainable rate was found to drive LoadGen at"
    if why:
        c.rec.levels.append(level_row(c.req, spec.scenario, "loadgen", policy, qps, "loadgen", spec.seed, None,
                                      status="skipped", reason=why))
        c.out.lines.append(f"loadgen: {why}")
        return
    minq, mind = spec.minimums()
    # Server: LoadGen's own verdict is the second driver's capacity. Start at deepgap's capacity and step
    # down until LoadGen calls the run VALID (at most LOADGEN_STEPS), so the two capacities can be compared
    # as rates, not as one pass/fail at the edge, where a p99 is at its most sensitive.
    rates = [qps * f for f in LOADGEN_STEPS] if spec.scenario == "server" else [qps]
    best = None
    for rate in rates:
        p = _one_run(c, spec, policy, rate, minq, mind)
        if spec.scenario != "server":
            break
        if p.get("Result is") == "VALID":
            best = rate
            break
    if spec.scenario == "server":
        c.out.summary["loadgen_capacity_qps"] = best
        c.out.summary["loadgen_capacity_ratio"] = best / qps if best else None
        c.out.lines.append(
            f"loadgen: Server capacity {best:,.1f}/s = {best / qps:.3f} of deepgap's {qps:,.1f}/s"
            if best else f"loadgen: Server INVALID at every rate down to {rates[-1]:,.1f}/s "
            f"({LOADGEN_STEPS[-1]:.2f} of deepgap's)")


# Rates tried for LoadGen's Server, as fractions of deepgap's capacity: the highest VALID one is its capacity.
LOADGEN_STEPS = (1.0, 0.975, 0.95, 0.925, 0.9)


def _one_run(c: Any, spec: Any, policy: BatchPolicy, qps: float | None, minq: int,
             mind: float) -> dict[str, str]:
    """One LoadGen run at ``qps`` stored as a ``loadgen`` level; returns LoadGen's parsed summary."""
    from deepgap.serving.log import summarize
    from deepgap.serving.scenarios import level_row

    req = LoadgenRequest(spec.scenario, policy, qps, spec.slo_s, minq, mind,
                         expected_latency_s=c.service.median_at(1), seed=spec.seed)
    c.say(f"serve: MLCommons LoadGen, {SCENARIO_NAMES[spec.scenario]}" + (f" at {qps:,.1f}/s" if qps else ""))
    res = c.worker.loadgen(req, 300.0 + 4 * mind)
    log = res["log"]
    rate = qps if spec.scenario == "server" else None
    summ = summarize(log, rate, spec.slo_s, 0.99, spec.confidence) if log.n else None
    c.rec.levels.append(level_row(
        c.req, spec.scenario, "loadgen", policy, qps, "loadgen", spec.seed, summ, None, log,
        status="ok" if log.n else "error", reason="" if log.n else "LoadGen issued no query",
        extra={"loadgen_summary": res["summary"], "loadgen": res["parsed"]}))
    p = res["parsed"]
    c.out.summary["loadgen"] = p
    c.out.lines.append("loadgen: " + ", ".join(f"{k} = {p[k]}" for k in (
        "Result is", "Scheduled samples per second", "Samples per second", "Completed samples per second",
        "QPS w/o loadgen overhead",
        "90.0th percentile latency (ns)", "99.00 percentile latency (ns)") if k in p))
    return p
