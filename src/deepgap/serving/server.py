"""The real server: the shared event loop on a wall clock, batches executed by an engine on the device.

Inputs live in pinned host memory (a pool of distinct seeded images, one buffer per request). On a
GPU each request of a batch is copied from its own buffer straight into its slot of the device batch
(one non-blocking DMA per request, issued together): no host-side gather, so the CPU only issues
copies while the link moves the bytes. The batch runs and its logits are copied back into pinned
host memory, with CUDA events between the steps: per batch we know the host→device copy, compute and
device→host copy times, and the host waits on the last event before the batch counts as done.
Measured on the H100 host (ResNet-50 fp16, batch 64, 2026-11-23): gather into pageable staging,
then one copy: 7.40 ms per batch (H2D 1.52 ms at 12 GB/s); into pinned staging: 6.79 ms (H2D 0.45,
~1.3 ms of other host time, most of it the gather); per-request copies: 5.46 ms (copies 0.54,
compute 4.90). On a CPU the batch is gathered into one buffer and the parts are timed with
``perf_counter`` (compute only; there is no copy). A batch of ``n`` runs at the smallest prepared
batch size ≥ ``n`` (padding), as engines with fixed-shape
profiles (CUDA graphs, TensorRT) require; the simulator pads the same way. One execution stream and
one model instance, as Triton's default: copies and compute of consecutive batches do not overlap.
Python's garbage collector is paused during a run so its pauses do not count as serving latency.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from deepgap.serving.batcher import BatchPolicy, StopRule, serve_loop
from deepgap.serving.clock import RealClock
from deepgap.serving.log import RequestLog


class TorchExecutor:
    """Runs batches of pooled requests: per-request copies → device batch → engine → host."""

    def __init__(self, runs: dict[int, Callable[[Any], Any]], device: str, dtype: Any, channels_last: bool,
                 pool: Any) -> None:
        """``runs`` maps each prepared batch size to its callable; ``pool`` is an fp32 NCHW CPU tensor."""
        import torch

        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.device = device
        self.buckets = sorted(runs)
        self.runs = runs
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.pool = pool.to(dtype).contiguous(memory_format=fmt)
        if self.cuda:
            self.pool = self.pool.pin_memory()
        n_pool = self.pool.shape[0]
        self.index = torch.arange(n_pool + self.buckets[-1]) % n_pool
        shape = tuple(self.pool.shape[1:])
        # Buffers are allocated in the memory format directly: ``.contiguous(memory_format=…)`` on a
        # pinned buffer returns a pageable copy, whose "non-blocking" copy is a synchronous, CPU-staged one.
        self.staging = ({} if self.cuda else
                        {b: torch.empty((b, *shape), dtype=dtype, memory_format=fmt) for b in self.buckets})
        self.dev_in = ({b: torch.empty((b, *shape), dtype=dtype, device=device, memory_format=fmt)
                        for b in self.buckets} if self.cuda else self.staging)
        self.host_out: dict[int, Any] = {}
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            self.requests = self.pool.unbind(0)  # one pinned buffer per pooled request
            self.slots = {b: x.unbind(0) for b, x in self.dev_in.items()}

    def bucket(self, n: int) -> int:
        """The prepared batch size a batch of ``n`` runs at."""
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def __call__(self, first: int, count: int) -> tuple[float, float, float]:
        """Serve requests ``first … first+count-1``; returns (h2d, compute, d2h) seconds."""
        torch = self.torch
        b = self.bucket(count)
        s = first % self.pool.shape[0]
        if not self.cuda:
            staging = self.staging[b]
            torch.index_select(self.pool, 0, self.index[s : s + count], out=staging[:count])
            t0 = time.perf_counter()
            self.runs[b](staging)
            return 0.0, time.perf_counter() - t0, 0.0
        e0, e1, e2, e3 = self.events
        x = self.dev_in[b]
        requests = self.requests
        e0.record()
        n_pool = len(requests)
        copy_all(self.slots[b][:count], [requests[(s + k) % n_pool] for k in range(count)])
        e1.record()
        y = self.runs[b](x)
        e2.record()
        out = self.host_out.get(b)
        if out is None:
            out = self.host_out[b] = torch.empty(y.shape, dtype=y.dtype, pin_memory=True)
        out.copy_(y, non_blocking=True)
        e3.record()
        e3.synchronize()
        return e0.elapsed_time(e1) * 1e-3, e1.elapsed_time(e2) * 1e-3, e2.elapsed_time(e3) * 1e-3

    def sync(self) -> None:
        """Wait for the device."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)


