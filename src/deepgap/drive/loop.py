"""The one driver: resume → validate → open → prelude → loop → finish, for every kind of run.

Why one: ``deepgap.run`` on one device, a fleet sweep (``--devices``, ``--ray``), ``serve``, ``profile`` and
``peaks`` each repeated this skeleton, and each copy drifted (which ones measured a prelude, when the run
row was created, who closed what on a failure). `drive` is the skeleton once; a kind of run is a `Job`,
data plus small callbacks:

- `Job.plan` validates the input (a `UsageError` there writes nothing) and returns a `Plan`: the
  `deepgap.drive.launcher.Launcher`, the run row's spec, the prelude's settings and warm-up load, how many
  results to expect, and ``steps``, the launcher's loop as `Started`/`Finished` items. On ``resume`` it is
  handed the stored run (`Resumed`: its row and the keys already measured) instead;
- `Job.record` stores one outcome in the open session (a result, a profile, the ceilings, a serve run);
- `Job.event` turns the loop's items into progress events for the caller.

The order, and why: the launcher starts before the run row exists, so a device that cannot be used
writes nothing; the row is opened with the launcher's fingerprint (or, when the launcher knows it only
with its first result, with that result's: `Plan.env_of`); the prelude runs once the row exists, and only
when there is work left; every outcome is recorded as it arrives (killing the driver loses only what was
in flight). A body that raises leaves the run ``interrupted`` (`RunSession.__exit__`), which ``--resume``
continues for sweeps. The launcher is closed and the store released whatever happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from deepgap.core import switches
from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec
from deepgap.drive.config import SweepSpec
from deepgap.drive.launcher import Finished, Launcher, Started
from deepgap.drive.session import RunSession, open_resume
from deepgap.store import RESUMABLE

T = TypeVar("T")  # one outcome: a Result, a ProfileResult, a list of ceilings, a serve run
L = TypeVar("L", bound=Launcher)

Item = Started | Finished[Any]


class RunSpec(Protocol):
    """The run row's spec, typed: a kind's settings (`SweepSpec` for a sweep, a fleet and serve)."""

    device: str

    def to_dict(self) -> dict[str, Any]:
        """What the run row stores (JSON-able)."""
        ...


# The caller's view of the loop: (outcomes finished so far, outcomes expected, the item).
EventSink = Callable[[int, int, Item], None]


@dataclass(frozen=True)
class Resumed:
    """The unfinished run ``--resume`` continues: its stored row and the keys already measured."""

    row: dict[str, Any]
    done: set[str]

    @property
    def run_id(self) -> str:
        """The continued run's id."""
        return str(self.row["run_id"])


@dataclass
class Plan(Generic[L]):
    """What a validated job runs (see the module docstring)."""

    launcher: L
    spec: RunSpec  # the run row's spec
    sweep: SweepSpec  # the prelude's settings (idle time, thermal warm-up, telemetry)
    steps: Callable[[L], Iterator[Item]]  # the loop: what the launcher measures, as it finishes
    total: int = 0  # outcomes expected (progress events' total)
    warmup: Sequence[ConfigSpec] = ()  # the thermal warm-up's load (none: the idle baseline only)
    prelude: bool = True  # False: no prelude (a resumed run with nothing left; nothing to store)
    run_id: str | None = None  # the resumed run, reopened instead of a new one
    env_of: Callable[[Finished[Any]], dict[str, Any]] | None = None  # the env when the launcher had none
    # CPU work that may overlap the prelude (it times nothing on the CPU), done before the first step:
    # starts it and returns what `finish`es or `cancel`s it (`deepgap.drive.prepare`), or None
    beside_prelude: Callable[[], Any] | None = None


@dataclass
class Job(Generic[T]):
    """One kind of run, as `drive` needs it: the store, the command, the plan and how outcomes are kept."""

    kind: str  # the run's kind in the store (`deepgap.drive.session.SWEEP` …)
    store: str
    command: str
    plan: Callable[[Resumed | None], Plan[Any]]
    record: Callable[[RunSession, T], None]
    resume: str | bool | None = None  # True or a run id: continue that run (sweeps only)
    store_results: bool = True  # False: nothing is stored (``peaks --no-store``); the loop still runs
    event: EventSink = lambda n, total, item: None
    log: Callable[[str], None] = lambda m: None  # the prelude's one-line messages
    status: Callable[[list[T]], str | None] = lambda outcomes: None  # the final status (None: finished)


