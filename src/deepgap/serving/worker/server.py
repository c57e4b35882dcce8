"""The real server: the shared event loop on a wall clock, batches executed by a pipelined engine.

Data path (why each step: README, "Serving"). Request inputs are uint8 NHWC images in one ring
(`ring.InputRing`, pinned on a GPU); the batcher dispatches contiguous request ranges, so a batch is
one host→device copy (two where the ring wraps) into a device uint8 buffer. On the compute stream
one elementwise kernel normalises it into the engine's input (dtype, layout), the engine runs, and
its logits are copied back into pinned host memory. Copies go on a second stream with their own
double-buffered device slot, so batch k+1's copy-in overlaps batch k's compute: the executor keeps
``depth`` batches in flight (2 on a GPU). CUDA events around each step give per batch the copy-in,
compute (normalise + engine) and copy-out times; ``host_s`` is the launching thread's own time per
batch (the Python that issues a batch), recorded with every load level. On a CPU there is nothing
to overlap: depth 1, work runs inline (`streams.InlineStreams`), the "copy" is a memcpy. A batch of
``n`` runs at the smallest prepared batch size ≥ ``n`` (padding), as fixed-shape engines (CUDA
graphs, TensorRT) require; the simulator pads the same way. Python's garbage collector is paused
during a run so its pauses do not count as serving latency.
"""

from __future__ import annotations

import bisect
import gc
import math
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from deepgap.measure.graph_runner import bound_input
from deepgap.serving.sim.batcher import BatchPolicy, StopRule, serve_loop
from deepgap.serving.sim.clock import RealClock
from deepgap.serving.sim.log import RequestLog
from deepgap.serving.worker.ring import InputRing, Normaliser
from deepgap.serving.worker.streams import CudaStreams, InlineStreams


@dataclass
class Ticket:
    """One batch in flight: its events and the host time spent issuing it."""

    events: tuple[Any, ...]
    host_s: float
    bucket: int
    slot: int


