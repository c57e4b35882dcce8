"""Roofline arithmetic: attainable rate, ridge point, theoretical times, achieved rate and fraction of peak.

Units throughout: FLOP/s as TFLOP/s (1e12), bandwidth as GB/s (1e9 bytes/s, decimal as spec sheets use),
arithmetic intensity as FLOP per byte. The roofline of a device at one precision is
``attainable(AI) = min(peak, AI × bandwidth)``; the ridge point ``peak / bandwidth`` separates memory-bound
(left) from compute-bound (right) work. The paper's "theoretical time" is ``FLOPs / peak``; we also give
``bytes / bandwidth`` and the larger of the two, the roofline's lower bound on the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepgap.core.precision import PRECISIONS as PRECISION_TABLE

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.roofline.cost import ModelCost

PRECISIONS = tuple(PRECISION_TABLE)  # the precision table's names, in its order
BANDWIDTH_NAME = "memory"  # the peaks row holding device-memory bandwidth


@dataclass(frozen=True)
class Ceiling:
    """One roofline: a compute peak at one precision and the memory bandwidth under it."""

    label: str
    precision: str
    peak_tflops: float
    bandwidth_gb_s: float
    source: str  # "spec" or "measured"

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the bandwidth slope meets the compute peak."""
        return ridge_point(self.peak_tflops, self.bandwidth_gb_s)

    def attainable_tflops(self, intensity_flop_per_byte):
        """``min(peak, AI × bandwidth)`` at one or many intensities."""
        return attainable_tflops(intensity_flop_per_byte, self.peak_tflops, self.bandwidth_gb_s)


def attainable_tflops(intensity_flop_per_byte, peak_tflops: float, bandwidth_gb_s: float):
    """Roofline: ``min(peak, AI × bandwidth)`` in TFLOP/s; numpy arrays in, arrays out."""
    import numpy as np

    ai = np.asarray(intensity_flop_per_byte, dtype=float)
    out = np.minimum(float(peak_tflops), ai * float(bandwidth_gb_s) / 1e3)
    return float(out) if out.ndim == 0 else out


def ridge_point(peak_tflops: float, bandwidth_gb_s: float) -> float:
    """Intensity (FLOP/byte) at which a kernel stops being memory-bound: peak / bandwidth."""
    return float(peak_tflops) * 1e12 / (float(bandwidth_gb_s) * 1e9)


def achieved_tflops(flops_per_image: float, throughput_ips: float) -> float:
    """TFLOP/s a configuration achieved: FLOPs per image × images per second / 1e12."""
    if flops_per_image is None or throughput_ips is None:
        return float("nan")
    return float(flops_per_image) * float(throughput_ips) / 1e12


def bound(intensity_flop_per_byte: float, ceiling: Ceiling) -> str:
    """``memory`` left of the ridge point, ``compute`` at or right of it."""
    return "memory" if intensity_flop_per_byte < ceiling.ridge_flop_per_byte else "compute"


@dataclass(frozen=True)
class TheoreticalTime:
    """Lower bounds on the time of some work on one device."""

    compute_s: float  # FLOPs / peak (the paper's eq. 6)
    memory_s: float  # bytes / bandwidth (nan when bytes or bandwidth are unknown)
    bound_s: float  # the larger of the two: the roofline time
    limiter: str  # "compute" | "memory"


def theoretical_time(
    flops: float, peak_tflops: float, bytes_moved: float | None = None, bandwidth_gb_s: float | None = None
) -> TheoreticalTime:
    """Theoretical time of ``flops`` (and ``bytes_moved``) on a device with the given peaks.

    Example: the paper's ResNet-50 step (270 GFLOP) on a T4 (8.1 TFLOP/s) is 270e9 / 8.1e12 = 0.0333 s —
    33 ms, not the 33.33 s the study prints.
    """
    compute = float(flops) / (float(peak_tflops) * 1e12) if peak_tflops else float("nan")
    memory = float("nan")
    if bytes_moved is not None and bandwidth_gb_s:
        memory = float(bytes_moved) / (float(bandwidth_gb_s) * 1e9)
    if math.isnan(memory):
        return TheoreticalTime(compute, memory, compute, "compute")
    return TheoreticalTime(
        compute, memory, max(compute, memory), "compute" if compute >= memory else "memory"
    )


