"""The Python API and the one code path behind ``deepgap run``: validate → plan → measure → store.

The store side (run row, idle baseline and thermal prelude, results, final status) is a
`deepgap.session.RunSession`, the same for every kind of run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from deepgap.config import SweepSpec, validate
from deepgap.errors import UsageError
from deepgap.plan import expand
from deepgap.runner import Event, SweepRunner, python_command
from deepgap.session import (  # noqa: F401 - re-exported: the public names of the API
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
        raise UsageError("--every-card measures each configuration on every GPU of --devices",
                         "add --devices all (or a list such as cuda:0,cuda:1)")
    if devices or ray or where or (resume and stored_fleet(store, resume)):
        from deepgap.fleet.session import run_fleet

        return run_fleet(spec, store, resume, on_event, command, devices=devices, ray=ray, where=where,
                         log=log, every_card=every_card)
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
        check_path(store)
        run_id = None
        done = set()
    configs = [c for c in expand(sweep, device) if c.key not in done]
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
            for res in runner.run(configs, on_event):
                session.record(res)
                out.results.append(res)
        return out
    finally:
        runner.close()
        session.close()
