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
(`deepgap.serving.loadgen.trace`). LoadGen's sample indices pick ring slots, so a batch is served from
the ring like any other (one or two copies from the first sample's slot: the bytes moved are the
same); a text model's samples have lengths and are batched per bucket (`deepgap.serving.loadgen.text_sut`).
Without the package ``--loadgen`` is refused before anything runs (exit 2); LoadGen's own log
files go to a temporary directory, never the working directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepgap.serving.loadgen.trace import Agreement
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.log import LevelSummary, RequestLog

SCENARIO_NAMES = {"single-stream": "SingleStream", "server": "Server", "offline": "Offline"}
SWITCH_INTERVAL_S = 2e-4  # LoadGen's issuing thread waits for the GIL at most about this long, not 5 ms
STOP_POLL_S = 0.05  # an idle dispatch thread checks for the end of the run this often


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
    # A text model: the QSL's samples, sample ``s`` ``sample_lengths[s]`` tokens long (None: images)
    sample_lengths: np.ndarray | None = None


def null_request(req: LoadgenRequest) -> LoadgenRequest:
    """The same LoadGen settings against the null SUT."""
    return dataclasses.replace(req, null=True)


@dataclass
class LoadgenResult:
    """What one LoadGen run gave: its summary, our request log, and the per-sample comparison."""

    summary: str
    parsed: dict[str, str]
    log: (
        RequestLog | None
    )  # None when the run served more than loadgen_sut.LOG_CAP requests (its summary is kept)
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
