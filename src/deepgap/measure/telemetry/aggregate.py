"""Pure arithmetic from samples and energy marks to one configuration's `TelemetryWindow`.

Why pure: every number the report shows about energy is computed here from stored raw data (the
samples and the counter readings around each window), so it is exactly testable with a scripted
trace and can be recomputed later from the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from deepgap.measure.telemetry.base import TelemetrySample, TelemetryWindow, counter_delta, decode_reasons
from deepgap.measure.telemetry.sampler import EnergyMark

_GPU_IDLE = 0x1


def in_marks(t_s: float, marks: Sequence[EnergyMark]) -> bool:
    """Whether epoch time ``t_s`` lies inside one of the energy windows."""
    return any(m.t0_s <= t_s <= m.t1_s for m in marks)


def slope_per_min(t_s: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of ``values`` over time, per minute (None with < 2 points or no time span)."""
    if len(t_s) < 2:
        return None
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(values, dtype=float)
    if float(t.max() - t.min()) <= 0:
        return None
    return float(np.polyfit(t - t[0], v, 1)[0] * 60.0)


def _mean(xs: Iterable[float | None]) -> float | None:
    v = [float(x) for x in xs if x is not None]
    return float(np.mean(v)) if v else None


def _max(xs: Iterable[float | None]) -> float | None:
    v = [float(x) for x in xs if x is not None]
    return float(max(v)) if v else None


def _median(xs: Iterable[float | None]) -> float | None:
    v = [float(x) for x in xs if x is not None]
    return float(np.median(v)) if v else None


def busy(s: TelemetrySample) -> bool:
    """False for samples the driver marked idle (``gpu_idle`` reason): their clocks say nothing."""
    return s.clocks_event_reasons is None or not (int(s.clocks_event_reasons) & _GPU_IDLE)


def window_energy(
    marks: Sequence[EnergyMark],
    range_j: float | None,
) -> tuple[float | None, float, float, int, list[str]]:
    """Counter energy over the windows whose two readings are usable.

    Returns:
        (joules or None, work seconds, tail seconds, images, notes) over the usable windows; notes
        name every window whose counter wrapped (corrected) or reset / was unreadable (left out).
    """
    total, work_s, tail_s, images, notes, used = 0.0, 0.0, 0.0, 0, [], 0
    for i, m in enumerate(marks):
        d, note = counter_delta(m.e0_j, m.e1_j, range_j)
        if note and not (m.e0_j is None and m.e1_j is None):  # both None: no counter at all
            notes.append(f"window {i}: {note}")
        if d is None:
            continue
        used += 1
        total += d
        work_s += max(m.duration_s - m.tail_s, 0.0)
        tail_s += m.tail_s
        images += m.images
    return (total if used else None), work_s, tail_s, images, notes


def summarize(
    samples: Sequence[tuple[str, TelemetrySample]],
    marks: Sequence[EnergyMark],
    *,
    backend: str,
    range_j: float | None = None,
    throughput_pipelined_ips: float | None = None,
    idle_power_w: float | None = None,
    ref_sm_clock_mhz: float | None = None,
    clock_tolerance: float = 0.1,
    unavailable: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
) -> TelemetryWindow:
    """Aggregate one configuration.

    Args:
        samples: (phase, sample) pairs in time order, as `Sampler.samples`.
        marks: the energy windows.
        backend: the backend's name.
        range_j: the energy counter's wrap modulus (None: it only resets).
        throughput_pipelined_ips: images/s of the windows, for the paper's images/s per watt.
        idle_power_w: run-level idle baseline, for the tail correction and the dynamic energy.
        ref_sm_clock_mhz: the steady SM clock (thermal warm-up); default: the windows' own 90th percentile.
        clock_tolerance: a busy sample's clock below ``(1 - tolerance) × reference`` counts as low.
        unavailable: metric → reason, from the backend.
        settings: read-only device settings, from the backend.
    """
    w = TelemetryWindow(backend=backend, unavailable=dict(unavailable or {}), settings=dict(settings or {}))
    w.n_samples = len(samples)
    win = [s for _, s in samples if in_marks(s.t_s, marks)]
    latency = [s for p, s in samples if p == "measure" and not in_marks(s.t_s, marks)]
    w.n_window_samples = len(win)
    w.energy_windows = len(marks)
    if any(m.e0_j is not None or m.e1_j is not None for m in marks):  # the raw counter readings
        w.marks = [m.to_dict() for m in marks]
    w.images = sum(m.images for m in marks)
    _energy(w, win, marks, range_j, idle_power_w)
    w.mean_power_w = _mean(s.power_w for s in win)
    w.max_power_w = _max(s.power_w for s in win)
    w.mean_power_instant_w = _mean(s.power_instant_w for s in win)
    w.max_power_instant_w = _max(s.power_instant_w for s in win)
    w.mean_power_latency_w = _mean(s.power_w for s in latency)
    if throughput_pipelined_ips and w.mean_power_w:
        w.ips_per_watt = throughput_pipelined_ips / w.mean_power_w
    _temps_and_clocks(w, win, ref_sm_clock_mhz, clock_tolerance)
    return w


