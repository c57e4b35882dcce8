"""The driver of a fleet sweep: plan, hand work to a backend, and be the store's only writer.

Same contract as the one-machine path in `deepgap.api.run`: bad input raises a `UsageError` before
anything is written; each finished configuration is committed in its own transaction as it
arrives, so killing the driver loses only what was in flight, and ``--resume`` (which finds the
fleet settings in the run's stored environment) measures the rest with no duplicates.

The run row is created when the first result arrives, with that device's fingerprint plus a
``fleet`` summary (backend, devices or Ray nodes, ``--where``); every result also carries its own
node's fingerprint in ``extra["node_env"]``, which `Store.results_frame` prefers for
``device_name`` and ``host``. The store side is a `deepgap.drive.session.RunSession`, as for every run.
Both backends give the run-level prelude (``prelude``, ``first_env``): the run row is then created
before the first result (with the first device's fingerprint), and every device — a local lane, or
a Ray actor per device of the matching nodes (`deepgap.fleet.ray_prelude`) — measures its own idle
baseline and thermal warm-up, at once, before the first configuration. A Ray cluster on which no
prelude actor could start runs without one (the run row then waits for the first result).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand
from deepgap.drive.runner import python_command
from deepgap.drive.session import FLEET, Results, RunSession, as_spec, open_resume
from deepgap.fleet.common import Finished, FleetEvent, Started
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
    from deepgap.fleet import ray_backend

    where = ray_backend.parse_where(where) if where else None
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


def _prepare(backend: Any, sweep: SweepSpec, resumed: bool) -> str:
    if hasattr(backend, "prepare"):
        return backend.prepare(sweep, resumed)
    from deepgap.fleet.devices import logical_device

    return logical_device(backend.lanes, sweep.device, resumed)


def run_env(backend: Any, first: dict[str, Any]) -> dict[str, Any]:
    """The run's fingerprint: the first result's node, plus the fleet summary."""
    env = {k: v for k, v in first.items() if k not in ("lane", "ray_node_id", "ray_gpu_ids")}
    names = sorted(set(backend.device_names()))
    if len(names) > 1:
        env["device_name"] = f"mixed ({', '.join(names)}): see each result's node_env"
    env["fleet"] = backend.describe()
    return env


class LaneRows:
    """The run-level rows one lane's prelude measured, kept until the driver's thread writes them.

    Why not a store connection per lane thread: opening a second `Store` on the file while the
    driver's is open reads the file's header with a plain ``open``/``close``, and closing any file
    descriptor of a file drops every POSIX lock this process holds on it, SQLite's included — another
    process's reader then deletes the write-ahead log the driver is still writing to (its rows vanish
    from readers, and from the file if the driver is killed). The driver's one connection writes.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, list[tuple[str, float, dict[str, Any]]]]] = []

    def record_run_telemetry(self, run_id: str, samples: list[tuple[str, float, dict[str, Any]]]) -> None:
        """Keep ``samples`` for `write`."""
        self.rows.append((run_id, list(samples)))

    def write(self, store: Any) -> None:
        """Store the kept rows through the driver's connection."""
        for run_id, samples in self.rows:
            store.record_run_telemetry(run_id, samples)
        self.rows = []


def _prelude(
    backend: Any, session: RunSession, sweep: SweepSpec, configs: list[ConfigSpec], log: Callable[[str], None]
) -> None:
    """Each lane's idle baseline and thermal warm-up, at once; stored by this thread when all are done."""
    lanes: list[LaneRows] = []

    def measure(lane: str, runner: Any, configs: list[ConfigSpec]) -> None:
        rows = LaneRows()
        lanes.append(rows)
        lane_session = RunSession(session.path, session.kind, rows)  # type: ignore[arg-type]
        lane_session.run_id = session.run_id
        lane_session.prelude(runner, sweep, configs, lambda m: log(f"{lane}: {m}"))

    try:
        backend.prelude(measure, configs)
    finally:
        for rows in lanes:
            rows.write(session.store)


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
    from deepgap.fleet import stored_fleet

    session = RunSession(store, FLEET)
    done: set[str] = set()
    run_id: str | None = None
    if resume:
        s, row = open_resume(store, resume)
        session.store = s
        stored = stored_fleet(store, resume)
        sweep = validate(SweepSpec.from_dict(row["spec"]))
        run_id = row["run_id"]
        done = s.done_keys(run_id)
    else:
        stored = None
        sweep = validate(as_spec(spec))
        check_path(store)
    options = {**(backend_options or {}), **({"every_card": True} if every_card else {})}
    backend = make_backend(sweep, devices, ray, where, stored, **options)
    try:
        session.close(discard_empty=False)  # reopened below, after the backend has checked everything
        logical = _prepare(backend, sweep, bool(resume))
        if not resume:
            sweep = validate(sweep.replace(device=logical))
        planned = expand(sweep, logical)
        if hasattr(backend, "plan_cards"):  # --every-card: each configuration once per card
            planned = backend.plan_cards(planned)
        configs = [c for c in planned if c.key not in done]
        backend.sweep = sweep
        backend.start()
        command = command or python_command()
        first = backend.first_env() if configs and hasattr(backend, "prelude") else None
        if run_id is not None:
            session.resume(run_id)
        elif first is not None:
            session.open(sweep.to_dict(), command, run_env(backend, first))
        out = Results(run_id=session.run_id or "", store_path=store)
        total, n = len(configs), 0
        with session:
            if first is not None:
                _prelude(backend, session, sweep, configs, log)
            for item in backend.results(configs):
                if isinstance(item, Started):
                    on_event(FleetEvent(n, total, item.cfg, lane=item.lane))
                    continue
                assert isinstance(item, Finished)
                if session.run_id is None:
                    env = run_env(backend, item.node_env or item.result.details.node_env or {})
                    out.run_id = session.open(sweep.to_dict(), command, env)
                res = item.result
                session.record(res)
                out.results.append(res)
                on_event(FleetEvent(n, total, res.spec, res, lane=item.lane))
                n += 1
        return out
    finally:
        backend.close()
        session.close()
