"""A background sampler thread and the energy windows it brackets.

Why a thread plus marks: sensors (power, temperature, clocks, reasons, processes) are *sampled* at a
configurable rate by a daemon thread, while the energy of a measurement is taken from the device's
cumulative counter read *synchronously* by the measuring thread right before and after each energy
window (`Sampler.begin_window` / `end_window`), so the window's joules do not depend on the
sampling rate. NVML calls release the GIL; the thread samples slowly (``low_hz``) while latencies
are timed, so it barely touches them, and at the full rate inside energy windows.

The NVML energy counter only moves every 20–100 ms. Each window edge therefore waits (at most
``align_timeout_s``) for the counter to tick before the window starts and after it ends: the start
reading is then fresh, and the end reading includes all of the window plus a short idle *tail*
(recorded per window, and subtracted at the idle baseline power by `deepgap.measure.telemetry.aggregate`).

A backend that raises stops the sampling and leaves the reason in ``error``; the measurement goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepgap.measure.telemetry.base import Backend, TelemetrySample

_STOP_JOIN_S = 5.0


@dataclass(frozen=True)
class EnergyMark:
    """The energy counter around one energy window (one pipelined window)."""

    t0_s: float  # epoch seconds of the start reading (the window starts right after)
    t1_s: float  # epoch seconds of the end reading
    duration_s: float  # monotonic seconds between the two readings (the window plus the tail)
    tail_s: float  # seconds between the window's end and the end reading (waiting for a counter tick)
    e0_j: float | None  # counter at the start (None: unreadable)
    e1_j: float | None
    images: int  # images processed inside the window

    def to_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return dict(self.__dict__)


class Sampler:
    """Samples a `Backend` on a thread; brackets energy windows on the caller's thread."""

    def __init__(
        self,
        backend: Backend,
        hz: float = 10.0,
        low_hz: float | None = None,
        align_timeout_s: float = 0.25,
        epoch: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        phase: str = "measure",
    ) -> None:
        """Configure (nothing starts yet).

        Args:
            backend: what to read.
            hz: samples per second inside energy windows (and always, when ``low_hz`` equals it).
            low_hz: samples per second outside windows; default ``max(1, hz / 10)`` capped at ``hz``.
            align_timeout_s: how long a window edge waits for the energy counter to tick (0: never).
            epoch: epoch-seconds clock (mark times).
            mono: monotonic clock (durations, pacing).
            sleep: used while waiting for a counter tick.
            phase: the phase label of the first samples.
        """
        if not hz > 0:
            raise ValueError(f"sample rate must be positive, got {hz!r}")
        self.backend = backend
        self.hz = float(hz)
        self.low_hz = min(self.hz, float(low_hz) if low_hz else max(1.0, self.hz / 10))
        self.align_timeout_s = align_timeout_s
        self.epoch, self.mono, self.sleep = epoch, mono, sleep
        self.phase = phase
        self.samples: list[tuple[str, TelemetrySample]] = []
        self.marks: list[EnergyMark] = []
        self.error: str | None = None
        self._rate = self.low_hz
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._open: tuple[float | None, float, float] | None = None  # (e0, t0 epoch, m0 mono)

    # --- the sampling thread --------------------------------------------------------------------
    def sample_once(self) -> TelemetrySample | None:
        """Take one sample now (tagged with the current phase); None after a backend failure."""
        if self.error is not None:
            return None
        phase = self.phase
        try:
            s = self.backend.read()
        except Exception as exc:  # noqa: BLE001 - a broken sensor must not break the measurement
            self.error = f"unavailable: telemetry read failed ({type(exc).__name__}: {exc})"
            self._stop.set()
            return None
        with self._lock:
            self.samples.append((phase, s))
        return s

    def _loop(self) -> None:
        next_t = self.mono() + 1.0 / self._rate
        while True:
            wait = next_t - self.mono()
            if wait > 0 and self._kick.wait(wait):  # a rate change or stop: reschedule, do not sample
                self._kick.clear()
                if self._stop.is_set():
                    break
                next_t = self.mono() + 1.0 / self._rate
                continue
            if self._stop.is_set():
                break
            self.sample_once()
            next_t += 1.0 / self._rate
            if next_t < self.mono():  # fell behind (a slow read): do not burst to catch up
                next_t = self.mono() + 1.0 / self._rate

    def start(self) -> Sampler:
        """Take one sample now (on this thread), then start the sampling thread."""
        if self._thread is None:
            self.sample_once()
            self._thread = threading.Thread(target=self._loop, name="deepgap-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> Sampler:
        """Stop the thread and take a last sample, so the end of the measurement is covered."""
        if self._thread is not None:
            self._stop.set()
            self._kick.set()
            self._thread.join(_STOP_JOIN_S)
            if self._thread.is_alive() and self.error is None:
                self.error = f"unavailable: telemetry thread did not stop within {_STOP_JOIN_S:.0f} s"
            self._thread = None
            self._stop.clear()
            self._kick.clear()
            if self.error is None:
                self.sample_once()
        return self

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_rate(self, hz: float) -> None:
        """Change the sampling rate; the next sample comes one new period from now."""
        self._rate = float(hz)
        self._kick.set()

    def snapshot(self) -> list[tuple[str, TelemetrySample]]:
        """A copy of the samples so far (safe while the thread runs)."""
        with self._lock:
            return list(self.samples)

    # --- energy windows (caller's thread) ----------------------------------------------------------
    def _energy(self) -> float | None:
        try:
            return self.backend.read_energy_j()
        except Exception as exc:  # noqa: BLE001
            self.error = self.error or f"unavailable: energy read failed ({type(exc).__name__}: {exc})"
            return None

    def _tick_read(self) -> tuple[float | None, float, float]:
        """(counter, epoch s, monotonic s) right after the counter's next tick (or the timeout)."""
        e = self._energy()
        deadline = self.mono() + (self.align_timeout_s if e is not None else 0.0)
        while e is not None and self.mono() < deadline:
            self.sleep(0.001)
            e2 = self._energy()
            if e2 is None or e2 != e:
                e = e2
                break
        return e, self.epoch(), self.mono()

    def begin_window(self) -> None:
        """Right before an energy window: fresh counter reading, then the full sampling rate.

        No sample is taken here: it would either fall outside the window or, taken inside it, cost
        the timed work a sensor read; the thread's first sample comes one period into the window.
        """
        self._open = self._tick_read()
        self.set_rate(self.hz)

    def end_window(self, images: int) -> None:
        """Right after the window (the device synchronized): one sample, the counter, then the low rate.

        The sample is inside the window's time span and reads the driver's averaged power and the
        utilization since the previous sample, which both describe the window just finished.
        """
        m_end = self.mono()
        self.sample_once()
        e1, t1, m1 = self._tick_read()
        if self._open is not None:
            e0, t0, m0 = self._open
            self.marks.append(EnergyMark(t0, t1, m1 - m0, m1 - m_end, e0, e1, int(images)))
        self._open = None
        self.set_rate(self.low_hz)


class MarkingClock:
    """Wraps a `deepgap.measure.timing.Clock` to tell the sampler where the protocol is.

    ``run_protocol`` calls ``time_iteration`` only after its warm-up, so the first call ends the
    ``warmup`` phase; every ``time_window`` call is one energy window. The counter is read outside
    the timed region: before the inner clock's start synchronization, after its end synchronization.
    """

    def __init__(self, clock: Any, sampler: Sampler, batch_size: int) -> None:
        self.clock = clock
        self.sampler = sampler
        self.batch_size = batch_size

    def time_iteration(self, step: Callable[[], object]) -> float:  # noqa: D102
        if self.sampler.phase == "warmup":
            self.sampler.phase = "measure"
        return self.clock.time_iteration(step)

    def time_window(self, step: Callable[[], object], n: int) -> float:  # noqa: D102
        self.sampler.phase = "measure"
        self.sampler.begin_window()
        try:
            return self.clock.time_window(step, n)
        finally:
            self.sampler.end_window(n * self.batch_size)
