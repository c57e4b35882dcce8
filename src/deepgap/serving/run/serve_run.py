"""``deepgap serve`` as a run: validate, then one model's scenario or the tenants, through the one driver.

Why a job of the one driver (`deepgap.drive.loop.drive`) like every other kind: the run row, the
run-level prelude, the final status and an interruption are handled once for all kinds. What is serve's
own is data and two callbacks: the launcher is the first model's (or first tenant's) serving worker
(`deepgap.serving.run.process.ServingWorker`), the prelude's settings come from the served configuration as a
sweep spec (`deepgap.serving.run.rows.serve_sweep`), the loop's one outcome is the whole serve run
(`Served`: its rows and its headline numbers, from `deepgap.serving.run.scenarios` or
`deepgap.serving.run.tenants`), and recording it writes every level in one transaction
(`deepgap.serving.records.storage.record`). So an interrupted serve keeps its run row (``interrupted``),
prelude and every level that finished before the stop (a capacity search's probes so far: each one a
whole measurement), never a half-served level; a worker that never started stores its failed set-up,
the run opened then with what is known of the device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

from deepgap.drive.launcher import Finished
from deepgap.drive.loop import Job, Plan, Resumed, drive
from deepgap.drive.session import SERVE, RunSession, resolve_device
from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.prelude import warmup_configs
from deepgap.serving.run.process import ServingWorker
from deepgap.serving.run.rows import (
    Say,
    ServeOutcome,
    one_model_run,
    run_spec,
    serve_sweep,
    setup_request,
    stderr_say,
)
from deepgap.serving.run.spec import ServeSpec


@dataclass
class Served:
    """The one outcome of a serve run: the rows to store and what the command prints."""

    rec: ServeRecord
    out: ServeOutcome


def plan(spec: ServeSpec, store_path: str, say: Say, command: str, resumed: Resumed | None = None) -> Plan:
    """Validate ``spec`` (nothing is written when the input is bad) and plan its run."""
    from deepgap.serving.run.spec import validate
    from deepgap.serving.sim import arrivals as arr
    from deepgap.store import check_path

    spec = validate(spec)
    device = resolve_device(spec.device)
    check_path(store_path)
    trace = arr.load_trace(spec.trace) if spec.trace else None
    models = [n for n, _ in spec.tenants] if spec.tenants else [spec.model]
    if spec.tenants:
        from deepgap.serving.run.tenants import tenant_request

        first = tenant_request(spec, 0, device)
    else:
        first = setup_request(spec, spec.model, device)
    sweep = serve_sweep(spec, device, models)
    worker = ServingWorker(device, models[0], spec.timeout_s, sweep)

    def served(w: ServingWorker) -> tuple[ServeRecord, ServeOutcome]:
        if spec.tenants:
            from deepgap.serving.run.tenants import run_tenants

            return run_tenants(spec, device, store_path, say, w, command)
        if first.cache_len:  # a decoder: continuous batching (`deepgap.serving.run.llm_run`)
            from deepgap.serving.run.llm_run import llm_serving as serving
        else:
            from deepgap.serving.run.scenarios import model_serving as serving
        one = serving(spec, device, trace, say, w, first)
        return one_model_run(spec, device, store_path, say, w, first, command, one)

    def steps(w: ServingWorker) -> Iterator[Finished[Served]]:
        try:
            rec, out = served(w)
        except KeyboardInterrupt as exc:  # the levels finished before the stop are stored, then it goes on
            partial = getattr(exc, "partial", None)
            if partial is not None:
                partial.command = command
                yield Finished("", Served(partial, ServeOutcome(None, store_path, "interrupted")))
            raise
        rec.command = command
        yield Finished("", Served(rec, out))

    return Plan(
        launcher=worker,
        spec=run_spec(spec, device, models),
        sweep=sweep,
        steps=steps,
        total=1,
        warmup=warmup_configs(first),  # the first model's build: the thermal warm-up's load
        env_of=lambda item: item.result.rec.env,  # the worker never started: what is known of the device
    )


def record(session: RunSession, served: Served) -> None:
    """`deepgap.drive.loop.Job.record` of a serve run: every level, curve and capacity, in one transaction."""
    from deepgap.serving.records.storage import record as store_rows

    assert session.store is not None and session.run_id is not None
    store_rows(session.store, session.run_id, served.rec)


def run_serve(
    spec: ServeSpec, store_path: str, say: Say = stderr_say, command: str | None = None
) -> ServeOutcome:
    """Validate, run ``spec`` and store it as a ``serve`` run (nothing is written when the input is bad).

    The levels are recorded at the end, then the run is finished (``interrupted`` when the body raised).
    """
    command = command or " ".join(["deepgap", *sys.argv[1:]])
    job: Job[Served] = Job(
        kind=SERVE,
        store=store_path,
        command=command,
        plan=lambda resumed: plan(spec, store_path, say, command, resumed),
        record=record,
        log=lambda m: say(f"serve: {m}"),
        status=lambda outcomes: outcomes[-1].rec.status if outcomes else None,
    )
    done = drive(job)
    out = done.outcomes[-1].out
    out.run_id = done.run_id
    return out
