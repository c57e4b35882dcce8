"""The timing protocol, with the clock injected so tests can script it exactly.

Per repeat: ``iterations`` synchronized iterations, each timed on its own (the paper's latency, as a
caller that waits for its answer sees it), then a *pipelined window* of back-to-back iterations
with no synchronization between them, timed as a whole (the throughput a busy server sees; the paper
only derived throughput from the median latency). Adaptive mode adds repeats until the median's 95%
CI half-width is within ``target_ci`` of the median, or ``max_time_s`` has been spent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from deepgap.core import stats
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.stats import median_ci_halfwidth_rel

Step = Callable[[], object]


class Clock(Protocol):
    """Times device work correctly for one kind of device."""

    def time_iteration(self, step: Step) -> float:
        """Seconds for one ``step()``, synchronized before and after."""

    def time_window(self, step: Step, n: int) -> float:
        """Seconds for ``n`` back-to-back ``step()`` calls, synchronized only at the ends."""


class HostClock:
    """``perf_counter_ns`` around work that a ``sync()`` makes complete (CPU: a no-op)."""

    def __init__(
        self, sync: Callable[[], None] = lambda: None, clock_ns: Callable[[], int] = time.perf_counter_ns
    ):
        self.sync = sync
        self.clock_ns = clock_ns

    def time_iteration(self, step: Step) -> float:  # noqa: D102
        self.sync()
        t0 = self.clock_ns()
        step()
        self.sync()
        return (self.clock_ns() - t0) * 1e-9

    def time_window(self, step: Step, n: int) -> float:  # noqa: D102
        self.sync()
        t0 = self.clock_ns()
        for _ in range(n):
            step()
        self.sync()
        return (self.clock_ns() - t0) * 1e-9


@dataclass(frozen=True)
class TimingProtocol:
    """How one configuration is measured: warm-up calls, iterations and repeats, a CI target, time limits.

    ``target_ci`` adds repeats until the median's CI is that narrow or ``max_time_s`` is spent;
    ``min_time_s`` is the shortest pipelined window. (A "plan" elsewhere is the sweep's expansion.)
    """

    warmup: int = 20
    iterations: int = 100
    repeats: int = 3
    target_ci: float | None = None
    max_time_s: float = 60.0
    min_time_s: float = 0.0


@dataclass
class Timings:
    """Raw timings of one configuration."""

    samples_s: list[list[float]] = field(default_factory=list)  # per repeat, per iteration
    windows: list[tuple[int, float]] = field(default_factory=list)  # (iterations, seconds) per repeat
    ci_met: bool | None = None
    ci_halfwidth_rel: float | None = None
    elapsed_s: float = 0.0

    @property
    def pooled(self) -> np.ndarray:
        """Every latency sample, all repeats together."""
        return np.concatenate([np.asarray(s) for s in self.samples_s]) if self.samples_s else np.empty(0)

    def window_throughput(self, batch_size: int) -> float:
        """Median over repeats of the pipelined windows' images per second."""
        return float(np.median([n * batch_size / s for n, s in self.windows]))


# the adaptive repeats bootstrap the median's CI again once they have measured this many times its last cost
CI_CHECK_SPACING = 4.0


def run_protocol(
    step: Step,
    clock: Clock,
    protocol: TimingProtocol,
    now: Callable[[], float] = time.monotonic,
    on_repeat: Callable[[int], None] | None = None,
) -> Timings:
    """Warm up, then measure repeats (and adaptive extra repeats) of ``step`` with ``clock``.

    The adaptive stop rule (``target_ci``) bootstraps the median's CI (500 resamples of the whole pool) after
    the fixed repeats, then again once the repeats since have taken `CI_CHECK_SPACING` times the last
    bootstrap's time, and once more at the end. Why: on a noisy host whose repeats are short, a bootstrap after
    every repeat took most of the run (701 of them, 7.4 s of a 10 s tinycnn configuration on a 2-core VM,
    session 47) while nothing was measured; spaced this way the stop rule takes at most a fifth of the loop.
    Where a repeat outlasts four bootstraps (a GPU's ≥ 1 s windows) it is still checked after every repeat.
    """
    t_start = now()
    for _ in range(protocol.warmup):
        step()
    out = Timings()

    def one_repeat() -> None:
        lat = [clock.time_iteration(step) for _ in range(protocol.iterations)]
        out.samples_s.append(lat)
        med = float(np.median(lat))
        n_window = protocol.iterations
        if protocol.min_time_s > 0 and med > 0:
            n_window = max(n_window, math.ceil(protocol.min_time_s / med))
        out.windows.append((n_window, clock.time_window(step, n_window)))
        if on_repeat:
            on_repeat(len(out.samples_s))

    for _ in range(protocol.repeats):
        one_repeat()
    if protocol.target_ci is not None:

        def check() -> tuple[int, float, float]:
            """Bootstrap the pool's CI: (the pool's size then, when it ended, what it cost)."""
            t0 = now()
            out.ci_halfwidth_rel = median_ci_halfwidth_rel(out.pooled)
            t1 = now()
            return len(out.pooled), t1, t1 - t0

        checked, last, cost = check()
        while out.ci_halfwidth_rel > protocol.target_ci and now() - t_start < protocol.max_time_s:
            one_repeat()
            if now() - last >= CI_CHECK_SPACING * cost:
                checked, last, cost = check()
        if len(out.pooled) != checked:  # the CI stored and judged is the final pool's
            check()
        out.ci_met = out.ci_halfwidth_rel <= protocol.target_ci
    out.elapsed_s = now() - t_start
    return out


def ok_result(spec: ConfigSpec, latency_samples_s: Any, **fields: Any) -> Result:
    """An OK row: the latency of ``latency_samples_s`` and the throughput (with its CI) it gives at the batch.

    Image and decode configurations alike (`configuration`, `decode_config`); ``fields`` are the rest.
    """
    lat = stats.summarize(latency_samples_s)
    tput, tlo, thi = stats.throughput_from_latency(spec.batch_size, lat)
    return Result(
        spec=spec,
        status=Status.OK,
        latency=lat,
        throughput_ips=tput,
        throughput_ci_low_ips=tlo,
        throughput_ci_high_ips=thi,
        **fields,
    )
