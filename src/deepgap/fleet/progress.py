"""Progress of a fleet sweep: one line for the whole sweep with its ETA, and one line per lane.

Each lane line (a node and device) says how many configurations it finished and what it measures now
(or measured last); the sweep line says how many are done of how many and when the whole sweep should
end. Finished configurations are printed above the display with their lane, as
`deepgap.drive.progress.Progress` does for one machine. Events without a lane (a plain `Event`) count
towards the sweep line only.

The ETA is the sweep's own pace, all lanes together: elapsed time / configurations finished × those
left (`sweep_eta_s`). Rich's per-task ETA cannot give it: a lane has no total of its own (lanes take
ladders from a shared queue), and the sweep's bar alone hid what each lane was doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from deepgap.core.events import Event
from deepgap.drive.progress import result_line


def sweep_eta_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds until the whole sweep ends at its pace so far (all lanes together); None before one ends."""
    if done <= 0 or total <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, elapsed_s / done * (total - done))


def duration_text(seconds: float | None) -> str:
    """``1h02m``, ``4m10s``, ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class FleetProgress:
    """Rich display for `deepgap.fleet.common.FleetEvent`; disabled it prints nothing.

    ``clock`` (seconds, monotonic) is injectable so tests can script the ETA.
    """

    def __init__(
        self, enabled: bool = True, console: Any = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = enabled
        self.console = console
        self.clock = clock
        self._bar: Any = None
        self._total_id: Any = None
        self._lanes: dict[str, Any] = {}
        self._done: dict[str, int] = {}
        self._now: dict[str, str] = {}
        self._t0 = 0.0
        self._n = 0
        self._total = 0

    def _start(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress
        from rich.progress import TextColumn

        self._t0 = self.clock()
        self._total = total
        self._bar = RichProgress(
            TextColumn("[bold]{task.fields[lane]}"),
            TextColumn("{task.description}"),
            console=self.console or Console(stderr=True),
            transient=False,
        )
        self._bar.start()
        self._total_id = self._bar.add_task(self.sweep_line(), total=total, lane="sweep")

    def sweep_line(self) -> str:
        """The whole sweep: done of total, elapsed, ETA."""
        elapsed = self.clock() - self._t0 if self._bar is not None else 0.0
        eta = sweep_eta_s(self._n, self._total, elapsed)
        return (
            f"{self._n}/{self._total} done over {len(self._lanes) or 1} lane(s), "
            f"{duration_text(elapsed)} elapsed, ETA {duration_text(eta)} for the whole sweep"
        )

    def lane_lines(self) -> dict[str, str]:
        """What each lane's line says now (for tests and plain logs)."""
        return {lane: f"{self._done[lane]} done, {self._now[lane]}" for lane in self._lanes}

    def on_event(self, ev: Event) -> None:
        """Runner/driver callback."""
        if not self.enabled:
            return
        if self._bar is None:
            self._start(ev.total)
        lane = getattr(ev, "lane", "") or ""
        if lane and lane not in self._lanes:
            self._lanes[lane] = self._bar.add_task("", total=None, lane=lane)
            self._done[lane] = 0
            self._now[lane] = "starting"
        if ev.result is None:
            if lane:
                self._now[lane] = f"measuring {ev.spec.label()}"
                self._bar.update(self._lanes[lane], description=self.lane_lines()[lane])
            return
        prefix = f"[{lane}] " if lane else ""
        self._bar.console.print(prefix + result_line(ev), highlight=False, markup=False)
        self._n += 1
        if lane:
            self._done[lane] += 1
            self._now[lane] = f"last: {ev.spec.label()} ({ev.result.status.value})"
            self._bar.update(self._lanes[lane], description=self.lane_lines()[lane])
        self._bar.update(self._total_id, completed=self._n, description=self.sweep_line())

    def close(self) -> None:
        """Stop the live display."""
        if self._bar is not None:
            self._bar.stop()
