"""The progress event every driver emits and every display reads.

Why in ``core``: the drivers (``run``), the fleet, serving and the commands all send or print it; defined
beside the runner it made the progress display and the features point back up into the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgap.core.records import ConfigSpec, Result


@dataclass
class Event:
    """Progress event for displays: a configuration finished (``result``) or is starting."""

    index: int
    total: int
    spec: ConfigSpec
    result: Result | None = None
