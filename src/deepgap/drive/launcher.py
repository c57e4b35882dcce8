"""What the one driver (`deepgap.drive.loop.drive`) and the run session need from whatever starts workers.

Why a protocol: four things start and supervise measuring processes — `deepgap.drive.runner.SweepRunner`
(one worker on one device), `deepgap.fleet.scheduler.LocalScheduler` (one per GPU of ``--devices``),
`deepgap.fleet.ray_backend.RayBackend` (Ray tasks, and prelude actors) and
`deepgap.serving.run.process.ServingWorker` (the serving worker). The driver used to be written once per
kind, each time against another object's private shape (a fleet's ``hasattr(backend, "prelude")``,
serve swapping a runner's worker, profile stopping ``runner.worker``). A `Launcher` is the whole
contract between them and the driver:

- `Launcher.start` starts the workers; it raises a `deepgap.core.errors.UsageError` when the run cannot
  begin (a device that cannot be used: nothing is written then). A launcher whose failure to start is
  itself a result to store keeps it for its job instead (serve's failed set-up row);
- `Launcher.environment` gives the run's fingerprint, or None when it is known only with the first
  result (a Ray sweep without prelude actors; a serve whose worker did not start);
- `Launcher.prelude` hands each of its devices to the run session's ``measure`` callback, which measures
  the idle baseline and thermal warm-up there (`deepgap.drive.prelude.run_level`);
- `Launcher.restart` drops its live workers so that the next request gets fresh ones (after an error or
  OOM that can leave a CUDA context unusable, `deepgap.drive.runner.needs_restart`);
- `Launcher.close` stops everything it started.

A `Device` is one worker that owns one device, as the prelude talks to it: `SweepRunner` is one, and so is
a Ray prelude actor's driver-side handle (`deepgap.fleet.ray_prelude.ActorRunner`).

A launcher's loop yields `Started` and `Finished` items (``lane``: where it happened, ``""`` on one device);
the driver turns them into progress events and stored rows, in its own thread, the store's only writer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from deepgap.core.records import ConfigSpec, Result

if TYPE_CHECKING:
    from deepgap.measure.telemetry.settings import TelemetrySettings

T = TypeVar("T")  # what one measurement gives: a Result, a profile, a list of ceilings, a serve run


@dataclass
class Started:
    """``cfg`` began on ``lane``."""

    lane: str
    cfg: ConfigSpec


@dataclass
class Finished(Generic[T]):
    """``result`` was measured on ``lane`` (a sweep's ``result.spec`` is the logical configuration)."""

    lane: str
    result: T
    node_env: dict[str, Any] = field(default_factory=dict)


class Device(Protocol):
    """One worker on one device, as the run-level prelude talks to it (`deepgap.drive.prelude.run_level`)."""

    def telemetry_settings(self, mode: str | None = None) -> TelemetrySettings | None:
        """The run's telemetry settings with the facts learnt so far (None: telemetry is off)."""
        ...

    def idle_baseline(self, settings: TelemetrySettings) -> dict[str, Any]:
        """``{"summary": ..., "samples": [...]}``; a lost worker is a status in the summary."""
        ...

    def thermal_warmup(self, cfg: ConfigSpec, timeout_s: float) -> Result:
        """Load the device with ``cfg`` until its temperature is steady."""
        ...

    def set_context(self, **facts: Any) -> None:
        """Run-level facts (idle power, steady SM clock) for every later request."""
        ...


# The run session's callback: measure the prelude of ``lane``'s device for these configurations.
PreludeMeasure = Callable[[str, Device, Sequence[ConfigSpec]], None]


class Launcher(Protocol):
    """What starts and supervises a run's workers (see the module docstring)."""

    def start(self) -> object:
        """Start the workers; a `UsageError` when the run cannot begin (nothing is written then)."""
        ...

    def environment(self) -> dict[str, Any] | None:
        """The run's fingerprint, or None when only the first result will tell it."""
        ...

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """``measure(lane, device, configs)`` for each of its devices (at once where there are several)."""
        ...

    def restart(self) -> None:
        """Stop the live workers; the next request starts fresh ones."""
        ...

    def close(self) -> None:
        """Stop every worker this launcher started."""
        ...
