"""Two clocks behind one interface, so the same event loop serves real traffic and simulates it.

`RealClock` reads ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, shared by every process of a
host, so tenants in separate processes can agree on a start instant) and waits by sleeping, then
spinning the last fraction of a millisecond (``time.sleep`` alone overshoots by 50–100 µs).
`VirtualClock` is a number that only moves when the loop waits or an executor charges service time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the clock's origin, and a way to wait until a later instant."""

    def now(self) -> float:
        """Seconds since the origin."""

    def sleep_until(self, t_s: float) -> None:
        """Return at (or just after) ``t_s``; immediately when ``t_s`` has passed."""


class RealClock:
    """Wall time relative to ``origin_s`` (a ``time.perf_counter()`` reading; default: now)."""

    SPIN_S = 2e-4  # the last 200 µs of a wait are spun, not slept

    def __init__(self, origin_s: float | None = None) -> None:
        self.origin_s = time.perf_counter() if origin_s is None else float(origin_s)

    def now(self) -> float:  # noqa: D102
        return time.perf_counter() - self.origin_s

    def sleep_until(self, t_s: float) -> None:  # noqa: D102
        remaining = t_s - self.now()
        if remaining > self.SPIN_S:
            time.sleep(remaining - self.SPIN_S)
        while self.now() < t_s:
            pass


class VirtualClock:
    """Simulated time: waits jump forward, `advance` charges service time; nothing sleeps."""

    def __init__(self, t_s: float = 0.0) -> None:
        self.t_s = float(t_s)

    def now(self) -> float:  # noqa: D102
        return self.t_s

    def sleep_until(self, t_s: float) -> None:  # noqa: D102
        if t_s > self.t_s:
            self.t_s = float(t_s)

    def advance(self, dt_s: float) -> None:
        """Move time forward by ``dt_s`` (an executor's service time)."""
        if dt_s < 0:
            raise ValueError(f"negative service time {dt_s}")
        self.t_s += float(dt_s)
