"""benchmarks/quant_inputs.py's synchronized figures: by CUDA events, and on the host as the harness times.

Why: at batch 1 the harness (`timing.HostClock`: the host's clock from before the launch to the return of the
synchronization) and the loop's CUDA events measure two things (session 45 on one H200: 0.259 against 0.248 ms);
the loop now reports the harness's kind too, so that each is checked against its own.
"""

from __future__ import annotations

import itertools

import pytest
from repo_paths import imported_benchmark


@pytest.fixture
def loop():
    yield from imported_benchmark("quant_inputs")


class _Event:
    """A stand-in CUDA event: each pair spans 0.2 ms of device time."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return 0.2


def test_synchronized_reports_the_events_and_the_hosts_clock(loop, monkeypatch):
    calls: list[str] = []
    ticks = itertools.count(step=0.25e-3)  # the host's clock moves 0.25 ms between reads
    monkeypatch.setattr(loop.torch.cuda, "Event", _Event)
    monkeypatch.setattr(loop.torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(ticks))
    got = loop.synchronized(lambda x: calls.append("run"), None, batch=2, calls=3)
    assert calls == ["sync", "run", "sync"] * 3  # idle before each call, complete before its host clock stops
    assert got["synchronized_ms"] == pytest.approx(0.2)
    assert got["img_s_synchronized"] == pytest.approx(2 / 0.2e-3)
    assert got["synchronized_host_ms"] == pytest.approx(0.25)
    assert got["img_s_synchronized_host"] == pytest.approx(2 / 0.25e-3)
