"""Progress lines that a long worker request says while it runs, so that a silent minute has a name.

Why: a decoder's serve set-up builds, compiles, checks and calibrates for minutes before it replies. With
nothing said, a stall and slow work look the same from the parent (session 50 spent device time telling
them apart). The worker says each phase as it ends (`say`). The worker loop forwards each line to the
parent as a ``("progress", line)`` message (`deepgap.measure.worker.serve`), and the parent's handle
passes it to its ``on_progress`` while it waits for the reply (`deepgap.drive.handle.WorkerHandle.recv`;
`show` unless the caller says otherwise). The in-process launcher passes it at once. Outside a sink (a
plain function call, a test), `say` does nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_sink: Callable[[str], None] | None = None


def say(line: str) -> None:
    """Pass ``line`` to the current sink (the parent's console), if any."""
    if _sink is not None:
        _sink(line)


@contextmanager
def sink(fn: Callable[[str], None]) -> Iterator[None]:
    """Send `say`'s lines to ``fn`` within the block (one request's handler)."""
    global _sink
    before, _sink = _sink, fn
    try:
        yield
    finally:
        _sink = before


def show(line: str) -> None:
    """A worker's progress line on the parent's console (stderr, as a command's own progress), at once.

    The default of a handle's ``on_progress``; a command that says its progress its own way (or not at all:
    ``--json``, ``--quiet``) sets that instead.
    """
    print(line, file=sys.stderr, flush=True)


class Phases:
    """A long request's phases: each one's seconds, said as it ends (`say`) and kept (``seconds``).

    ``tick`` says a step within a phase only where ``quiet_s`` passed since the last line said, so that a
    fast loop stays silent and a slow one still shows where it is.
    """

    def __init__(self, prefix: str, quiet_s: float = 10.0, clock: Callable[[], float] | None = None) -> None:
        self.prefix, self.quiet_s = prefix, quiet_s
        self.clock = clock or time.perf_counter
        self.start = self.said = self.clock()
        self.seconds: dict[str, float] = {}

    def done(self, name: str, words: str = "") -> None:
        """Phase ``name`` ended: its seconds kept, and said (``words`` after them)."""
        now = self.clock()
        self.seconds[name] = round(now - self.start, 3)
        self.start = self.said = now
        say(f"{self.prefix}{name} in {self.seconds[name]:.1f} s{words}")

    def tick(self, words: str) -> None:
        """A step of the phase under way, said where ``quiet_s`` passed since the last line."""
        now = self.clock()
        if now - self.said >= self.quiet_s:
            self.said = now
            say(f"{self.prefix}{words} ({now - self.start:.0f} s into the phase)")
