"""The parent side of a sweep: plans, hands configurations to a worker, survives its failures, stores.

The parent never imports a model or touches the GPU: a crash, a hang (killed after ``timeout_s``),
a sticky CUDA error or an OOM in the worker costs that configuration only. After an OOM the larger
batches of the same group are stored as skipped, with the reason (never silently dropped, never
silently shrunk as timm's script does).

`SweepRunner` is the one-device `deepgap.drive.launcher.Launcher` (and the prelude's `Device`): the one
driver (`deepgap.drive.loop.drive`) starts it, asks its fingerprint, hands it to the run session for the
prelude, and pulls `Started`/`Finished` items from `SweepRunner.results`. It talks to its worker through
`deepgap.drive.handle.WorkerHandle` (the process itself).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from deepgap.core.events import Event
from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.drive.config import SweepSpec
from deepgap.drive.handle import START_TIMEOUT_S, CallProtocol, WorkerFailed, WorkerHandle, WorkerLost
from deepgap.drive.launcher import Finished, PreludeMeasure, Started
from deepgap.measure.protocol import MeasureRequest
from deepgap.measure.telemetry.settings import TelemetrySettings, settings_for
from deepgap.measure.timing import TimingProtocol


def protocol_for(spec: SweepSpec) -> TimingProtocol:
    """The timing protocol of a sweep."""
    return TimingProtocol(
        warmup=spec.warmup,
        iterations=spec.iterations,
        repeats=spec.repeats,
        target_ci=spec.target_ci,
        max_time_s=spec.max_time_s,
        min_time_s=spec.min_time_s,
    )


class Cascade:
    """The OOM/hang cascade, in one place.

    After a batch of a group ran out of memory or hung, the larger batches of the same group are
    skipped with that reason (never silently dropped, never silently shrunk).
    """

    def __init__(self) -> None:
        self.failed_at: dict[Any, str] = {}

    def skip_reason(self, group: Any) -> str | None:
        """Why ``group``'s next configuration is skipped, or None to measure it."""
        return self.failed_at.get(group)

    def note(self, group: Any, batch_size: int, status: Status | str) -> None:
        """Remember an OOM or a timeout of ``group`` at ``batch_size``."""
        why = cascade_reason(batch_size, status)
        if why:
            self.failed_at[group] = why


def cascade_reason(batch_size: int, status: Status | str) -> str | None:
    """Why the larger batches after ``batch_size`` are skipped (an OOM or a hang there), or None.

    The one wording of the cascade: one device's runner (`Cascade`), the profile run and the fleets'
    ladders (`deepgap.fleet.ray_backend`, whose batches run on other nodes) all skip with it.
    """
    status = Status(status)
    if status == Status.OOM:
        return f"batch {batch_size} of this configuration ran out of memory"
    if status == Status.TIMEOUT:
        return f"batch {batch_size} of this configuration hung past the timeout"
    return None


def needs_restart(status: Status | str, device: str) -> bool:
    """The CUDA-restart rule: an error or OOM can leave a GPU context unusable; a fresh worker is cheap."""
    return Status(status) in (Status.ERROR, Status.OOM) and device.startswith("cuda")


