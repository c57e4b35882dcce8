"""The Python API and the one code path behind ``deepgap run``: validate → plan → measure → store."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepgap import __version__
from deepgap.config import SweepSpec, default_spec, preset, validate
from deepgap.errors import UsageError
from deepgap.plan import expand
from deepgap.records import Result
from deepgap.runner import Event, SweepRunner, python_command
from deepgap.store import Store, check_path

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_STORE = os.path.join("deepgap-results", "store.sqlite")


def gpu_present() -> bool:
    """Whether torch sees a CUDA device (no CUDA context is created in this process)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is present else ``cpu``; a clear error for an absent GPU."""
    if device == "auto":
        return "cuda" if gpu_present() else "cpu"
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {device} but no CUDA GPU is usable here", "use --device cpu (or auto)")
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            raise UsageError(
                f"--device {device} but only {torch.cuda.device_count()} GPU(s) are visible",
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}",
            )
    return device


@dataclass
class Results:
    """What `run` returns: the run's id, its store, and the results measured in this call."""

    run_id: str
    store_path: str
    results: list[Result] = field(default_factory=list)

    def to_pandas(self) -> pd.DataFrame:
        """Every stored result of this run (including earlier, resumed parts) as a DataFrame."""
        store = Store(self.store_path, readonly=True)
        try:
            return store.results_frame([self.run_id])
        finally:
            store.close()


def as_spec(spec: SweepSpec | dict[str, Any] | str | None) -> SweepSpec:
    """Accept a SweepSpec, a dict of overrides, a preset name, or None (the device's default)."""
    if spec is None:
        return default_spec(gpu_present(), os.cpu_count() or 1)
    if isinstance(spec, str):
        return preset(spec)
    if isinstance(spec, dict):
        return SweepSpec.from_dict(spec)
    return spec


def open_resume(store: str, resume: str | bool) -> tuple[Store, dict[str, Any]]:
    """The store (open) and the run ``resume`` names (True: the latest unfinished one), or a `UsageError`."""
    check_path(store)
    if not os.path.exists(store):
        raise UsageError(f"--resume but store {store} does not exist", "drop --resume or pass --store")
    s = Store(store)
    row = s.latest_unfinished() if resume is True else s.run(str(resume))
    if row is None:
        s.close()
        raise UsageError(f"store {store} has no unfinished run to resume", "start a new run without --resume")
    return s, row


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
) -> Results:
    """Measure a sweep into ``store``; ``resume`` (True or a run id) continues an unfinished run.

    ``devices`` (``"all"`` or ``["cuda:0", "cuda:1"]``) spreads the sweep over the GPUs of this host;
    ``ray`` (``"auto"``, ``"local"`` or an address) over a Ray cluster, ``where`` (``{"gpu": "L4"}``)
    picking its nodes. Both are in `deepgap.fleet`; a resumed fleet run keeps its stored settings.
    ``log`` receives one-line messages about run-level telemetry (idle baseline, thermal warm-up).
    """
    from deepgap.fleet import stored_fleet

    if devices or ray or where or (resume and stored_fleet(store, resume)):
        from deepgap.fleet.session import run_fleet

        return run_fleet(spec, store, resume, on_event, command, devices=devices, ray=ray, where=where)
    if resume:
        s, run_row = open_resume(store, resume)
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
        s = None
        done = set()
    configs = [c for c in expand(sweep, device) if c.key not in done]
    runner = SweepRunner(sweep, device)
    try:
        runner.start()
        if s is None:
            env = runner.environment()
            s = Store(store)
            run_id = s.begin_run(sweep.to_dict(), command or python_command(), env, __version__)
        else:
            s.reopen_run(run_id)
        out = Results(run_id=run_id, store_path=store)
        status = "interrupted"
        try:
            if configs:  # idle baseline and thermal warm-up (deepgap.telemetry.runlevel)
                from deepgap.telemetry.runlevel import run_level

                run_level(runner, s, run_id, sweep, configs, log)
            for res in runner.run(configs, on_event):
                s.record(run_id, res, telemetry=res.telemetry)
                out.results.append(res)
            status = "finished"
        finally:
            s.finish_run(run_id, status)
        return out
    finally:
        runner.close()
        if s is not None:
            s.close(discard_empty=True)
