"""The Python API and the one code path behind ``deepgap run``: validate → plan → measure → store.

The store side (run row, idle baseline and thermal prelude, results, final status) is a
`deepgap.drive.session.RunSession`, the same for every kind of run.

A GPU sweep with ``cpu_baseline`` (the default GPU grid) measures its host CPU after the GPU part
(`run_host_cpu`): the GPU's worker is stopped first, so the GPU is idle, and a CPU worker of its own
measures `deepgap.drive.plan.host_cpu`'s configurations into the same run. Each of those results carries the
CPU worker's environment fingerprint (``details.node_env``), so the store reads them as a second device
(platform = the CPU's name), as it reads a fleet lane's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.drive.config import SweepSpec, cpu_baseline_spec, validate
from deepgap.drive.plan import expand
from deepgap.drive.runner import SweepRunner, python_command
from deepgap.drive.session import (  # noqa: F401 - re-exported: the public names of the API
    SWEEP,
    Results,
    RunSession,
    as_spec,
    gpu_present,
    open_resume,
    resolve_device,
)
from deepgap.store import check_path

DEFAULT_STORE = os.path.join("deepgap-results", "store.sqlite")


def run(
    spec: SweepSpec | dict[str, Any] | str | None = None,
    store: str = DEFAULT_STORE,
    resume: str | bool | None = None,
    on_event: Callable[[Event], None] = lambda e: None,
    command: str | None = None,
    devices: str | list[str] | None = None,
    ray: str | None = None,
    where: dict[str, str] | list[str] | None = None,
    log: Callable[[str], None] = lambda m: None,
    every_card: bool = False,
) -> Results:
    """Measure a sweep into ``store``; ``resume`` (True or a run id) continues an unfinished run.

    ``devices`` (``"all"`` or ``["cuda:0", "cuda:1"]``) spreads the sweep over the GPUs of this host;
    ``ray`` (``"auto"``, ``"local"`` or an address) over a Ray cluster, ``where`` (``{"gpu": "L4"}``)
    picking its nodes. Both are in `deepgap.fleet`; a resumed fleet run keeps its stored settings.
    ``log`` receives one-line messages about run-level telemetry (idle baseline, thermal warm-up).
    ``every_card`` (with ``devices``) measures every configuration on every GPU: the card-to-card spread.
    """
    from deepgap.fleet import stored_fleet

    if every_card and not devices and not (resume and stored_fleet(store, resume)):
        raise UsageError(
            "--every-card measures each configuration on every GPU of --devices",
            "add --devices all (or a list such as cuda:0,cuda:1)",
        )
    if devices or ray or where or (resume and stored_fleet(store, resume)):
        from deepgap.fleet.session import run_fleet

        if not resume:  # a fleet's lanes are GPUs: its host CPU is measured by a one-device run only
            spec = as_spec(spec).replace(cpu_baseline=False)
        return run_fleet(
            spec,
            store,
            resume,
            on_event,
            command,
            devices=devices,
            ray=ray,
            where=where,
            log=log,
            every_card=every_card,
        )
    session = RunSession(store, SWEEP)
    if resume:
        s, run_row = open_resume(store, resume)
        session.store = s
        try:
            sweep = validate(SweepSpec.from_dict(run_row["spec"]))
            device = resolve_device(sweep.device)
            run_id = run_row["run_id"]
            done = s.done_keys(run_id)
        except BaseException:
            s.close()
            raise
    else:
        sweep = validate(as_spec(spec))
        device = resolve_device(sweep.device)
        sweep = sweep.replace(device=device)
        if sweep.cpu_baseline and sweep.cpu_cores is None:  # stored, so a resume plans the same CPU grid
            sweep = sweep.replace(cpu_cores=os.cpu_count() or 1)
        check_path(store)
        run_id = None
        done = set()
    planned = [c for c in expand(sweep, device) if c.key not in done]
    configs = [c for c in planned if c.device == device]
    host = [c for c in planned if c.device != device]  # the host CPU's part, after the GPU's
    runner = SweepRunner(sweep, device)
    try:
        runner.start()
        if run_id is None:
            session.open(sweep.to_dict(), command or python_command(), runner.environment())
        else:
            session.resume(run_id)
        out = Results(run_id=session.run_id or "", store_path=store)
        with session:
            if configs:  # a resumed run with nothing left measures no prelude either
                session.prelude(runner, sweep, configs, log)  # idle baseline, thermal warm-up
            total = len(configs) + len(host)
            for res in runner.run(configs, lambda e: on_event(Event(e.index, total, e.spec, e.result))):
                session.record(res)
                out.results.append(res)
            if host:
                runner.close()  # the GPU's worker exits: the GPU is idle while the CPU is measured
                out.results += run_host_cpu(session, sweep, host, on_event, len(configs), total, log)
        return out
    finally:
        runner.close()
        session.close()


def run_host_cpu(
    session: RunSession,
    sweep: SweepSpec,
    configs: list,
    on_event: Callable[[Event], None],
    offset: int = 0,
    total: int | None = None,
    log: Callable[[str], None] = lambda m: None,
    runner: SweepRunner | None = None,
) -> list:
    """Measure the host-CPU part of ``sweep`` (`deepgap.drive.plan.host_cpu`) in a CPU worker; record each result.

    ``runner``: a launcher to use instead of a new CPU `SweepRunner` (tests pass an in-process one).
    """
    cpu = cpu_baseline_spec(sweep, os.cpu_count() or 1)
    total = total if total is not None else offset + len(configs)
    runner = runner or SweepRunner(cpu, "cpu")
    log(f"host CPU baseline: {len(configs)} configuration(s) on the CPU ({cpu.cpu_cores} cores), GPU idle")
    out = []
    try:
        runner.start()
        env = runner.environment()
        for res in runner.run(configs, lambda e: on_event(Event(offset + e.index, total, e.spec, e.result))):
            res.details.node_env = env  # the store reads the CPU's name from here (a second device)
            session.record(res)
            out.append(res)
    finally:
        runner.close()
    return out