class SweepRunner:
    """Runs configurations through a worker, restarting it when it fails, and yields results.

    ``worker``: the handle to talk through instead of a new `WorkerHandle` — the serving worker's, so that
    its prelude runs in the process that serves (`serving.run.process.ServingWorker`), or an in-process
    one in tests (`deepgap.drive.inprocess.InProcessWorker`).
    """

    def __init__(self, spec: SweepSpec, device: str, worker: CallProtocol | None = None) -> None:
        self.spec = spec
        self.device = device
        self.worker: Any = worker if worker is not None else WorkerHandle(device)
        self.timing = protocol_for(spec)
        self.telemetry_context: dict[str, Any] = {}  # run-level facts (idle power, steady clock) for requests
        self._sweep: int | None = None  # the sweep pass the live worker measured

    def start(self) -> DeviceCaps:
        """Start the first worker; returns what it found about the device."""
        return self.worker.start()

    def environment(self) -> dict[str, Any]:
        """The worker's environment fingerprint."""
        return self.worker.call("env", None, START_TIMEOUT_S)

    def set_context(self, **facts: Any) -> None:
        """Add run-level facts (``idle_power_w``, ``ref_sm_clock_mhz``) that every later request carries."""
        self.telemetry_context.update(facts)

    def telemetry_settings(self, mode: str | None = None) -> TelemetrySettings | None:
        """The sweep's telemetry settings with the run-level facts so far (None: telemetry off)."""
        settings = settings_for(self.spec, self.telemetry_context)
        return dataclasses.replace(settings, mode=mode) if settings is not None and mode else settings

    def idle_baseline(self, settings: TelemetrySettings) -> dict[str, Any]:
        """The worker's idle baseline: ``{"summary": ..., "samples": [...]}``; a lost worker is a status."""
        try:
            return self.worker.call("idle", settings, settings.idle_s + 120.0)
        except (WorkerLost, WorkerFailed) as lost:
            return {"summary": {"status": f"unavailable: the worker was lost ({lost.reason})"}, "samples": []}

    def thermal_warmup(self, cfg: ConfigSpec, timeout_s: float) -> Result:
        """Load the device with ``cfg`` until its temperature is steady (telemetry mode ``thermal``)."""
        req = dataclasses.replace(self.request(cfg), telemetry=self.telemetry_settings(mode="thermal"))
        return self._call(req, "thermal", timeout_s + self.spec.timeout_s)

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """The run-level prelude on this runner's one device (`deepgap.drive.launcher.Launcher`)."""
        measure("", self, configs)

    def results(self, configs: Sequence[ConfigSpec]) -> Iterator[Started | Finished[Result]]:
        """Measure ``configs`` in order: `Started` before each, `Finished` after (OOM cascades as skipped)."""
        cascade = Cascade()
        for cfg in configs:
            yield Started("", cfg)
            why = cascade.skip_reason(cfg.group)
            if why is not None:
                res = Result(spec=cfg, status=Status.SKIPPED, reason=why)
            else:
                res = self._one(cfg)
                cascade.note(cfg.group, cfg.batch_size, res.status)
            yield Finished("", res)

    def run(
        self, configs: list[ConfigSpec], on_event: Callable[[Event], None] = lambda e: None
    ) -> Iterator[Result]:
        """`results` as `Result`s, with a progress `Event` before and after each configuration."""
        i = 0
        for item in self.results(configs):
            if isinstance(item, Started):
                on_event(Event(i, len(configs), item.cfg))
                continue
            on_event(Event(i, len(configs), item.result.spec, item.result))
            i += 1
            yield item.result

    def request(self, cfg: ConfigSpec) -> MeasureRequest:
        """What the worker is sent for ``cfg`` (public so a benchmark can measure exactly the same)."""
        return MeasureRequest(
            spec=cfg,
            protocol=self.timing,
            weights=self.spec.weights,
            seed=self.spec.seed,
            cudnn_benchmark=self.spec.cudnn_benchmark,
            options=dict(self.spec.options),
            telemetry=settings_for(self.spec, self.telemetry_context),
        )

    def _one(self, cfg: ConfigSpec) -> Result:
        if self._sweep is not None and cfg.sweep != self._sweep:
            # Each sweep in its own worker process: the between-sweep spread is then the spread between
            # processes that a user's next run will see, not repeats inside one (analysis.sweeps).
            self.restart()
        self._sweep = cfg.sweep
        return self._call(self.request(cfg), "measure", self.spec.timeout_s)

    def _call(self, req: MeasureRequest, kind: str, timeout_s: float) -> Result:
        """One measure-like request: a lost worker becomes the result's status; the CUDA-restart rule."""
        cfg = req.spec
        if not self.worker.alive():
            self.worker.start()
        t0 = time.time()
        try:
            res: Result = self.worker.call(kind, req, timeout_s)
        except (WorkerLost, WorkerFailed) as lost:
            return Result(
                spec=cfg, status=lost.status, reason=lost.reason, started_at=t0, duration_s=time.time() - t0
            )
        if needs_restart(res.status, cfg.device):
            self.restart()
        return res

    def call(self, kind: str, payload: Any, timeout_s: float) -> Any:
        """Any other worker request (``profile``, ``peaks``): a fresh worker is started if none runs.

        Raises `WorkerLost` or `WorkerFailed` as `WorkerHandle.call` does; apply `needs_restart` to the
        status of what comes back (and `restart` when it says so).
        """
        if not self.worker.alive():
            self.worker.start()
        return self.worker.call(kind, payload, timeout_s)

    def restart(self) -> None:
        """Stop the worker; the next request starts a fresh one (`needs_restart`, a new sweep pass)."""
        self.worker.stop()

    def close(self, wait: bool = True) -> None:
        """Stop the worker; ``wait=False`` kills it at once (its one job is done: a Ray task's)."""
        if wait:
            self.worker.stop()
        else:
            self.worker.kill()


def python_command() -> str:
    """The command line, for the run's record."""
    return " ".join(sys.argv)
