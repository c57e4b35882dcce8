"""The run-level prelude of ``deepgap serve``: the idle baseline and thermal warm-up of ``deepgap run``.

Why: every kind of run gets them through the one run session (`deepgap.drive.session.RunSession.prelude`,
`deepgap.drive.prelude`), so a serve run's power and clocks are read against the same baseline
and a thermal warm-up means the same thing as in a sweep. The serving worker is the measurement
worker, so it answers the ``idle`` and ``thermal`` requests as a sweep's worker does; the parent
never touches the device.

Order, and why: launch the worker → open the run with its fingerprint → idle baseline (nothing
built yet: the bare device) → thermal warm-up (the served model at its largest prepared batch up to
64) → build and calibrate → load levels. The service curve the simulator is fed and the levels are
then both measured on the warm device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.core.records import ConfigSpec
from deepgap.drive.runner import SweepRunner
from deepgap.serving.rows import Say, serve_sweep

if TYPE_CHECKING:
    from deepgap.drive.session import RunSession
    from deepgap.serving.process import ServingWorker, SetupRequest
    from deepgap.serving.spec import ServeSpec
    from deepgap.serving.storage import ServeRecord

ENV_TIMEOUT_S = 120.0


def begin_run(
    session: RunSession,
    worker: ServingWorker,
    spec: ServeSpec,
    req: SetupRequest,
    models: list[str],
    rec: ServeRecord,
    command: str,
    say: Say,
) -> dict[str, Any]:
    """Open the serve run with ``worker``'s fingerprint and measure the prelude in that worker.

    ``req``: the build request of the first model (the warm-up's load). Returns the prelude's
    summaries (``{"idle": ..., "thermal": ...}``), stored as the run's run-level telemetry.

    Raises:
        SetupFailed: the worker could not give its fingerprint (nothing is opened then).
    """
    rec.env = worker.environment(ENV_TIMEOUT_S)
    session.open(rec.spec, command, rec.env)
    sweep = serve_sweep(spec, req.device, models)
    runner = SweepRunner(sweep, req.device)
    runner.worker = worker  # the serving worker answers ``idle`` and ``thermal`` as any measurement worker
    configs = [
        ConfigSpec(
            model=req.model,
            engine=req.engine,
            precision=req.precision,
            batch_size=b,
            device=req.device,
            memory_format=req.memory_format,
            threads=req.threads,
            resolution=req.resolution,
        )
        for b in req.buckets
    ]
    return session.prelude(runner, sweep, configs, lambda m: say(f"serve: {m}"))