class PipelinedExecutor:
    """Runs batches of ring requests: copy-in (stream 1) → normalise, engine, copy-out (stream 2)."""

    def __init__(
        self,
        runs: dict[int, Callable[[Any], Any]],
        device: str,
        dtype: Any,
        channels_last: bool,
        ring: InputRing,
        streams: Any = None,
        depth: int | None = None,
    ) -> None:
        """``runs`` maps each prepared batch size to its callable; ``streams`` defaults by device."""
        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.device = device
        self.buckets = sorted(runs)
        self.runs = runs
        self.ring = ring
        self.st = streams or (CudaStreams(device) if self.cuda else InlineStreams())
        self.depth = depth or (1 if isinstance(self.st, InlineStreams) else 2)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        shape = tuple(ring.images.shape[1:])
        res = shape[0]
        top = self.buckets[-1]
        if top > ring.size:
            raise ValueError(f"batch {top} is larger than the input ring ({ring.size})")
        # one uint8 landing buffer per slot in flight; engine inputs per batch size, in the engine's layout
        self.u8 = [torch.empty((top, *shape), dtype=torch.uint8, device=device) for _ in range(self.depth)]
        # a captured graph's own input buffer where it takes one of these as it is (`graph_runner.bound_input`):
        # the normaliser then writes where the engine reads, with no copy before each replay
        self.dev_in = {
            b: bound_input(
                runs[b],
                torch.zeros((b, 3, res, res), dtype=dtype, device=device).contiguous(memory_format=fmt),
            )
            for b in self.buckets
        }
        self.norm = Normaliser(dtype, device)
        self.host_out: list[dict[int, Any]] = [{} for _ in range(self.depth)]
        self.copy_stream, self.compute_stream = self.st.stream(), self.st.stream()
        self.consumed: list[Any] = [None] * self.depth  # compute-stream event after the slot's last use
        self.k = 0
        self.last_out: Any = None
        if self.cuda:  # the streams start after everything the default stream did (prepare, these buffers)
            torch.cuda.synchronize(device)

    def bucket(self, n: int) -> int:
        """The prepared batch size a batch of ``n`` runs at."""
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def submit(self, first: int, count: int) -> Ticket:
        """Issue requests ``first … first+count-1`` without waiting for them."""
        t0 = time.perf_counter()
        b = self.bucket(count)
        x = self.dev_in[b]

        def compute(slot: int) -> Any:
            self.norm(self.u8[slot][:count], x)
            return self.runs[b](x)

        return self.issue(
            t0,
            b,
            lambda slot: self.ring.copy_batch(self.u8[slot], first, count, non_blocking=self.cuda),
            compute,
        )

    def issue(
        self, t0: float, b: int, copy_in: Callable[[int], Any], compute: Callable[[int], Any]
    ) -> Ticket:
        """One batch through the streams: copy-in, then compute and copy-out.

        ``copy_in(slot)`` runs on the copy stream, ``compute(slot)`` (returning the output) and the copy of
        that output to pinned host memory on the compute stream. The slot's buffer is reused only after
        its previous batch's compute (the ``consumed`` event); the events around each step time it.
        Shared by the text model's executor (`deepgap.serving.worker.text_executor`), whose inputs and
        engine call differ.
        """
        st, cs, ks = self.st, self.copy_stream, self.compute_stream
        slot = self.k % self.depth
        self.k += 1
        outs = self.host_out[slot]
        if self.consumed[slot] is not None:  # the slot's previous batch must have left its buffer
            st.wait(cs, self.consumed[slot])
        e0 = st.record(cs)
        st.enqueue(cs, lambda: copy_in(slot))
        e1 = st.record(cs)
        st.wait(ks, e1)
        e2 = st.record(ks)
        held: list[Any] = []

        def copy_out() -> None:
            y = held.pop()
            out = outs.get(b)
            if out is None:
                out = outs[b] = self.torch.empty(y.shape, dtype=y.dtype, pin_memory=self.cuda)
            out.copy_(y, non_blocking=self.cuda)
            self.last_out = out

        st.enqueue(ks, lambda: held.append(compute(slot)))
        e3 = st.record(ks)
        self.consumed[slot] = e3
        st.enqueue(ks, copy_out)
        e4 = st.record(ks)
        return Ticket((e0, e1, e2, e3, e4), time.perf_counter() - t0, b, slot)

    def done(self, t: Ticket) -> bool:
        """Whether the batch's results are on the host."""
        return self.st.done(t.events[-1])

    def wait(self, t: Ticket) -> tuple[float, float, float, float]:
        """Block until the batch is done; its (h2d, compute, d2h, host) seconds."""
        e0, e1, e2, e3, e4 = t.events
        self.st.synchronize(e4)
        el = self.st.elapsed_s
        return el(e0, e1), el(e2, e3), el(e3, e4), t.host_s

    def __call__(self, first: int, count: int) -> tuple[float, float, float, float]:
        """Serve one batch synchronously (single-stream, LoadGen, calibration)."""
        return self.wait(self.submit(first, count))

    def output(self, count: int) -> Any:
        """Logits of the last finished batch (host memory)."""
        return self.last_out[:count]

    def engine_interval_s(self, b: int, iterations: int) -> float:
        """Seconds per batch of the engine alone, inputs on the device, back to back (a sweep's view)."""
        st, ks = self.st, self.compute_stream
        x = self.dev_in[b]
        e0 = st.record(ks)
        for _ in range(iterations):
            st.enqueue(ks, lambda: self.runs[b](x))
        e1 = st.record(ks)
        st.synchronize(e1)
        return st.elapsed_s(e0, e1) / iterations

    def sync(self) -> None:
        """Wait for the device."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Stop the stream threads, if any."""
        self.st.close()