def copy_all(dst: Sequence[Any], src: Sequence[Any]) -> None:
    """Non-blocking ``dst[i].copy_(src[i])`` for all i, in one call where torch has ``_foreach_copy_``."""
    import torch

    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(list(dst), list(src), non_blocking=True)
        return
    for d, s in zip(dst, src, strict=True):  # pragma: no cover - torch < 2.1
        d.copy_(s, non_blocking=True)


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


def measure_curve(executor: TorchExecutor, warmup: int, iterations: int, min_time_s: float = 0.0,
                  on_oom: Callable[[BaseException], bool] | None = None) -> tuple[dict[int, list[float]],
                                                                                  dict[int, dict[str, float]], str]:
    """Service seconds per prepared batch size, as the server sees them (gather, copies, compute, sync).

    Returns (samples per batch, mean parts per batch, note). A batch size that runs out of memory ends
    the curve there (``on_oom(exc)`` says whether ``exc`` is one); the note says so.
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
                lat, h2d, comp, d2h = [], [], [], []
                t_start = time.perf_counter()
                while len(lat) < iterations or time.perf_counter() - t_start < min_time_s:
                    t0 = time.perf_counter()
                    p = executor(len(lat) * b, b)
                    lat.append(time.perf_counter() - t0)
                    h2d.append(p[0])
                    comp.append(p[1])
                    d2h.append(p[2])
            except BaseException as exc:
                if on_oom is None or not on_oom(exc) or not samples:
                    raise
                note = f"batch {b} ran out of memory ({str(exc).splitlines()[0][:120]}); the curve ends at {max(samples)}"
                if executor.cuda:
                    executor.torch.cuda.empty_cache()
                break
            samples[b] = lat
            parts[b] = {"h2d_s": float(np.mean(h2d)), "compute_s": float(np.mean(comp)), "d2h_s": float(np.mean(d2h))}
    return samples, parts, note


def run_level(executor: TorchExecutor, arrivals_s: np.ndarray, policy: BatchPolicy, stop: StopRule | None = None,
              start_at: float | None = None) -> RequestLog:
    """Serve one arrival schedule for real; ``start_at`` is a ``perf_counter`` instant (default: in 10 ms)."""
    with executor.torch.inference_mode(), quiet_gc():  # collect first: the clock starts after
        clock = RealClock(time.perf_counter() + 0.005 if start_at is None else start_at)
        clock.sleep_until(0.0)
        return serve_loop(arrivals_s, policy, clock, executor, stop)


def run_closed(executor: TorchExecutor, min_queries: int, min_duration_s: float, max_queries: int = 10**7,
               start_at: float | None = None) -> RequestLog:
    """Single-stream: one query at a time, the next issued when the previous returns (batch 1)."""
    cap = max(min_queries, 1)
    rows: list[tuple[float, float, float, float, float]] = []
    with executor.torch.inference_mode(), quiet_gc():
        clock = RealClock(time.perf_counter() if start_at is None else start_at)
        clock.sleep_until(0.0)
        while len(rows) < max_queries:
            t0 = clock.now()
            h2d, comp, d2h = executor(len(rows), 1)
            rows.append((t0, clock.now(), h2d, comp, d2h))
            if len(rows) >= cap and rows[-1][1] >= min_duration_s:
                break
    a = np.asarray(rows)
    n = len(rows)
    return RequestLog(a[:, 0], a[:, 0].copy(), a[:, 1], np.ones(n, dtype=np.int64), a[:, 2], a[:, 3], a[:, 4],
                      n_planned=n)
