"""The messages between the parent and a worker process, and which worker module answers each kind.

Why a module of its own, free of torch: the parent builds requests and names their handlers, but never
imports the code that answers them (the first invariant: the parent never touches the GPU). A request
kind maps to the worker module whose `deepgap.measure.worker.handles` registers its handler; the parent
sends ``(kind, module, payload)`` and the worker process imports ``module`` itself
(`deepgap.measure.worker.serve`). Measuring's own kinds are registered here; a feature registers its
kinds beside its parent code (``serve.*`` in `deepgap.serving.run.process`, ``profile`` and ``peaks`` in
`deepgap.roofline.profile_run` and `deepgap.roofline.peaks_run`). import-linter's forbidden contract
(pyproject.toml) keeps every parent module from importing a worker module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepgap.core.records import ConfigSpec, Status
from deepgap.measure.telemetry.settings import TelemetrySettings
from deepgap.measure.timing import TimingProtocol

# The worker process's main loop, started by name so that the parent never imports it.
WORKER_MAIN = "deepgap.measure.worker:serve"

# Request kind → the worker module that registers its handler; a kind ending in "." covers a prefix.
WORKER_MODULES: dict[str, str] = {}


def register_worker_module(module: str, *kinds: str) -> None:
    """Say that worker module ``module`` (a dotted name, never imported here) answers ``kinds``."""
    for kind in kinds:
        WORKER_MODULES[kind] = module


def worker_module(kind: str) -> str:
    """The worker module answering ``kind``; a `ValueError` for a kind nobody registered."""
    if kind in WORKER_MODULES:
        return WORKER_MODULES[kind]
    for prefix, module in WORKER_MODULES.items():
        if prefix.endswith(".") and kind.startswith(prefix):
            return module
    raise ValueError(
        f"unknown worker request {kind!r} (known: {', '.join(sorted(WORKER_MODULES))}); "
        "register it with deepgap.measure.protocol.register_worker_module"
    )


register_worker_module("deepgap.measure.configuration", "measure", "thermal", "prepare")
register_worker_module("deepgap.measure.worker", "env", "idle")


@dataclass(frozen=True)
class MeasureRequest:
    """Everything the worker needs for one configuration."""

    spec: ConfigSpec
    protocol: TimingProtocol
    weights: str | None = None
    seed: int = 0
    cudnn_benchmark: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    telemetry: TelemetrySettings | None = None  # None: telemetry off (deepgap.measure.telemetry.settings)


class StatusError(Exception):
    """Raised by a handler that knows the status to report (e.g. skipped: the engine cannot run here)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
