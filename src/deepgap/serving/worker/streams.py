"""Two execution streams behind one small interface: CUDA streams, or threads that behave like them.

The pipelined executor (`server.PipelinedExecutor`) overlaps the next batch's host→device copy with
the current batch's compute: copies go on one stream, normalise + engine + device→host on another,
with events between them. Its ordering logic is the subtle part, so it is written against this
interface and tested on the CPU with `ThreadStreams`: each stream is a one-thread executor (work runs
in submission order, as on a CUDA stream), an event is a future that resolves when the stream reaches
it (with its ``perf_counter`` time), and ``wait`` makes a stream block on another's event — CUDA's
semantics, so a missing wait shows up on the CPU as a race the tests catch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class CudaStreams:
    """``torch.cuda`` streams and timing events."""

    def __init__(self, device: str) -> None:
        self.torch = torch
        self.device = torch.device(device)

    def stream(self) -> Any:  # noqa: D102
        return self.torch.cuda.Stream(self.device)

    def enqueue(self, stream: Any, fn: Callable[[], Any]) -> None:
        """Run ``fn`` now with ``stream`` current, so the work it launches goes on ``stream``."""
        with self.torch.cuda.stream(stream):
            fn()

    def record(self, stream: Any) -> Any:
        """An event after everything enqueued on ``stream`` so far."""
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(stream)
        return e

    def wait(self, stream: Any, event: Any) -> None:
        """Work enqueued on ``stream`` from now on starts after ``event``."""
        stream.wait_event(event)

    @staticmethod
    def done(event: Any) -> bool:  # noqa: D102
        return event.query()

    @staticmethod
    def synchronize(event: Any) -> None:  # noqa: D102
        event.synchronize()

    @staticmethod
    def elapsed_s(start: Any, end: Any) -> float:  # noqa: D102
        return start.elapsed_time(end) * 1e-3

    def close(self) -> None:  # noqa: D102
        pass


class ThreadStreams:
    """CPU stand-in: a stream is a one-thread executor, an event a future holding its time."""

    def __init__(self) -> None:
        self.pools: list[ThreadPoolExecutor] = []
        self.errors: list[BaseException] = []

    def stream(self) -> ThreadPoolExecutor:  # noqa: D102
        p = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deepgap-stream")
        self.pools.append(p)
        return p

    def enqueue(self, stream: ThreadPoolExecutor, fn: Callable[[], Any]) -> None:
        """Queue ``fn``; an exception it raises is re-raised by the next `synchronize`."""
        stream.submit(fn).add_done_callback(lambda f: f.exception() and self.errors.append(f.exception()))

    def record(self, stream: ThreadPoolExecutor) -> Future:  # noqa: D102
        return stream.submit(time.perf_counter)

    def wait(self, stream: ThreadPoolExecutor, event: Future) -> None:  # noqa: D102
        stream.submit(event.result)

    @staticmethod
    def done(event: Future) -> bool:  # noqa: D102
        return event.done()

    def synchronize(self, event: Future) -> None:  # noqa: D102
        event.result()
        if self.errors:
            raise self.errors.pop(0)

    @staticmethod
    def elapsed_s(start: Future, end: Future) -> float:  # noqa: D102
        return max(0.0, end.result() - start.result())

    def close(self) -> None:
        """Stop the stream threads (after their queued work)."""
        for p in self.pools:
            p.shutdown(wait=True)
        self.pools.clear()


class InlineStreams:
    """No streams (the CPU in production): work runs when enqueued, an event is the time it was reached."""

    def stream(self) -> None:  # noqa: D102
        return None

    @staticmethod
    def enqueue(stream: None, fn: Callable[[], Any]) -> None:  # noqa: D102
        fn()

    @staticmethod
    def record(stream: None) -> float:  # noqa: D102
        return time.perf_counter()

    def wait(self, stream: None, event: float) -> None:  # noqa: D102
        pass

    @staticmethod
    def done(event: float) -> bool:  # noqa: D102
        return True

    @staticmethod
    def synchronize(event: float) -> None:  # noqa: D102
        pass

    @staticmethod
    def elapsed_s(start: float, end: float) -> float:  # noqa: D102
        return end - start

    def close(self) -> None:  # noqa: D102
        pass
