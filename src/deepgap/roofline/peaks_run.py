"""A ``peaks`` run: the device's measured ceilings (matmul per precision, memory bandwidth), one driver.

Why here and not in the command: the run (one ``peaks`` request to the worker, its rows in the store) is
the roofline feature's; ``deepgap peaks`` only parses its flags, calls `deepgap.api.peaks` and prints
(`deepgap.roofline.console`). It is a `deepgap.drive.loop.Job` of kind ``peaks``: the driver starts the
worker, opens the run with its fingerprint and measures the idle baseline first, as for every run (no
thermal warm-up: a ceiling run has no model to load the device with). Without a store nothing is opened
and no baseline is measured; the worker still measures, and this process never touches the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.drive.config import SweepSpec
from deepgap.drive.handle import WorkerFailed, WorkerLost
from deepgap.drive.launcher import Finished
from deepgap.drive.loop import Job, Plan, Resumed, drive
from deepgap.drive.prelude import PreludeSettings
from deepgap.drive.runner import SweepRunner, python_command
from deepgap.drive.session import PEAKS, RunSession, resolve_device
from deepgap.measure.protocol import register_worker_module
from deepgap.roofline.peaks import NAMES, PeakMeasurement, PeaksRequest

register_worker_module("deepgap.roofline.worker", "peaks")  # its handler runs in the worker only

PEAKS_TIMEOUT_S = 1800.0  # every ceiling of one device, in the worker


@dataclass(frozen=True)
class PeaksOptions:
    """What a peaks run measures (`deepgap.api.peaks`'s arguments)."""

    device: str = "auto"
    size: int | None = None  # matmul n (default 8192 on GPUs, 2048 on CPUs)
    bandwidth_mib: int | None = None  # copy buffer (default 1024 MiB on GPUs, 256 on CPUs)
    only: str | Sequence[str] | None = None  # a subset of NAMES (a comma-separated text or a list)
    repeats: int = 5


@dataclass(frozen=True)
class PeaksRunSpec:
    """A peaks run's stored spec (`deepgap.drive.loop.RunSpec`)."""

    device: str
    size: int | None
    bandwidth_mib: int | None
    names: list[str]
    repeats: int

    def to_dict(self) -> dict[str, Any]:
        """The run row's spec."""
        return asdict(self)


@dataclass
class PeaksRun:
    """A peaks run's outcome: its run (None without a store), the device, its spec-sheet row, the ceilings."""

    run_id: str | None
    store_path: str | None
    device: str
    env: dict[str, Any] = field(default_factory=dict)
    sheet: dict[str, Any] | None = None  # the datasheet's row (`deepgap.roofline.specs.spec_for`), GPUs only
    peaks: list[PeakMeasurement] = field(default_factory=list)


def validate(opts: PeaksOptions, store: str | None, prelude: PreludeSettings) -> tuple[str, tuple[str, ...]]:
    """The device and the ceilings to measure; a `UsageError` (nothing written) for bad input."""
    from deepgap.store import check_path

    names = NAMES
    if opts.only:
        text = opts.only if isinstance(opts.only, str) else ",".join(opts.only)
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        bad = [n for n in names if n not in NAMES]
        if bad or not names:
            raise UsageError(
                f"--only {text!r} names unknown ceilings {bad}", f"choose from {','.join(NAMES)}"
            )
    for flag, v in (("size", opts.size), ("bandwidth-mib", opts.bandwidth_mib), ("repeats", opts.repeats)):
        if v is not None and v < 1:
            raise UsageError(f"--{flag} must be a positive integer, not {v}", f"pass e.g. --{flag} 4")
    prelude.check()
    if prelude.thermal_warmup:
        raise UsageError("peaks has no model to warm the device up with", "drop the thermal warm-up")
    if store is not None:
        check_path(store)
    return resolve_device(opts.device), names


def plan(
    opts: PeaksOptions, store: str | None, prelude: PreludeSettings, resumed: Resumed | None = None
) -> Plan[SweepRunner]:
    """The peaks run's plan: validated input, the worker's launcher, the stored spec, one request."""
    device, names = validate(opts, store, prelude)
    bw = opts.bandwidth_mib << 20 if opts.bandwidth_mib else None
    sweep = SweepSpec(device=device).replace(**prelude.changes())

    def steps(runner: SweepRunner) -> Iterator[Finished[list[PeakMeasurement]]]:
        try:
            peaks = runner.call("peaks", PeaksRequest(opts.size, bw, names, opts.repeats), PEAKS_TIMEOUT_S)
        except (WorkerLost, WorkerFailed) as lost:
            raise UsageError(
                f"measuring the ceilings of {device} failed ({lost.status.value}: {lost.reason})",
                "check the device with `deepgap env`",
            ) from None
        yield Finished("", peaks)

    spec = PeaksRunSpec(device, opts.size, opts.bandwidth_mib, list(names), opts.repeats)
    # the idle baseline only: no configurations, so no thermal warm-up
    return Plan(SweepRunner(sweep, device), spec, sweep, steps, total=1, warmup=())


def record(session: RunSession, peaks: list[PeakMeasurement]) -> None:
    """`deepgap.drive.loop.Job.record` of a peaks run: every ceiling, measured or with its reason."""
    from deepgap.roofline import storage

    assert session.store is not None and session.run_id is not None
    storage.record_peaks(session.store, session.run_id, peaks)


def measure_peaks_run(
    opts: PeaksOptions,
    store: str | None,
    prelude: PreludeSettings | None = None,
    command: str | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> PeaksRun:
    """Run ``opts`` through the one driver; ``store=None`` stores nothing (see `deepgap.api.peaks`)."""
    from deepgap.roofline.specs import spec_for

    job: Job[list[PeakMeasurement]] = Job(
        kind=PEAKS,
        store=store or "",
        command=command or python_command(),
        plan=lambda resumed: plan(opts, store, prelude or PreludeSettings(), resumed),
        record=record,
        store_results=store is not None,
        log=log,
    )
    done = drive(job)
    device = done.spec.device
    sheet = spec_for(done.env.get("device_name")) if device.startswith("cuda") else None
    peaks = done.outcomes[0] if done.outcomes else []
    return PeaksRun(done.run_id, store, device, done.env, sheet, peaks)