def fraction(achieved: float, peak: float | None) -> float:
    """Achieved over peak; nan when the peak is unknown."""
    if peak is None or not peak or peak != peak:
        return float("nan")
    return float(achieved) / float(peak)


def ceiling_from_spec(spec_row: dict[str, Any] | None, precision: str) -> Ceiling | None:
    """The spec-sheet ceiling of ``precision`` (None when the sheet has no such number)."""
    from deepgap.roofline.specs import spec_peak

    if spec_row is None:
        return None
    peak = spec_peak(spec_row, precision)
    bw = spec_peak(spec_row, BANDWIDTH_NAME)
    if peak is None or bw is None:
        return None
    return Ceiling(f"{spec_row.get('gpu', 'spec')} spec {precision}", precision, peak, bw, "spec")


def measured_peaks(peaks_df: pd.DataFrame | None, device_name: str | None = None) -> dict[str, float]:
    """``{name: value}`` of the latest successful measurement per name (TFLOP/s, or GB/s for memory)."""
    if peaks_df is None or len(peaks_df) == 0:
        return {}
    df = peaks_df[peaks_df["status"] == "ok"]
    if device_name is not None and "device_name" in df and (df["device_name"] == device_name).any():
        df = df[df["device_name"] == device_name]
    if "created_at" in df:
        df = df.sort_values("created_at")
    return {str(r["name"]): float(r["value"]) for _, r in df.iterrows()}


def ceiling_from_peaks(
    peaks_df: pd.DataFrame | None, precision: str, device_name: str | None = None
) -> Ceiling | None:
    """The measured ceiling of ``precision`` from a peaks frame (`deepgap.roofline.storage.peaks_frame`)."""
    vals = measured_peaks(peaks_df, device_name)
    if precision not in vals or BANDWIDTH_NAME not in vals:
        return None
    return Ceiling(f"measured {precision}", precision, vals[precision], vals[BANDWIDTH_NAME], "measured")


def ceilings(precision: str, peaks_df=None, spec_row=None, device_name: str | None = None) -> list[Ceiling]:
    """Spec and measured ceilings of ``precision`` that exist, spec first."""
    out = [ceiling_from_spec(spec_row, precision), ceiling_from_peaks(peaks_df, precision, device_name)]
    return [c for c in out if c is not None]


def add_roofline_columns(
    results_df: pd.DataFrame,
    peaks_df=None,
    spec_row=None,
    bytes_model: str = "traffic",
    count_missing: bool = True,
) -> pd.DataFrame:
    """Add roofline columns to a results frame (``Store.results_frame``); returns a copy.

    Added: ``roofline_flops_per_image`` (`deepgap.measure.models.flops` on the meta device, the counter the worker's
    `flops_per_image` also comes from; that column is kept as it is),
    ``achieved_tflops`` (= FLOPs per image × ``throughput_ips`` / 1e12), ``achieved_tflops_pipelined``,
    ``bytes_per_batch`` and ``min_bytes_per_batch`` (estimates at the row's precision),
    ``intensity_flop_per_byte`` (FLOPs / ``bytes_model`` bytes) and ``intensity_min_flop_per_byte``,
    ``peak_tflops_spec`` / ``peak_tflops_measured``, ``fraction_of_spec_peak`` /
    ``fraction_of_measured_peak``, ``bandwidth_gb_s_spec`` / ``bandwidth_gb_s_measured`` and ``bound``
    (against the measured ceiling when there is one, else the spec's).

    Args:
        results_df: one row per result (``model``, ``precision``, ``batch_size``, ``resolution``,
            ``throughput_ips``, ``device_name``; an optional ``mode`` column, default ``infer``).
        peaks_df: measured peaks (`storage.peaks_frame`), or None.
        spec_row: a spec-sheet row (`specs.spec_for`); ``None`` looks one up per row's ``device_name``.
        bytes_model: ``traffic`` (eager estimate, default) or ``min`` for ``intensity_flop_per_byte``.
        count_missing: count FLOPs/bytes of models (on the meta device) when not known yet.
    """
    df = results_df.copy()
    rows = [_roofline_row(r, peaks_df, spec_row, bytes_model, count_missing) for _, r in df.iterrows()]
    for k in ROOFLINE_COLUMNS:
        df[k] = [row[k] for row in rows]
    return df


