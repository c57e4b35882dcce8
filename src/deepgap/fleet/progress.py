"""Progress of a fleet sweep: one overall bar, and one line per node and device (a *lane*).

Each lane line says what the lane is measuring now (or measured last) and how many configurations
it finished; finished configurations are printed above the display with their lane, as
`deepgap.progress.Progress` does for one machine. Events without a lane (a plain `Event`) count
towards the overall bar only.
"""

from __future__ import annotations

from typing import Any

from deepgap.progress import result_line
from deepgap.runner import Event


class FleetProgress:
    """Rich display for `deepgap.fleet.common.FleetEvent`; disabled it prints nothing."""

    def __init__(self, enabled: bool = True, console: Any = None) -> None:
        self.enabled = enabled
        self.console = console
        self._bar: Any = None
        self._total: Any = None
        self._lanes: dict[str, Any] = {}
        self._done: dict[str, int] = {}

    def _start(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            TextColumn("[bold]{task.fields[lane]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.description}"),
            console=self.console or Console(stderr=True), transient=False,
        )
        self._bar.start()
        self._total = self._bar.add_task("", total=total, lane="all devices")

    def lane_lines(self) -> dict[str, str]:
        """What each lane's line says now (for tests and plain logs)."""
        if self._bar is None:
            return {}
        tasks = {t.id: t for t in self._bar.tasks}
        return {lane: f"{self._done[lane]} done, {tasks[tid].description}" for lane, tid in self._lanes.items()}

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
        if ev.result is None:
            if lane:
                self._bar.update(self._lanes[lane], description=f"measuring {ev.spec.label()}")
            return
        prefix = f"[{lane}] " if lane else ""
        self._bar.console.print(prefix + result_line(ev), highlight=False, markup=False)
        self._bar.update(self._total, advance=1)
        if lane:
            self._done[lane] += 1
            self._bar.update(self._lanes[lane], completed=self._done[lane],
                             description=f"last: {ev.spec.label()} ({ev.result.status.value})")

    def close(self) -> None:
        """Stop the live display."""
        if self._bar is not None:
            self._bar.stop()
