"""Parent side of the run-level telemetry: the idle baseline and the thermal warm-up, at run start.

Why in the parent: both are requests to the one worker (which owns the device) made once per run
(and again on ``--resume``: the device has cooled down since). Their samples are stored as
run-level telemetry (``result_id`` NULL, phases ``idle`` / ``thermal``) and their summaries as one
row each with phase ``idle-summary`` / ``thermal-summary`` (read them back with `run_summaries`).
What they learn is handed to every later `MeasureRequest` through ``runner.set_context``:
the idle power (dynamic energy, tail correction) and the steady SM clock (the ``clocks-low`` flag).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from deepgap.core.records import ConfigSpec, Status

if TYPE_CHECKING:
    from deepgap.drive.config import SweepSpec
    from deepgap.drive.runner import SweepRunner
    from deepgap.store import Store

THERMAL_MAX_BATCH = 64  # the warm-up load: the largest planned batch up to this (a busy, not huge, load)


def thermal_config(configs: Sequence[ConfigSpec]) -> ConfigSpec:
    """The warm-up load: the first configuration's group at its largest planned batch ≤ 64."""
    first = configs[0]
    same = [c for c in configs if c.group == first.group]
    fitting = [c for c in same if c.batch_size <= THERMAL_MAX_BATCH] or [
        min(same, key=lambda c: c.batch_size)
    ]
    return max(fitting, key=lambda c: c.batch_size)


def run_level(
    runner: SweepRunner,
    store: Store,
    run_id: str,
    sweep: SweepSpec,
    configs: Sequence[ConfigSpec],
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Measure the idle baseline (and the thermal warm-up when asked); store both; update the runner.

    Returns:
        ``{"idle": summary, "thermal": summary or None}``.
    """
    settings = runner.telemetry_settings()
    if settings is None:
        return {"idle": None, "thermal": None}
    if settings.idle_s <= 0:  # --idle-time 0: no baseline at all (dynamic energy is then unavailable)
        idle = {"summary": {"status": "skipped: --idle-time 0"}, "samples": []}
    else:
        idle = runner.idle_baseline(settings)
    summary = [("idle-summary", time.time(), idle["summary"])]
    store.record_run_telemetry(run_id, list(idle["samples"]) + summary)
    if idle["summary"].get("idle_power_w") is not None:
        runner.set_context(idle_power_w=idle["summary"]["idle_power_w"])
        log(f"idle baseline: {idle['summary']['idle_power_w']:.1f} W")
    else:
        log(f"idle baseline {idle['summary'].get('status')}")
    thermal = None
    if getattr(sweep, "thermal_warmup", False) and configs:  # no configurations: nothing to warm up with
        cfg = thermal_config(configs)
        log(
            f"thermal warm-up on {cfg.label()}: until |dT/dt| < {settings.thermal_slope_c_per_min:g} °C/min "
            f"over {settings.thermal_window_s:g} s, at most {settings.thermal_timeout_s:g} s"
        )
        res = runner.thermal_warmup(cfg, settings.thermal_timeout_s)
        if res.status == Status.OK:
            thermal, samples = res.details.thermal or {}, list(res.telemetry)
        elif res.status in (Status.TIMEOUT, Status.CRASH):
            thermal = {"status": f"unavailable: the worker was lost ({res.reason})", "steady": False}
            samples = []
        else:
            thermal, samples = (
                {
                    "status": f"unavailable: the warm-up load failed ({res.status.value}: {res.reason})",
                    "steady": False,
                },
                [],
            )
        store.record_run_telemetry(run_id, samples + [("thermal-summary", time.time(), thermal)])
        if thermal.get("steady_sm_clock_mhz"):
            runner.set_context(ref_sm_clock_mhz=thermal["steady_sm_clock_mhz"])
        if thermal.get("status") == "ok":
            log(
                f"thermal warm-up: {thermal['stopped_by']} after {thermal['duration_s']:.0f} s, "
                f"{thermal.get('temp_start_c')} → {thermal.get('temp_end_c')} °C"
            )
        else:
            log(f"thermal warm-up {thermal.get('status')}")
    return {"idle": idle["summary"], "thermal": thermal}


def run_summaries(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The stored run-level summaries of a run: ``{"idle": [...], "thermal": [...]}``, oldest first."""
    out: dict[str, list[dict[str, Any]]] = {"idle": [], "thermal": []}
    for phase, _, data in store.run_telemetry(run_id):
        if phase.endswith("-summary"):
            out.setdefault(phase[: -len("-summary")], []).append(data)
    return out
