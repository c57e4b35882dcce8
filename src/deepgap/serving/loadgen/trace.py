"""LoadGen's own per-sample latencies (its trace) beside deepgap's, for the same queries.

Why: LoadGen times a sample from its *scheduled* arrival to its completion call; deepgap's request log
of a LoadGen run starts a request when LoadGen's issuing thread hands it to Python. The difference per
sample is latency the harness adds on its own — the issuing thread waiting for Python's GIL
(``issue_delay``: scheduled → issue started, LoadGen's own field) and the completion reported late.
LoadGen writes both per sample to ``mlperf_log_trace.json`` when tracing is on (a "Sample" begin event
with ``sample_seq``, ``issue_start_ns`` and ``complete_ns``); the file is about 650 bytes a sample, so
runs longer than `TRACE_CAP` samples are not traced and say so.

Samples are matched by issue order: LoadGen's ``sample_seq`` counts samples in the order it issues
them, and deepgap's log keeps LoadGen's issue order (one FIFO of whole issue calls).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

TRACE_CAP = 250_000  # samples: at most ~160 MB of trace in a temporary directory
# Per-sample agreement: LoadGen's latency minus deepgap's for the same query, at its p99, at most this.
AGREEMENT_MARGIN_S = 0.5e-3
_SAMPLE = re.compile(
    r'"name":"Sample".*?"ph":"b".*?"sample_seq":(\d+).*?"issue_start_ns":(-?\d+),'
    r'"complete_ns":(-?\d+)'
)


@dataclass(frozen=True)
class TraceSamples:
    """LoadGen's per-sample record, in issue order (``sample_seq``)."""

    seq: np.ndarray
    issue_delay_s: np.ndarray  # scheduled → LoadGen started issuing the query
    latency_s: np.ndarray  # scheduled → QuerySamplesComplete (LoadGen's latency)


def read_trace(path: str) -> TraceSamples:
    """The "Sample" events of a LoadGen trace file, sorted by ``sample_seq``."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if '"Sample"' in line and '"ph":"b"' in line:
                m = _SAMPLE.search(line)
                if m:
                    rows.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    a = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    a = a[np.argsort(a[:, 0], kind="stable")]
    return TraceSamples(a[:, 0], a[:, 1] * 1e-9, a[:, 2] * 1e-9)


@dataclass(frozen=True)
class Agreement:
    """LoadGen's per-sample latencies against deepgap's for the same queries (seconds)."""

    n: int  # samples matched
    matched: bool  # both sides saw the same number of samples (the match by issue order holds)
    loadgen_p99_s: float
    deepgap_p99_s: float
    diff_p50_s: float  # LoadGen − deepgap, per sample
    diff_p99_s: float
    diff_max_s: float
    issue_delay_p50_s: float  # LoadGen's scheduled → issue start
    issue_delay_p99_s: float
    margin_s: float = AGREEMENT_MARGIN_S

    @property
    def agrees(self) -> bool:
        """Whether the per-sample difference stays within the margin at its p99."""
        return self.matched and self.diff_p99_s <= self.margin_s

    def line(self) -> str:
        """One line for the console and the report."""
        if not self.matched:
            return f"per-sample match failed ({self.n} samples on one side only)"
        ms = 1e3
        return (
            f"per sample, LoadGen − deepgap: p50 {self.diff_p50_s * ms:.3f} ms, p99 "
            f"{self.diff_p99_s * ms:.3f} ms ({'within' if self.agrees else 'beyond'} the "
            f"{self.margin_s * ms:g} ms margin); LoadGen's issue delay p50 "
            f"{self.issue_delay_p50_s * ms:.3f} ms, p99 {self.issue_delay_p99_s * ms:.3f} ms"
        )


def agreement(trace: TraceSamples, deepgap_latency_s: np.ndarray) -> Agreement:
    """Match ``deepgap_latency_s`` (in LoadGen's issue order) with the trace, sample by sample."""
    ours = np.asarray(deepgap_latency_s, dtype=np.float64)
    n = min(len(ours), len(trace.latency_s))
    matched = len(ours) == len(trace.latency_s) and n > 0
    if n == 0:
        nan = float("nan")
        return Agreement(0, False, nan, nan, nan, nan, nan, nan, nan)
    lg, us = trace.latency_s[:n], ours[:n]
    d = lg - us
    return Agreement(
        n,
        matched,
        float(np.percentile(lg, 99)),
        float(np.percentile(us, 99)),
        float(np.percentile(d, 50)),
        float(np.percentile(d, 99)),
        float(d.max()),
        float(np.percentile(trace.issue_delay_s[:n], 50)),
        float(np.percentile(trace.issue_delay_s[:n], 99)),
    )
