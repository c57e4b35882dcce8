"""A fleet sweep as a job of the one driver: plan, hand work to a backend, and be the store's only writer.

Same contract as the one-machine path in `deepgap.api.run`, and the same driver
(`deepgap.drive.loop.drive`): bad input raises a `UsageError` before anything is written; each finished
configuration is committed in its own transaction as it arrives, so killing the driver loses only what
was in flight, and ``--resume`` (which finds the fleet settings in the run's stored environment) measures
the rest with no duplicates.

What is the fleet's own is the plan (`fleet_plan`): the backend is the launcher —
`deepgap.fleet.scheduler.LocalScheduler` (``--devices``) or `deepgap.fleet.ray_backend.RayBackend`
(``--ray``) — and its fingerprint is the first device's plus a ``fleet`` summary (backend, devices or Ray
nodes, ``--where``; `deepgap.fleet.common.run_env`). Every device — a local lane, or a Ray actor per
device of the matching nodes (`deepgap.fleet.ray_prelude`) — measures its own idle baseline and thermal
warm-up, at once, before the first configuration, through the run session as for one device. A Ray
cluster on which no prelude actor could start runs without one: the run row then waits for the first
result, with that node's fingerprint. Every result also carries its own node's fingerprint in
``extra["node_env"]``, which `Store.results_frame` prefers for ``device_name`` and ``host``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.records import Result
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.launcher import Started
from deepgap.drive.loop import EventSink, Item, Job, Plan, Resumed, drive, record_result
from deepgap.drive.plan import expand
from deepgap.drive.runner import python_command
from deepgap.drive.session import FLEET, Results, as_spec
from deepgap.fleet.common import FleetEvent, run_env
from deepgap.store import check_path


def make_backend(
    sweep: SweepSpec,
    devices: Any,
    ray: str | None,
    where: dict[str, str] | None,
    stored: dict[str, Any] | None,
    **kw: Any,
):
    """The backend for the flags given, else for the stored fleet settings of a resumed run."""
    from deepgap.fleet import ray_backend, ray_placement

    where = ray_placement.parse_where(where) if where else None
    if devices and ray:
        raise UsageError(
            "--devices and --ray both given", "use --devices on one host, or --ray for a cluster"
        )
    if stored and stored.get("every_card"):
        kw.setdefault("every_card", True)  # a resumed --every-card run keeps measuring on every card
    if kw.get("every_card") and (ray or (not devices and (stored or {}).get("backend") == "ray")):
        raise UsageError("--every-card measures on each GPU of this host", "use it with --devices, not --ray")
    if where and not (ray or (stored or {}).get("backend") == "ray"):
        raise UsageError("--where filters the nodes of a Ray cluster", "add --ray auto (or --ray ADDRESS)")
    if not devices and not ray and stored:
        if stored.get("backend") == "ray":
            ray = stored.get("ray") or "auto"
            where = where if where is not None else stored.get("where") or {}
        else:
            devices = stored.get("devices")
    if ray:
        return ray_backend.RayBackend(sweep, ray, where, **kw)
    from deepgap.fleet.devices import parse_devices
    from deepgap.fleet.scheduler import LocalScheduler

    lanes = parse_devices(devices)
    if (stored or {}).get("every_card") and [lane.name for lane in lanes] != stored.get("devices"):
        raise UsageError(
            f"this --every-card run measured on {','.join(stored.get('devices') or [])}; each card "
            "has its own sweep passes",
            "resume it with the same --devices (or none)",
        )
    return LocalScheduler(sweep, lanes, **kw)


def fleet_events(on_event: Callable[[Event], None]) -> EventSink:
    """`Job.event` of a fleet: a `FleetEvent` (an `Event` with its ``lane``) before and after each one."""

    def sink(n: int, total: int, item: Item) -> None:
        if isinstance(item, Started):
            on_event(FleetEvent(n, total, item.cfg, lane=item.lane))
        else:
            on_event(FleetEvent(n, total, item.result.spec, item.result, lane=item.lane))

    return sink


def fleet_plan(
    spec: SweepSpec | dict[str, Any] | str | None,
    store: str,
    resumed: Resumed | None,
    devices: str | list[str] | None = None,
    ray: str | None = None,
    where: dict[str, str] | list[str] | None = None,
    options: dict[str, Any] | None = None,
) -> Plan[Any]:
    """A fleet sweep's plan: validated input, the backend (checked against the devices or the cluster)."""
    if resumed is not None:
        fleet = resumed.row.get("env", {}).get("fleet")
        stored = fleet if isinstance(fleet, dict) else None
        sweep = validate(SweepSpec.from_dict(resumed.row["spec"]))
        done = resumed.done
    else:
        stored = None
        sweep = validate(as_spec(spec))
        check_path(store)
        done = set()
    backend = make_backend(sweep, devices, ray, where, stored, **(options or {}))
    try:
        logical = backend.prepare(sweep, resumed is not None)
        if resumed is None:
            sweep = validate(sweep.replace(device=logical))
        planned = backend.plan_cards(expand(sweep, logical))  # --every-card: each configuration per card
        configs = [c for c in planned if c.key not in done]
        backend.sweep = sweep
    except BaseException:
        backend.close()
        raise
    return Plan(
        launcher=backend,
        spec=sweep.to_dict(),
        sweep=sweep,
        steps=lambda b: b.results(configs),
        total=len(configs),
        warmup=configs,
        prelude=bool(configs),
        run_id=resumed.run_id if resumed is not None else None,
        env_of=lambda item: run_env(backend, item.node_env or item.result.details.node_env or {}),
    )


def run_fleet(
    spec: SweepSpec | dict[str, Any] | str | None,
    store: str,
    resume: str | bool | None = None,
    on_event: Callable[[Event], None] = lambda e: None,
    command: str | None = None,
    devices: str | list[str] | None = None,
    ray: str | None = None,
    where: dict[str, str] | list[str] | None = None,
    backend_options: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda m: None,
    every_card: bool = False,
) -> Results:
    """Measure a sweep over several devices (``devices``) or a Ray cluster (``ray``) into ``store``.

    Args:
        spec: as for `deepgap.api.run`.
        store: the SQLite store; only this process writes it.
        resume: True or a run id: continue that run, with its stored fleet settings unless
            ``devices``/``ray``/``where`` are given again.
        on_event: receives `FleetEvent` (an `Event` with ``lane``) before and after configurations.
        command: the command line, for the run's record.
        devices: ``"all"``, ``"cuda:0,cuda:1"`` or a list of names (`deepgap.fleet.devices`).
        ray: ``auto``, ``local`` or a cluster address.
        where: ``{"gpu": "L4"}`` or ``["gpu=L4"]``: only nodes that match.
        backend_options: extra keyword arguments for the backend (tests: ``runner_factory``,
            ``retries``, ``infeasible_grace_s``).
        log: one-line messages about the run-level telemetry (idle baseline, thermal warm-up).
        every_card: measure every configuration on every device of ``devices`` (the card-to-card
            spread, `deepgap.fleet.scheduler`); a resumed run keeps its stored setting.
    """
    options = {**(backend_options or {}), **({"every_card": True} if every_card else {})}
    job: Job[Result] = Job(
        kind=FLEET,
        store=store,
        command=command or python_command(),
        plan=lambda resumed: fleet_plan(spec, store, resumed, devices, ray, where, options),
        record=record_result,
        resume=resume,
        event=fleet_events(on_event),
        log=log,
    )
    done = drive(job)
    return Results(run_id=done.run_id or "", store_path=store, results=done.outcomes)