def _energy(
    w: TelemetryWindow, win: list[TelemetrySample], marks: Sequence[EnergyMark], range_j, idle_power_w
) -> None:
    """The windows' energy: from the counter (its idle tail taken out), else sampled power × time."""
    energy, work_s, tail_s, images, notes = window_energy(marks, range_j)
    w.energy_counter_notes = notes
    if energy is not None and work_s > 0:
        w.energy_source = "counter"
        w.energy_tail_s = tail_s
        if idle_power_w is not None:
            w.energy_tail_j = idle_power_w * tail_s
            energy -= w.energy_tail_j
    else:  # no usable counter: sampled power × time, window by window
        energy, work_s, images = 0.0, 0.0, 0
        for m in marks:
            p = _mean(s.power_w for s in win if m.t0_s <= s.t_s <= m.t1_s)
            if p is not None:
                dt = max(m.duration_s - m.tail_s, 0.0)
                energy, work_s, images = energy + p * dt, work_s + dt, images + m.images
        if work_s > 0:
            w.energy_source = "power-integration"
        elif not marks:
            energy, w.energy_source = None, "unavailable: no energy window was measured"
        else:
            energy = None
            why = (
                w.unavailable.get("energy_j")
                or w.unavailable.get("power_w")
                or "no energy counter or power reading"
            )
            w.energy_source = why if why.startswith("unavailable:") else f"unavailable: {why}"
    if marks and energy is not None and work_s > 0:
        w.energy_j, w.energy_window_s = energy, work_s
        w.power_from_energy_w = energy / work_s
        if images and energy > 0:
            w.joules_per_image = energy / images
            w.ips_per_watt_energy = images / energy
        if idle_power_w is not None:
            w.idle_power_w = idle_power_w
            w.dynamic_energy_j = energy - idle_power_w * work_s
            w.dynamic_joules_per_image = w.dynamic_energy_j / images if images else None
    elif idle_power_w is not None:
        w.idle_power_w = idle_power_w


def _temps_and_clocks(
    w: TelemetryWindow, win: list[TelemetrySample], ref_sm_clock_mhz, clock_tolerance
) -> None:
    """Temperatures, clocks (busy samples), utilisation, memory, throttle reasons and foreign processes."""
    temps = [(s.t_s, s.temp_c) for s in win if s.temp_c is not None]
    if temps:
        w.max_temp_c = max(v for _, v in temps)
        w.temp_start_c, w.temp_end_c = temps[0][1], temps[-1][1]
        w.temp_slope_c_per_min = slope_per_min([t for t, _ in temps], [v for _, v in temps])
    w.max_mem_temp_c = _max(s.mem_temp_c for s in win)

    clocks = [s.sm_clock_mhz for s in win if busy(s) and s.sm_clock_mhz is not None]
    if clocks:
        w.sm_clock_median_mhz = float(np.median(clocks))
        w.sm_clock_min_mhz, w.sm_clock_max_mhz = float(min(clocks)), float(max(clocks))
        ref = ref_sm_clock_mhz if ref_sm_clock_mhz else float(np.percentile(clocks, 90))
        w.sm_clock_ref_mhz = ref
        w.sm_clock_low_fraction = float(np.mean([c < (1.0 - clock_tolerance) * ref for c in clocks]))
    w.mem_clock_median_mhz = _median(s.mem_clock_mhz for s in win if busy(s))
    w.util_mean_pct = _mean(s.util_pct for s in win)
    used = [s.mem_used_bytes for s in win if s.mem_used_bytes is not None]
    w.mem_used_max_bytes = int(max(used)) if used else None

    masks = [s.clocks_event_reasons for s in win if s.clocks_event_reasons is not None]
    counts: dict[str, int] = {}
    for m in masks:
        for name in decode_reasons(m):
            counts[name] = counts.get(name, 0) + 1
    w.throttle_reasons = sorted(counts)
    w.throttle_fraction = {k: counts[k] / len(masks) for k in sorted(counts)}

    procs = [s.foreign_procs for s in win if s.foreign_procs is not None]
    w.foreign_procs_max = int(max(procs)) if procs else None
    w.foreign_pids = sorted({p for s in win for p in (s.foreign_pids or ())})
