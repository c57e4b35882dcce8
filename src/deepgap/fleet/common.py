"""What both fleet backends hand the driver, and the batch-ladder policy they share.

A backend is a `deepgap.drive.launcher.Launcher` whose loop yields `Started` and `Finished` items
(defined there, for every launcher); only the driver (`deepgap.drive.loop.drive`) writes the store.
Work is cut into *ladders*: the configurations of one `ConfigSpec.group` (everything but the batch
size) in ascending batch order. A ladder runs in order on one device so that an
out-of-memory or a hang at batch B skips the larger batches of the same group, exactly as on one
machine (`deepgap.drive.runner.SweepRunner.run`); different ladders run in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec
from deepgap.drive.launcher import Finished, Started

__all__ = ["Finished", "FleetEvent", "Started", "ladders", "run_env", "short_env"]


@dataclass
class FleetEvent(Event):
    """A progress event that also says where (``lane``: node and device) it happened."""

    lane: str = ""


def ladders(configs: list[ConfigSpec]) -> list[list[ConfigSpec]]:
    """Configurations grouped into batch ladders, ladders in plan order, each in plan order."""
    out: dict[tuple[Any, ...], list[ConfigSpec]] = {}
    for cfg in configs:
        out.setdefault(cfg.group, []).append(cfg)
    return list(out.values())


def short_env(env: dict[str, Any]) -> dict[str, Any]:
    """The few fingerprint fields a run-level fleet summary lists per device."""
    keys = ("host", "device", "device_name", "gpu_uuid", "driver", "torch", "deepgap")
    return {k: env[k] for k in keys if k in env}


class Described(Protocol):
    """What `run_env` reads of a backend."""

    def device_names(self) -> list[str]: ...  # noqa: D102

    def describe(self) -> dict[str, Any]: ...  # noqa: D102


def run_env(backend: Described, first: dict[str, Any]) -> dict[str, Any]:
    """The run's fingerprint: the first device's (or first result's node's), plus the fleet summary."""
    env = {k: v for k, v in first.items() if k not in ("lane", "ray_node_id", "ray_gpu_ids")}
    names = sorted(set(backend.device_names()))
    if len(names) > 1:
        env["device_name"] = f"mixed ({', '.join(names)}): see each result's node_env"
    env["fleet"] = backend.describe()
    return env
