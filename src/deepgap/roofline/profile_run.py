"""A ``profile`` run: per-kernel profiles of inference passes or training steps, through the one driver.

Why here and not in the command: the loop (one ``profile`` request per configuration to the worker, the
OOM/hang cascade, a fresh worker after a CUDA error, Nsight Compute in a child process, each profile
stored as it comes) is the roofline feature's; ``deepgap profile`` only parses its flags, calls
`deepgap.api.profile` and prints (`deepgap.roofline.console`). The run itself is a
`deepgap.drive.loop.Job` of kind ``profile``: the driver starts the worker, opens the run with its
fingerprint, measures the idle baseline (and the thermal warm-up when asked) and finishes the run.
The worker process measures; this process never touches the GPU.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.drive.config import MEMORY_FORMATS, SweepSpec, parse_int_list, parse_str_list
from deepgap.drive.handle import WorkerFailed, WorkerLost
from deepgap.drive.launcher import Finished
from deepgap.drive.loop import Job, Plan, Resumed, drive, outcome_events
from deepgap.drive.plan import expand
from deepgap.drive.prelude import PreludeSettings
from deepgap.drive.runner import Cascade, SweepRunner, needs_restart, python_command
from deepgap.drive.session import PROFILE, RunSession, resolve_device
from deepgap.measure.protocol import register_worker_module
from deepgap.roofline.profile import MODES, ProfileResult, ProfileSpec

register_worker_module("deepgap.roofline.worker", "profile")  # its handler runs in the worker only

PROFILE_TIMEOUT_S = 1800.0  # one profile (warm-up, timed steps, profiled steps) in the worker


@dataclass(frozen=True)
class ProfileOptions:
    """What a profile run profiles (`deepgap.api.profile`'s arguments); a list may be comma-separated text."""

    models: str | Sequence[str] = ("resnet50",)
    precisions: str | Sequence[str] = ("fp32",)
    modes: str | Sequence[str] = ("infer",)
    batch_sizes: str | Sequence[int] = (64,)
    device: str = "auto"
    resolution: int | None = None  # None: the model's
    memory_format: str = "nchw"
    warmup: int = 5
    steps: int = 20
    profiled_steps: int = 1
    ncu: bool = False
    ncu_launch_count: int = 0  # 0: every kernel
    ncu_timeout_s: float = 300.0
    trace_dir: str | None = None  # keep each Chrome trace (and ncu CSV) here


@dataclass(frozen=True)
class ProfileRunSpec:
    """A profile run's stored spec (`deepgap.drive.loop.RunSpec`): the grid, as resolved, and the options."""

    models: list[str]
    precisions: list[str]
    modes: list[str]
    batch_sizes: list[int]
    device: str
    resolution: int | None
    memory_format: str
    warmup: int = 5
    steps: int = 20
    profiled_steps: int = 1
    ncu: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The run row's spec."""
        return asdict(self)


@dataclass
class ProfileRun:
    """What a profile run returns: its run, the device's fingerprint and every profile, in order."""

    run_id: str | None
    store_path: str
    device: str
    env: dict[str, Any] = field(default_factory=dict)
    results: list[ProfileResult] = field(default_factory=list)


def _text(value: str | Sequence[Any]) -> str:
    return value if isinstance(value, str) else ",".join(str(v) for v in value)


def validate(
    opts: ProfileOptions, store: str, prelude: PreludeSettings
) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    """The device, models, precisions, modes, batch sizes; a `UsageError` (nothing written) for bad input."""
    from deepgap.core.precision import FLOAT_PRECISIONS
    from deepgap.measure.models.registry import resolve_model
    from deepgap.store import check_path

    models = parse_str_list(_text(opts.models))
    for m in models:
        resolve_model(m)
    precs = parse_str_list(_text(opts.precisions))
    bad = [p for p in precs if p not in FLOAT_PRECISIONS]
    if bad or not precs:
        raise UsageError(
            f"--precision {_text(opts.precisions)!r}: profile runs PyTorch eager only",
            f"choose from {','.join(FLOAT_PRECISIONS)}",
        )
    modes = parse_str_list(_text(opts.modes))
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(
            f"--mode {_text(opts.modes)!r} is not infer, train or infer,train",
            "pass --mode infer or --mode train",
        )
    batches = parse_int_list(_text(opts.batch_sizes), "batch-size")
    for flag, v, low in (
        ("warmup", opts.warmup, 0),
        ("steps", opts.steps, 1),
        ("profiled-steps", opts.profiled_steps, 1),
        ("ncu-launch-count", opts.ncu_launch_count, 0),
    ):
        if v < low:
            raise UsageError(f"--{flag} must be at least {low}, not {v}", f"pass e.g. --{flag} {max(low, 1)}")
    prelude.check()
    if opts.resolution is not None and opts.resolution < 8:
        raise UsageError(f"--resolution {opts.resolution} is too small", "pass e.g. --resolution 224")
    if opts.memory_format not in MEMORY_FORMATS:
        raise UsageError(
            f"unknown memory format {opts.memory_format!r}", f"choose from {', '.join(MEMORY_FORMATS)}"
        )
    check_path(store)
    if opts.trace_dir is not None:
        from deepgap.store.paths import check_folder

        check_folder(opts.trace_dir, "--trace-dir")
    return resolve_device(opts.device), models, precs, modes, batches


def profile_one(runner: SweepRunner, spec: ProfileSpec, trace_dir: str | None) -> ProfileResult:
    """One profile in the worker: a lost or failing worker becomes the result's status."""
    try:
        res = runner.call("profile", (spec, trace_dir), PROFILE_TIMEOUT_S)
    except (WorkerLost, WorkerFailed) as lost:
        res = ProfileResult(spec=spec, status=lost.status.value, reason=lost.reason)
    if needs_restart(res.status, spec.device):
        runner.restart()  # the next profile gets a fresh worker
    return res


def attach_ncu(opts: ProfileOptions, spec: ProfileSpec, res: ProfileResult, ncu_dir: str) -> None:
    """With ``ncu``: the Nsight Compute counters of ``spec``, from a child process of their own."""
    if opts.ncu and res.status == "ok":
        from deepgap.roofline.ncu import run_ncu

        out = run_ncu(spec, ncu_dir, opts.ncu_launch_count, opts.ncu_timeout_s)  # its own child process
        res.ncu = {
            "status": out.status,
            "reason": out.reason,
            "metrics": out.metrics,
            "command": out.command,
            "summary": out.summary,
            "csv": out.csv_path,
        }
        res.ncu_kernels = out.kernels
    elif opts.ncu:
        res.ncu = {"status": "skipped", "reason": f"the torch profile {res.status}"}


def plan(
    opts: ProfileOptions, store: str, prelude: PreludeSettings, resumed: Resumed | None = None
) -> Plan[SweepRunner]:
    """The profile run's plan: validated input, the worker's launcher, the stored spec, the loop."""
    device, models, precs, modes, batches = validate(opts, store, prelude)
    specs = [
        ProfileSpec(
            model,
            prec,
            bs,
            mode,
            device,
            opts.resolution,
            opts.memory_format,
            opts.warmup,
            opts.steps,
            opts.profiled_steps,
        )
        for model, mode, prec, bs in itertools.product(models, modes, precs, batches)
    ]
    # absolute: the worker's working directory need not be this process's
    trace_dir = os.path.abspath(opts.trace_dir) if opts.trace_dir else None
    ncu_dir = trace_dir or os.path.join(os.path.dirname(os.path.abspath(store)), "ncu")
    sweep = SweepSpec(
        models=models,
        precisions=precs,
        batch_sizes=batches,
        device=device,
        resolution=opts.resolution,
        memory_formats=(opts.memory_format,),
    ).replace(**prelude.changes())

    def steps(runner: SweepRunner) -> Iterator[Finished[ProfileResult]]:
        cascade = Cascade()  # an OOM or a hang at one batch skips the larger ones
        for spec in specs:
            group = (spec.model, spec.mode, spec.precision)
            why = cascade.skip_reason(group)
            if why is not None:
                res = ProfileResult(spec=spec, status="skipped", reason=why)
            else:
                res = profile_one(runner, spec, trace_dir)
                cascade.note(group, spec.batch_size, res.status)
            attach_ncu(opts, spec, res, ncu_dir)
            yield Finished("", res)

    spec = ProfileRunSpec(models, precs, modes, list(batches), device, opts.resolution, opts.memory_format)
    spec = replace(
        spec, warmup=opts.warmup, steps=opts.steps, profiled_steps=opts.profiled_steps, ncu=opts.ncu
    )
    return Plan(SweepRunner(sweep, device), spec, sweep, steps, len(specs), warmup=expand(sweep, device))


def record(session: RunSession, res: ProfileResult) -> None:
    """`deepgap.drive.loop.Job.record` of a profile run: the profile, its kernels and clusters."""
    from deepgap.roofline import storage

    assert session.store is not None and session.run_id is not None
    storage.record_profile(session.store, session.run_id, res)


def profile_run(
    opts: ProfileOptions,
    store: str,
    prelude: PreludeSettings | None = None,
    command: str | None = None,
    on_result: Callable[[ProfileResult], None] = lambda r: None,
    log: Callable[[str], None] = lambda m: None,
) -> ProfileRun:
    """Run ``opts`` into ``store`` through the one driver (`deepgap.api.profile` documents the arguments)."""
    job: Job[ProfileResult] = Job(
        kind=PROFILE,
        store=store,
        command=command or python_command(),
        plan=lambda resumed: plan(opts, store, prelude or PreludeSettings(), resumed),
        record=record,
        event=outcome_events(on_result),
        log=log,
    )
    done = drive(job)
    return ProfileRun(done.run_id, store, done.spec.device, done.env, done.outcomes)
