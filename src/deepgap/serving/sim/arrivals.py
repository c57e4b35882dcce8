"""Arrival streams: seeded Poisson processes and recorded traces, validated before anything runs.

Open loop, as MLPerf's Server scenario and real traffic: a query's arrival time is fixed in advance
and does not wait for the server, so an overloaded server shows up as growing queue waits rather
than as a slower client. A trace file holds one arrival timestamp (seconds) per line — plain text,
or CSV whose first column (or a column named ``t_s``/``timestamp``/``arrival_s``) holds them;
``#`` starts a comment. Timestamps must be finite and non-decreasing; they are shifted to start at 0.
"""

from __future__ import annotations

import csv
import math
import os
import re

import numpy as np

from deepgap.core.errors import UsageError
from deepgap.core.limits import MAX_DURATION_S, is_number, positive_number

# The arrival rates a run can play (q/s): a trace whose timestamps are 0 and 1e-300 asks for 10^300
# queries a second and a rate of 1e-300 q/s for one query per 10^300 s; both hung before the first query.
MIN_RATE_QPS, MAX_RATE_QPS = 0.01, 1e6
_TIME_COLUMNS = ("t_s", "timestamp", "timestamp_s", "arrival_s", "time_s", "t")
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)?\s*$")


def parse_duration_s(text: str, flag: str, most_s: float | None = MAX_DURATION_S) -> float:
    """'15ms' → 0.015, '0.015' or '0.015s' → 0.015, '500us' → 0.0005; positive and finite or a UsageError.

    ``most_s``: past it a duration is a typo (a day by default); None where the caller checks a tighter
    range of its own and says it (serve's `spec._FLOAT_LIMITS`).
    """
    m = _DURATION_RE.match(str(text))
    if not m:
        raise UsageError(
            f"--{flag} {text!r} is not a duration", f"write e.g. --{flag} 15ms (units: us, ms, s)"
        )
    value = float(m.group(1)) * {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}[m.group(2)]
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"--{flag} must be positive, got {text!r}", f"write e.g. --{flag} 15ms")
    if most_s is not None and value > most_s:
        raise UsageError(f"--{flag} {text!r} is over a day", f"write e.g. --{flag} 15ms")
    return value


def parse_rate_qps(text: str, flag: str = "qps", example: str | None = None) -> float:
    """A positive, finite arrival rate in queries per second, or a UsageError.

    ``example``: the whole flag as it should be written (a tenant's rate sits inside ``--tenants``).
    """
    fix = f"pass e.g. {example or f'--{flag} 200'}"
    value = positive_number(text, f"--{flag}", fix, "a positive rate")
    if not MIN_RATE_QPS <= value <= MAX_RATE_QPS:
        raise UsageError(f"--{flag} {text!r} is outside {MIN_RATE_QPS:g} to {MAX_RATE_QPS:g} queries/s", fix)
    return value