ROOFLINE_COLUMNS = (
    "roofline_flops_per_image",
    "achieved_tflops",
    "achieved_tflops_pipelined",
    "bytes_per_batch",
    "min_bytes_per_batch",
    "intensity_flop_per_byte",
    "intensity_min_flop_per_byte",
    "peak_tflops_spec",
    "peak_tflops_measured",
    "bandwidth_gb_s_spec",
    "bandwidth_gb_s_measured",
    "fraction_of_spec_peak",
    "fraction_of_measured_peak",
    "bound",
)


def _roofline_row(r: Any, peaks_df, spec_row, bytes_model: str, count_missing: bool) -> dict[str, Any]:
    """`add_roofline_columns`'s columns of one result row."""
    import numpy as np

    from deepgap.roofline.specs import spec_for

    mode = r.get("mode", "infer") or "infer"
    prec = str(r["precision"])
    cost = None
    if count_missing:
        try:
            cost = model_cost(str(r["model"]), int(r["resolution"]), mode)
        except Exception:  # an unknown or uncountable model: leave the columns empty
            cost = None
    b = int(r["batch_size"])
    fpi = cost.flops_per_image if cost else r.get("flops_per_image", np.nan)
    fpi = np.nan if fpi is None else float(fpi)
    size_prec = prec if prec in PRECISION_TABLE else "fp32"
    tb = cost.traffic_bytes(b, size_prec) if cost else np.nan
    mb = cost.min_bytes(b, size_prec) if cost else np.nan
    ach = achieved_tflops(fpi, r.get("throughput_ips"))
    srow = spec_row if spec_row is not None else spec_for(str(r.get("device_name", "")))
    spec_c = ceiling_from_spec(srow, prec)
    meas_c = ceiling_from_peaks(peaks_df, prec, r.get("device_name"))
    ai = fpi * b / (tb if bytes_model == "traffic" else mb) if (tb == tb and mb == mb) else np.nan
    ref = meas_c or spec_c
    return {
        "roofline_flops_per_image": fpi,
        "achieved_tflops": ach,
        "achieved_tflops_pipelined": achieved_tflops(fpi, r.get("throughput_pipelined_ips")),
        "bytes_per_batch": tb,
        "min_bytes_per_batch": mb,
        "intensity_flop_per_byte": ai,
        "intensity_min_flop_per_byte": fpi * b / mb if mb == mb and mb else np.nan,
        "peak_tflops_spec": spec_c.peak_tflops if spec_c else np.nan,
        "peak_tflops_measured": meas_c.peak_tflops if meas_c else np.nan,
        "bandwidth_gb_s_spec": spec_c.bandwidth_gb_s if spec_c else np.nan,
        "bandwidth_gb_s_measured": meas_c.bandwidth_gb_s if meas_c else np.nan,
        "fraction_of_spec_peak": fraction(ach, spec_c.peak_tflops if spec_c else None),
        "fraction_of_measured_peak": fraction(ach, meas_c.peak_tflops if meas_c else None),
        "bound": bound(ai, ref) if ref is not None and ai == ai else "",
    }


def model_cost(name: str, resolution: int, mode: str = "infer") -> ModelCost:
    """`cost.known`, else `deepgap.roofline.flops.model_cost` (counted in torch): the parent's way to a cost."""
    from deepgap.roofline.cost import known

    found = known(name, resolution, mode)
    if found is not None:
        return found
    from deepgap.roofline.flops import model_cost as count

    return count(name, int(resolution), mode)
