"""The sweep, the main kind of run: its plan (the GPU part, then its host CPU's) and its job for `drive`.

Why a module of its own: the sweep is what `deepgap run` does; its plan was written in the public API
(`deepgap.api`) beside the other kinds' calls, and the fleet planned the same sweep again. `sweep_plan`
validates (a `UsageError` writes nothing), expands the grid and leaves out what a resumed run already
measured; `run_sweep` drives it. A fleet (``--devices``, ``--ray``) is a launcher choice inside this one
plan (`Launch`, `deepgap.fleet.launch.fleet_launch`), not a plan of its own.

A GPU sweep with ``cpu_baseline`` (the default GPU grid) measures its host CPU after the GPU part
(`host_cpu_results`): the GPU's worker is stopped first, so the GPU is idle, and a CPU worker of its own
measures `deepgap.drive.plan.host_cpu`'s configurations into the same run, inside the same `drive` loop.
Each of those results carries the CPU worker's environment fingerprint (``details.node_env``), so the
store reads them as a second device (platform = the CPU's name), as it reads a fleet lane's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec, Result
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.launcher import Finished, Started
from deepgap.drive.loop import EventSink, Item, Job, Plan, Resumed, drive, record_result, sweep_events
from deepgap.drive.plan import expand
from deepgap.drive.prepare import prepare_beside
from deepgap.drive.presets import cpu_baseline_spec
from deepgap.drive.runner import SweepRunner
from deepgap.drive.session import SWEEP, Results, as_spec, resolve_device
from deepgap.store import check_path

# Another launcher for a validated sweep (a fleet's: `deepgap.fleet.launch.fleet_launch`): the sweep,
# the resumed run (or None) and the keys it already holds in, the plan on that launcher out.
Launch = Callable[[SweepSpec, Resumed | None, set[str]], Plan[Any]]


def run_sweep(
    spec: SweepSpec | dict[str, Any] | str | None,
    store: str,
    resume: str | bool | None,
    on_event: Callable[[Event], None],
    command: str,
    log: Callable[[str], None] = lambda m: None,
    launch: Launch | None = None,
    kind: str = SWEEP,
    event: EventSink | None = None,
) -> Results:
    """Measure a sweep into ``store`` through the one driver: on one device (and its host CPU) or ``launch``'s."""
    job: Job[Result] = Job(
        kind=kind,
        store=store,
        command=command,
        plan=lambda resumed: sweep_plan(spec, store, resumed, log, launch),
        record=record_result,
        resume=resume,
        event=event or sweep_events(on_event),
        log=log,
    )
    done = drive(job)
    return Results(run_id=done.run_id or "", store_path=store, results=done.outcomes)


def sweep_plan(
    spec: SweepSpec | dict[str, Any] | str | None,
    store: str,
    resumed: Resumed | None,
    log: Callable[[str], None] = lambda m: None,
    launch: Launch | None = None,
) -> Plan[Any]:
    """A sweep's plan: validated (a `UsageError` writes nothing), on ``launch``'s launcher or on one device.

    On one device: its GPU part, then its host CPU's. A resumed run plans its stored spec without the keys
    already measured; with nothing left on its device it measures no prelude either.
    """
    sweep = validate(SweepSpec.from_dict(resumed.row["spec"]) if resumed else as_spec(spec))
    done = resumed.done if resumed is not None else set()
    if launch is not None:
        if resumed is None:
            check_path(store)
        return launch(sweep, resumed, done)
    device = resolve_device(sweep.device)
    if resumed is None:
        sweep = sweep.replace(device=device)
        if sweep.cpu_baseline and sweep.cpu_cores is None:  # stored, so a resume plans the same CPU grid
            sweep = sweep.replace(cpu_cores=os.cpu_count() or 1)
        check_path(store)
    planned = [c for c in expand(sweep, device) if c.key not in done]
    configs = [c for c in planned if c.device == device]
    host = [c for c in planned if c.device != device]  # the host CPU's part, after the GPU's

    def steps(runner: SweepRunner) -> Iterator[Item]:
        yield from runner.results(configs)
        if host:
            runner.close()  # the GPU's worker exits: the GPU is idle while the CPU is measured
            yield from host_cpu_results(sweep, host, log)

    return Plan(
        launcher=SweepRunner(sweep, device),
        spec=sweep,
        sweep=sweep,
        steps=steps,
        total=len(planned),
        warmup=configs,
        prelude=bool(configs),  # a resumed run with nothing left measures no prelude either
        run_id=resumed.run_id if resumed is not None else None,
        beside_prelude=(lambda: prepare_beside(host, lambda: _host_runner(sweep), log)) if host else None,
    )


def _host_runner(sweep: SweepSpec) -> SweepRunner:
    """A CPU `SweepRunner` with the host part's spec (`cpu_baseline_spec`), as `host_cpu_results` makes."""
    return SweepRunner(cpu_baseline_spec(sweep, os.cpu_count() or 1), "cpu")


def host_cpu_results(
    sweep: SweepSpec,
    configs: list[ConfigSpec],
    log: Callable[[str], None] = lambda m: None,
    runner: SweepRunner | None = None,
) -> Iterator[Started | Finished[Result]]:
    """Measure the host-CPU part of ``sweep`` (`deepgap.drive.plan.host_cpu`) in a CPU worker of its own.

    Each result carries the CPU worker's fingerprint in ``details.node_env`` (the store reads the CPU's
    name from there: a second device). ``runner``: a launcher to use instead of a new CPU `SweepRunner`.
    """
    runner = runner or _host_runner(sweep)
    log(
        f"host CPU baseline: {len(configs)} configuration(s) on the CPU ({runner.spec.cpu_cores} cores), "
        "GPU idle"
    )
    try:
        runner.start()
        env = runner.environment()
        for item in runner.results(configs):
            if isinstance(item, Finished):
                item.result.details.node_env = env
            yield item
    finally:
        runner.close()