@dataclass
class Driven(Generic[T]):
    """What `drive` returns: the run (None when nothing was stored), its spec, fingerprint and outcomes."""

    run_id: str | None
    store_path: str
    spec: RunSpec
    env: dict[str, Any] = field(default_factory=dict)
    outcomes: list[T] = field(default_factory=list)


def _with_switches(env: dict[str, Any], set_switches: dict[str, str]) -> dict[str, Any]:
    """The run's environment with the DEEPGAP_* switches that are set (`deepgap.core.switches`), if any.

    Why stored: a switch changes what a row measures (a kernel path, a GELU form); the row's engine_info
    says what ran, and the run says what was asked. None set: the environment exactly as before.
    """
    return {**env, "switches": set_switches} if set_switches else env


def drive(job: Job[T]) -> Driven[T]:
    """Run ``job``: resume → validate → open → prelude → loop → finish (the module docstring says why)."""
    set_switches = switches.check_environment()  # a bad DEEPGAP_* value: one line, exit 2, nothing written
    resumed = None
    if job.resume:
        store, row = open_resume(job.store, job.resume)
        try:
            resumed = Resumed(row, store.done_keys(row["run_id"]))
        finally:
            store.close()  # reopened by `RunSession.resume` once the plan and the launcher are good
    plan = job.plan(resumed)
    session = RunSession(job.store, job.kind)
    out: Driven[T] = Driven(None, job.store, plan.spec)
    launcher = plan.launcher
    try:
        launcher.start()
        env = launcher.environment()
        out.env = dict(env or {})
        with session:  # entered before the row is made: a stop just after it still marks the run interrupted
            if plan.run_id is not None:
                session.resume(plan.run_id)
            elif env is not None and job.store_results:
                session.open(plan.spec.to_dict(), job.command, _with_switches(env, set_switches))
            if plan.prelude and session.run_id is not None:
                _prelude(session, launcher, plan, job.log)
            n = 0
            for item in plan.steps(launcher):
                if isinstance(item, Started):
                    job.event(n, plan.total, item)
                    continue
                if session.run_id is None and job.store_results:
                    out.env = plan.env_of(item) if plan.env_of else {}
                    session.open(plan.spec.to_dict(), job.command, _with_switches(out.env, set_switches))
                if session.run_id is not None:
                    job.record(session, item.result)
                out.outcomes.append(item.result)
                job.event(n, plan.total, item)
                n += 1
            status = job.status(out.outcomes)
            if status is not None:
                session.finish(status)
            out.run_id = session.run_id
        return out
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: the CLI's line says whether --resume has a run
        exc.nothing_stored = session.run_id is None and plan.run_id is None  # type: ignore[attr-defined]
        exc.resumable = job.kind in RESUMABLE  # type: ignore[attr-defined]
        raise
    finally:
        launcher.close()
        session.close()


def _prelude(session: RunSession, launcher: Any, plan: Plan[Any], log: Callable[[str], None]) -> None:
    """The run's prelude, with `Plan.beside_prelude`'s work overlapping it and finished before any step."""
    beside = plan.beside_prelude() if plan.beside_prelude is not None else None
    done = False
    try:
        session.prelude(launcher, plan.sweep, plan.warmup, log)
        done = True
    finally:
        if beside is not None:
            beside.finish() if done else beside.cancel()


def record_result(session: RunSession, result: Any) -> None:
    """`Job.record` of a sweep: one configuration's `Result` (and its telemetry), in its own transaction."""
    session.record(result)


def sweep_events(on_event: Callable[[Event], None]) -> EventSink:
    """`Job.event` of a sweep: a progress `Event` before and after each configuration."""

    def sink(n: int, total: int, item: Item) -> None:
        if isinstance(item, Started):
            on_event(Event(n, total, item.cfg))
        else:
            on_event(Event(n, total, item.result.spec, item.result))

    return sink


def outcome_events(on_outcome: Callable[[Any], None]) -> EventSink:
    """`Job.event` of a kind whose callers want each outcome as it is stored (a profile, the ceilings)."""

    def sink(n: int, total: int, item: Item) -> None:
        if isinstance(item, Finished):
            on_outcome(item.result)

    return sink