def poisson(rate_qps: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s, from 0) of a Poisson process of ``rate_qps``; the same seed, the same times."""
    if not rate_qps > 0:
        raise ValueError(f"rate must be positive, got {rate_qps}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_qps, size=n)
    t = np.cumsum(gaps)
    return t - t[0] if n else t


MAX_LEVEL_QUERIES = 10**7  # one load level's queries: their schedule and log stay within ~1 GiB


def n_queries(rate_qps: float, min_queries: int, min_duration_s: float, bounded: bool = True) -> int:
    """Queries a run issues: LoadGen's rule, both the minimum count and the minimum duration.

    A `UsageError` past `MAX_LEVEL_QUERIES`: each flag within its range may still ask for more
    queries than memory holds (``--qps 1e6 --min-duration 86400s`` tried to allocate 644 GiB).
    ``bounded=False``: the caller caps the count itself (the capacity search's ``max_queries``).
    """
    n = max(int(min_queries), int(math.ceil(rate_qps * min_duration_s)), 1)
    if bounded and n > MAX_LEVEL_QUERIES:
        raise UsageError(
            f"{rate_qps:g} queries/s for {min_duration_s:g} s is {n:,} queries in one load level, more than "
            f"the {MAX_LEVEL_QUERIES:,} that fit in memory",
            "lower --qps or --min-duration",
        )
    return n


def fixed_load(
    qps: float | None,
    trace: np.ndarray | None,
    min_queries: int,
    min_duration_s: float,
    max_queries: int = 10**7,
) -> tuple[float, int]:
    """A fixed level's rate and query count: ``qps``, else the trace's own rate, the trace then replayed whole.

    The minimums may lengthen a trace, never cut it; ``max_queries`` (``--max-queries``, "a cap on queries
    per run") cuts both. Before, it capped only the capacity search's levels. Shared by the image and text
    server (`deepgap.serving.run.server_scenario`) and a decoder's (`deepgap.serving.run.llm_scenario`).
    """
    rate = qps or trace_rate_qps(trace)
    n = n_queries(rate, min_queries, min_duration_s)
    if trace is not None and not qps:
        n = max(n, len(trace))
    return rate, min(n, max_queries)


def load_trace(path: str) -> np.ndarray:
    """Read and validate a trace file of arrival timestamps; a UsageError names the first bad line."""
    from deepgap.store.paths import check_input_path

    check_input_path(path, "trace file", "pass a file of arrival timestamps (one per line)")
    if not os.path.isfile(path):
        raise UsageError(
            f"trace file {path!r} does not exist", "pass a file of arrival timestamps (one per line)"
        )
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot read trace file {path!r} ({exc})", "pass a text file of timestamps"
        ) from None
    col = 0
    values: list[float] = []
    header_seen = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cells = next(csv.reader([line]))
        cells = [c.strip() for c in cells]
        if not header_seen and not values:
            header_seen = True
            names = [c.lower() for c in cells]
            known = [names.index(c) for c in _TIME_COLUMNS if c in names]
            if known:  # a CSV header naming the timestamp column
                col = known[0]
                continue
        if col >= len(cells) or not is_number(cells[col]):
            raise UsageError(
                f"trace file {path!r} line {lineno}: {raw.strip()[:60]!r} is not a timestamp",
                "write one arrival time in seconds per line",
            )
        v = float(cells[col])
        if not math.isfinite(v) or v < 0:
            raise UsageError(
                f"trace file {path!r} line {lineno}: timestamp {v} is negative or not finite",
                "timestamps are seconds ≥ 0",
            )
        if values and v < values[-1]:
            raise UsageError(
                f"trace file {path!r} line {lineno}: timestamp {v} is earlier than the previous {values[-1]} "
                "(not monotonic)",
                "sort the trace by arrival time",
            )
        values.append(v)
    if len(values) < 2:
        raise UsageError(
            f"trace file {path!r} holds {len(values)} timestamps", "a trace needs at least two arrivals"
        )
    t = np.asarray(values, dtype=np.float64)
    if t[-1] - t[0] <= 0:
        raise UsageError(
            f"trace file {path!r}: all arrivals at the same instant", "use --scenario offline for that"
        )
    rate = trace_rate_qps(t)
    if not MIN_RATE_QPS <= rate <= MAX_RATE_QPS:
        raise UsageError(
            f"trace file {path!r}: its mean rate, {rate:.3g} queries/s ({len(t)} arrivals over "
            f"{t[-1] - t[0]:.3g} s), is outside {MIN_RATE_QPS:g} to {MAX_RATE_QPS:g}",
            "write timestamps in seconds, or pass --qps to rescale the trace",
        )
    return t - t[0]


def trace_rate_qps(times_s: np.ndarray) -> float:
    """Mean arrival rate of a trace: (n − 1) gaps over its span."""
    return (len(times_s) - 1) / float(times_s[-1] - times_s[0])


def rescale(times_s: np.ndarray, rate_qps: float) -> np.ndarray:
    """The trace's shape at another mean rate (timestamps scaled; burstiness kept)."""
    return times_s * (trace_rate_qps(times_s) / rate_qps)


def extend(times_s: np.ndarray, n: int) -> np.ndarray:
    """Repeat a trace end to end (one mean gap between copies) until it holds at least ``n`` arrivals."""
    if len(times_s) >= n:
        return times_s
    gap = 1.0 / trace_rate_qps(times_s)
    reps = math.ceil(n / len(times_s))
    span = times_s[-1] + gap
    return np.concatenate([times_s + i * span for i in range(reps)])[: max(n, len(times_s))]
