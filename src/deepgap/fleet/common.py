"""What both fleet backends hand the driver, and the batch-ladder policy they share.

A backend yields `Started` and `Finished` items; only the driver (`deepgap.fleet.session`) writes
the store. Work is cut into *ladders*: the configurations of one `ConfigSpec.group` (everything
but the batch size) in ascending batch order. A ladder runs in order on one device so that an
out-of-memory or a hang at batch B skips the larger batches of the same group, exactly as on one
machine (`deepgap.drive.runner.SweepRunner.run`); different ladders run in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec, Result, Status


@dataclass
class FleetEvent(Event):
    """A progress event that also says where (``lane``: node and device) it happened."""

    lane: str = ""


@dataclass
class Started:
    """``cfg`` began on ``lane``."""

    lane: str
    cfg: ConfigSpec


@dataclass
class Finished:
    """``result`` (whose ``spec`` is the logical configuration) was measured on ``lane``."""

    lane: str
    result: Result
    node_env: dict[str, Any] = field(default_factory=dict)


def ladders(configs: list[ConfigSpec]) -> list[list[ConfigSpec]]:
    """Configurations grouped into batch ladders, ladders in plan order, each in plan order."""
    out: dict[tuple[Any, ...], list[ConfigSpec]] = {}
    for cfg in configs:
        out.setdefault(cfg.group, []).append(cfg)
    return list(out.values())


def cascade_reason(res: Result) -> str | None:
    """Why the larger batches of ``res``'s ladder are skipped, or None (same words as the runner)."""
    if res.status == Status.OOM:
        return f"batch {res.spec.batch_size} of this configuration ran out of memory"
    if res.status == Status.TIMEOUT:
        return f"batch {res.spec.batch_size} of this configuration hung past the timeout"
    return None


def short_env(env: dict[str, Any]) -> dict[str, Any]:
    """The few fingerprint fields a run-level fleet summary lists per device."""
    keys = ("host", "device", "device_name", "gpu_uuid", "driver", "torch", "deepgap")
    return {k: env[k] for k in keys if k in env}
