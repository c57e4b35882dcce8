"""A fleet sweep as a job of the one driver: plan, hand work to a backend, and be the store's only writer.

Same contract as the one-machine path, the same plan (`deepgap.drive.sweep.sweep_plan`) and driver
(`deepgap.drive.loop.drive`): bad input raises a `UsageError` before anything is written; each finished
configuration is committed in its own transaction as it arrives, so killing the driver loses only what
was in flight, and ``--resume`` (which finds the fleet settings in the run's stored environment) measures
the rest with no duplicates.

What is the fleet's own is the launcher in the sweep's one plan (`fleet_launch`): the backend —
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
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.launcher import Started
from deepgap.drive.loop import EventSink, Item, Plan, Resumed
from deepgap.drive.plan import expand
from deepgap.drive.runner import python_command
from deepgap.drive.session import FLEET, Results, as_spec
from deepgap.drive.sweep import Launch, run_sweep
from deepgap.fleet.common import FleetEvent, run_env


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


@dataclass(frozen=True)
class Fleet:
    """Where a fleet sweep runs: this host's GPUs (``devices``) or a Ray cluster (``ray``, ``where``).

    All unset: a resumed run's stored settings. The launcher choice of the sweep's one plan (`fleet_launch`).
    """

    devices: str | list[str] | None = (
        None  # "all", "cuda:0,cuda:1" or a list of names (`deepgap.fleet.devices`)
    )
    ray: str | None = None  # auto, local or a cluster address
    where: dict[str, str] | list[str] | None = None  # {"gpu": "L4"} or ["gpu=L4"]: only nodes that match
    every_card: bool = False  # every configuration on every device: the card-to-card spread (`scheduler`)
    backend_options: dict[str, Any] = field(default_factory=dict)  # tests: runner_factory, retries …


def fleet_launch(fleet: Fleet) -> Launch:
    """The fleet as the sweep's launcher (`deepgap.drive.sweep.Launch`): the backend and the plan on it."""

    def plan(sweep: SweepSpec, resumed: Resumed | None, done: set[str]) -> Plan[Any]:
        saved = resumed.row.get("env", {}).get("fleet") if resumed is not None else None
        stored = saved if isinstance(saved, dict) else None
        options = {**fleet.backend_options, **({"every_card": True} if fleet.every_card else {})}
        backend = make_backend(sweep, fleet.devices, fleet.ray, fleet.where, stored, **options)
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
            spec=sweep,
            sweep=sweep,
            steps=lambda b: b.results(configs),
            total=len(configs),
            warmup=configs,
            prelude=bool(configs),
            run_id=resumed.run_id if resumed is not None else None,
            env_of=lambda item: run_env(backend, item.node_env or item.result.details.node_env or {}),
        )

    return plan


def run_fleet(
    spec: SweepSpec | dict[str, Any] | str | None,
    store: str,
    fleet: Fleet,
    resume: str | bool | None = None,
    on_event: Callable[[Event], None] = lambda e: None,
    command: str | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> Results:
    """Measure a sweep over several devices or a Ray cluster (``fleet``) into ``store``.

    Args:
        spec: as for `deepgap.api.run`; a new run leaves the host CPU out (``cpu_baseline``): a fleet's
            lanes are GPUs, and the host CPU is measured by a one-device run only.
        store: the SQLite store; only this process writes it.
        fleet: where it runs; a resumed run keeps its stored fleet settings unless ``devices``/``ray``/
            ``where`` are given again, and its stored ``every_card``.
        resume: True or a run id: continue that run.
        on_event: receives `FleetEvent` (an `Event` with ``lane``) before and after configurations.
        command: the command line, for the run's record.
        log: one-line messages about the run-level telemetry (idle baseline, thermal warm-up).
    """
    command = command or python_command()
    if not resume:  # a fleet's lanes are GPUs: its host CPU is measured by a one-device run only
        spec = as_spec(spec).replace(cpu_baseline=False)
    return run_sweep(
        spec, store, resume, on_event, command, log, fleet_launch(fleet), FLEET, fleet_events(on_event)
    )