@contextmanager
def quiet_gc():
    """Collect, then keep the garbage collector off for the duration of a timed run."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


HOLD_WITHIN = 0.9  # a batch size's engine is held where its burst reaches this share of the best burst's rate


def measure_curve(
    executor: PipelinedExecutor,
    warmup: int,
    iterations: int,
    min_time_s: float = 0.0,
    on_oom: Callable[[BaseException], bool] | None = None,
    engine_min_time_s: float = 0.0,
) -> tuple[dict[int, list[float]], dict[int, dict[str, float]], str]:
    """Service seconds per prepared batch size, as the server sees them (issue, copies, compute, sync).

    Per batch size: ``samples`` are the latencies of batches run one at a time; ``parts`` their mean
    h2d/compute/d2h/host seconds, plus ``interval_s`` (seconds between completions with the pipeline
    full: the server's throughput at that size) and ``engine_s`` (the engine alone on device-resident
    inputs: the sweep's number, what the serving path is compared against, held back to back for
    ``engine_min_time_s`` by `sustained_s`; ``engine_burst_s`` is its first short burst). A batch size that runs
    out of memory ends the curve there (``on_oom(exc)`` says whether ``exc`` is one); the note says so.

    Only the batch sizes whose burst is within `HOLD_WITHIN` of the best burst's rate are held (the others'
    ``engine_s`` is None): the comparator is the best held rate (`scenario_context.engine_ips`), and holding
    each of eight buckets ≥ 2 s cost 16 s a GPU set-up (session 46) for rates that could not be the best.
    """
    samples: dict[int, list[float]] = {}
    parts: dict[int, dict[str, float]] = {}
    note = ""
    torch = executor.torch
    with torch.inference_mode(), quiet_gc():
        for b in executor.buckets:
            try:
                for _ in range(warmup):
                    executor(0, b)
                lat, p = [], []
                t_start = time.perf_counter()
                while len(lat) < iterations or time.perf_counter() - t_start < min_time_s:
                    t0 = time.perf_counter()
                    p.append(executor(len(lat) * b, b))
                    lat.append(time.perf_counter() - t0)
                interval = pipelined_interval_s(executor, b, max(iterations, 2))
                burst = executor.engine_interval_s(b, max(iterations // 2, 1))
            except BaseException as exc:
                if on_oom is None or not on_oom(exc) or not samples:
                    raise
                why = str(exc).splitlines()[0][:120]
                note = f"batch {b} ran out of memory ({why}); the curve ends at {max(samples)}"
                if executor.cuda:
                    executor.torch.cuda.empty_cache()
                break
            samples[b] = lat
            m = np.mean(np.asarray(p), axis=0)
            parts[b] = {
                "h2d_s": float(m[0]),
                "compute_s": float(m[1]),
                "d2h_s": float(m[2]),
                "host_s": float(m[3]),
                "interval_s": min(interval, float(np.median(lat))),
                "engine_s": burst,
                "engine_burst_s": burst,
            }
        if engine_min_time_s > 0 and parts:
            rates = {b: b / p["engine_burst_s"] if p["engine_burst_s"] > 0 else 0.0 for b, p in parts.items()}
            floor = HOLD_WITHIN * max(rates.values())
            for b, p in parts.items():
                held = rates[b] >= floor
                burst = p["engine_burst_s"]
                p["engine_s"] = (
                    sustained_s(executor.engine_interval_s, b, burst, engine_min_time_s) if held else None
                )
    return samples, parts, note


def sustained_s(interval_s: Callable[[int, int], float], b: int, burst_s: float, min_time_s: float) -> float:
    """Seconds per batch of ``b`` over a window of at least ``min_time_s``, after one window as long.

    Why: a burst of a few batches (``burst_s``) runs at the clocks an idle GPU boosts to, while the served
    capacity set against the engine comes from probes of many seconds at the power cap, and a sweep's
    windows last ≥ 1 s. The first window brings the clocks to where sustained load holds them; the second
    is timed. ``interval_s(b, n)``: seconds per batch of ``n`` back to back. ``min_time_s`` ≤ 0: the burst.
    """
    if min_time_s <= 0 or burst_s <= 0:
        return burst_s
    n = max(1, math.ceil(min_time_s / burst_s))
    interval_s(b, n)
    return interval_s(b, n)


def pipelined_interval_s(executor: PipelinedExecutor, b: int, n: int) -> float:
    """Seconds between completions of ``n`` back-to-back batches of ``b``, ``depth`` in flight."""
    q: deque = deque()
    done: list[float] = []
    for i in range(n):
        if len(q) >= executor.depth:
            executor.wait(q.popleft())
            done.append(time.perf_counter())
        q.append(executor.submit(i * b, b))
    while q:
        executor.wait(q.popleft())
        done.append(time.perf_counter())
    return (done[-1] - done[0]) / (len(done) - 1)


def run_level(
    executor: PipelinedExecutor,
    arrivals_s: np.ndarray,
    policy: BatchPolicy,
    stop: StopRule | None = None,
    start_at: float | None = None,
) -> RequestLog:
    """Serve one arrival schedule for real; ``start_at`` is a ``perf_counter`` instant (default: in 10 ms)."""
    with executor.torch.inference_mode(), quiet_gc():  # collect first: the clock starts after
        clock = RealClock(time.perf_counter() + 0.005 if start_at is None else start_at)
        clock.sleep_until(0.0)
        return serve_loop(arrivals_s, policy, clock, executor, stop)


def run_closed(
    executor: PipelinedExecutor,
    min_queries: int,
    min_duration_s: float,
    max_queries: int = 10**7,
    start_at: float | None = None,
) -> RequestLog:
    """Single-stream: one query at a time, the next issued when the previous returns (batch 1)."""
    cap = max(min_queries, 1)
    rows: list[tuple[float, float, float, float, float]] = []
    with executor.torch.inference_mode(), quiet_gc():
        clock = RealClock(time.perf_counter() if start_at is None else start_at)
        clock.sleep_until(0.0)
        while len(rows) < max_queries:
            t0 = clock.now()
            h2d, comp, d2h, _ = executor(len(rows), 1)
            rows.append((t0, clock.now(), h2d, comp, d2h))
            if len(rows) >= cap and rows[-1][1] >= min_duration_s:
                break
    a = np.asarray(rows)
    n = len(rows)
    return RequestLog(
        a[:, 0], a[:, 0].copy(), a[:, 1], np.ones(n, dtype=np.int64), a[:, 2], a[:, 3], a[:, 4], n_planned=n
    )
