"""The Python API, one call per kind of run, each through the one driver (`deepgap.drive.loop.drive`).

`run` measures a sweep (on one device here; over several GPUs or a Ray cluster in `deepgap.fleet`);
`profile` and `peaks` are the roofline's runs (`deepgap.roofline.profile_run`, `deepgap.roofline.peaks_run`).
The store side (run row, idle baseline and thermal prelude, results, final status) is a
`deepgap.drive.session.RunSession`, the same for every kind of run, and the loop is `drive`'s.

Each call is thin: the sweep's plan and job are `deepgap.drive.sweep`'s (with its host-CPU part), a
fleet's `deepgap.fleet.launch`'s, profile's and peaks' the roofline's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.precision import DeviceCaps
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.prelude import PreludeSettings
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
from deepgap.drive.sweep import run_sweep
from deepgap.roofline.peaks_run import PeaksOptions, PeaksRun, measure_peaks_run
from deepgap.roofline.profile import ProfileResult
from deepgap.roofline.profile_run import ProfileOptions, ProfileRun, profile_run

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
        from deepgap.fleet.launch import Fleet, run_fleet

        return run_fleet(spec, store, Fleet(devices, ray, where, every_card), resume, on_event, command, log)
    return run_sweep(spec, store, resume, on_event, command or python_command(), log)


@dataclass(frozen=True)
class Probe:
    """What a worker found on a device: its fingerprint and what it can run (`DeviceCaps`)."""

    device: str
    env: dict[str, Any]
    caps: DeviceCaps


def probe(device: str = "auto") -> Probe:
    """Start a worker on ``device`` (``auto``: the GPU if any), read its fingerprint and capabilities.

    The parent never probes the device itself: a worker process does, as for every run.
    """
    device = resolve_device(device)
    runner = SweepRunner(validate(SweepSpec(device=device)), device)
    try:
        caps = runner.start()
        return Probe(device, runner.environment(), caps)
    finally:
        runner.close()


def profile(
    models: str | Sequence[str] = ("resnet50",),
    *,
    precisions: str | Sequence[str] = ("fp32",),
    modes: str | Sequence[str] = ("infer",),
    batch_sizes: str | Sequence[int] = (64,),
    device: str = "auto",
    resolution: int | None = None,
    memory_format: str = "nchw",
    warmup: int = 5,
    steps: int = 20,
    profiled_steps: int = 1,
    ncu: bool = False,
    ncu_launch_count: int = 0,
    ncu_timeout_s: float = 300.0,
    trace_dir: str | None = None,
    store: str = DEFAULT_STORE,
    prelude: PreludeSettings | None = None,
    command: str | None = None,
    on_result: Callable[[ProfileResult], None] = lambda r: None,
    log: Callable[[str], None] = lambda m: None,
) -> ProfileRun:
    """Profile inference passes or training steps per kernel into ``store`` (a run of kind ``profile``).

    Every combination of ``models`` × ``modes`` × ``precisions`` × ``batch_sizes`` (each a list, or a
    comma-separated text as the CLI's flags) is profiled in a worker process: ``warmup`` untimed steps,
    ``steps`` timed ones (their median is the step time), ``profiled_steps`` under torch.profiler; ``ncu``
    adds the roofline study's Nsight Compute counters from a child process. An OOM or a hang at one batch
    skips the larger batches of the same model, mode and precision (stored as skipped). ``trace_dir``
    keeps each Chrome trace. ``prelude``: the run session's settings (idle baseline, thermal warm-up;
    `PreludeSettings`). ``on_result`` receives each profile as it is stored, ``log`` the prelude's lines.

    Raises:
        UsageError: bad input (nothing is written), or a device the worker cannot use.
    """
    opts = ProfileOptions(
        models=models,
        precisions=precisions,
        modes=modes,
        batch_sizes=batch_sizes,
        device=device,
        resolution=resolution,
        memory_format=memory_format,
        warmup=warmup,
        steps=steps,
        profiled_steps=profiled_steps,
        ncu=ncu,
        ncu_launch_count=ncu_launch_count,
        ncu_timeout_s=ncu_timeout_s,
        trace_dir=trace_dir,
    )
    return profile_run(opts, store, prelude or PreludeSettings(), command, on_result, log)


def peaks(
    device: str = "auto",
    *,
    size: int | None = None,
    bandwidth_mib: int | None = None,
    only: str | Sequence[str] | None = None,
    repeats: int = 5,
    store: str | None = DEFAULT_STORE,
    prelude: PreludeSettings | None = None,
    command: str | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> PeaksRun:
    """Measure ``device``'s ceilings (matmul TFLOP/s per precision, memory GB/s) in a worker process.

    ``size``: the matmul's n (n×n×n; default 8192 on GPUs, 2048 on CPUs); ``bandwidth_mib``: the copy buffer
    (default 1024 MiB on GPUs, 256 on CPUs); ``only``: a subset of `deepgap.roofline.peaks.NAMES`;
    ``repeats``: timed loops per ceiling (the median is kept). ``store=None`` stores nothing (and measures
    no idle baseline); else a run of kind ``peaks`` with the idle baseline first (``prelude``). The result
    holds the spec sheet's row beside the measured ceilings.

    Raises:
        UsageError: bad input (nothing is written), or the worker could not measure (the run is then left
            ``interrupted``).
    """
    opts = PeaksOptions(device=device, size=size, bandwidth_mib=bandwidth_mib, only=only, repeats=repeats)
    return measure_peaks_run(opts, store, prelude or PreludeSettings(), command, log)
