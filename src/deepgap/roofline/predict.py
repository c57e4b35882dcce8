"""The throughput ratio the roofline predicts between two platforms, beside the one measured.

Why: the H200 has the H100's tensor cores and 1.43× its bandwidth (datasheet). A configuration left of
the ridge point (memory-bound) should gain about the bandwidth ratio, one right of it (compute-bound)
about the compute ratio (≈ 1). The roofline gives each side's attainable rate,
``min(peak, AI × bandwidth)``, at the configuration's arithmetic intensity AI; both sides run the same
FLOPs per image, so the predicted throughput ratio A/B is ``attainable_A / attainable_B``. Where the
measured ratio's 95% CI excludes that prediction's range, the configuration ``departs`` from the
roofline (it runs at a different fraction of its roof on the two GPUs: launch-bound at small batches,
power-capped, a different kernel choice). The prediction's range (``predicted_ratio_low``/``_high``)
carries the measured ceilings' own spread: each ceiling's lowest and highest value over its timed
repeats (``details.per_call_s``); a datasheet value is a point.

Ceilings per side: the measured ones (``deepgap peaks``, in the store) when *both* platforms have them for
the precision and for memory, else the datasheet's (``data/gpu_specs.csv``) when both sides are in it,
else no prediction; ``roofline_source`` says which. Mixing a measured side with a datasheet side would
bias the ratio by the measured fraction of peak (~70–90%), so it is never done.

Intensity: FLOPs per image × batch over the eager-traffic bytes of a batch (`flops.ModelCost`, every
non-view op reads its inputs and writes its outputs once, in the precision's element size). Compiled
and graph engines fuse some of that traffic away, which moves a configuration right on the roofline:
the ``bound`` column is the eager estimate's verdict.

A whole-model intensity averages compute-bound convolutions with memory-bound elementwise ops, so a
second prediction applies the roofline per op and sums the times (``predicted_ratio_per_op``, with each
side's ``memory_time_share``: the share of that time in ops left of their ridge). It uses the same
ceilings and the same eager op list; it is the finer model, the whole-model one is the textbook one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepgap.core.precision import PRECISIONS as PRECISION_TABLE
from deepgap.roofline.model import BANDWIDTH_NAME, PRECISIONS, ridge_point

if TYPE_CHECKING:
    import pandas as pd

# (model, resolution, batch, precision) → FLOP per byte
IntensityFn = Callable[[str, int, int, str], float]
# (model, resolution) → per-op arrays (FLOPs at batch 1, at batch 2, elements moved at batch 1, at batch 2)
OpCostsFn = Callable[[str, int], tuple[Any, Any, Any, Any]]
PREDICT_COLUMNS = [
    "intensity_a",
    "intensity_b",
    "ridge_a",
    "ridge_b",
    "bound_a",
    "bound_b",
    "bound",
    "attainable_tflops_a",
    "attainable_tflops_b",
    "predicted_ratio",
    "predicted_ratio_low",
    "predicted_ratio_high",
    "predicted_ratio_per_op",
    "memory_time_share_a",
    "memory_time_share_b",
    "roofline_source",
    "measured_over_predicted",
    "departs",
]


def eager_intensity(model: str, resolution: int, batch: int, precision: str) -> float:
    """Eager-traffic arithmetic intensity of one batch (`flops.model_cost`, counted on the meta device)."""
    from deepgap.roofline.cost import ITEMSIZE_BYTES
    from deepgap.roofline.model import model_cost

    prec = precision if precision in ITEMSIZE_BYTES else "fp32"
    return model_cost(model, int(resolution)).intensity(int(batch), prec)


@functools.lru_cache(maxsize=16)
def eager_op_costs(model: str, resolution: int) -> tuple[Any, Any, Any, Any]:
    """Per-op FLOPs and read+write elements of one inference pass at batch 1 and 2 (`flops.op_costs`)."""
    from deepgap.roofline.flops import op_costs

    return op_costs(model, resolution)


def per_op_time(
    costs: tuple[Any, Any, Any, Any], batch: int, precision: str, peak_tflops: float, bandwidth_gb_s: float
) -> tuple[float, float]:
    """(Σ over ops of max(FLOPs / peak, bytes / bandwidth) in seconds, share of it in memory-bound ops).

    Per-op counts are linear in the batch (weights are the fixed part): batch b = c1 + (b − 1)(c2 − c1).
    """
    import numpy as np

    from deepgap.roofline.cost import ITEMSIZE_BYTES

    f1, f2, e1, e2 = (np.asarray(c, dtype=float) for c in costs)
    flops = f1 + (batch - 1) * (f2 - f1)
    nbytes = (e1 + (batch - 1) * (e2 - e1)) * ITEMSIZE_BYTES.get(precision, 4)
    t_c, t_m = flops / (peak_tflops * 1e12), nbytes / (bandwidth_gb_s * 1e9)
    t = np.maximum(t_c, t_m)
    total = float(t.sum())
    return total, float(t[t_m > t_c].sum() / total) if total > 0 else float("nan")


@dataclass
class Roof:
    """One platform's ceilings: measured (``deepgap peaks``) and datasheet, by name (TFLOP/s or GB/s)."""

    platform: str
    measured: dict[str, float] = field(default_factory=dict)
    datasheet: dict[str, float] = field(default_factory=dict)
    datasheet_gpu: str = ""  # the gpu_specs.csv row matched, e.g. "NVIDIA H200 SXM"
    measured_runs: list[str] = field(default_factory=list)
    measured_range: dict[str, tuple[float, float]] = field(default_factory=dict)  # over timed repeats

    def has(self, source: str, precision: str) -> bool:
        """Whether ``source`` (measured | datasheet) has a compute peak for ``precision`` and a bandwidth."""
        vals = self.measured if source == "measured" else self.datasheet
        return precision in vals and BANDWIDTH_NAME in vals

    def ceiling(self, source: str, precision: str) -> tuple[float, float]:
        """(peak TFLOP/s, bandwidth GB/s) from ``source``."""
        vals = self.measured if source == "measured" else self.datasheet
        return vals[precision], vals[BANDWIDTH_NAME]

    def ceiling_range(self, source: str, precision: str) -> tuple[tuple[float, float], tuple[float, float]]:
        """((lowest peak, lowest bandwidth), (highest peak, highest bandwidth)); datasheet: the point."""
        point = self.ceiling(source, precision)
        if source != "measured":
            return point, point
        (p_lo, p_hi), (b_lo, b_hi) = (
            self.measured_range.get(n, (v, v)) for n, v in ((precision, point[0]), (BANDWIDTH_NAME, point[1]))
        )
        return (p_lo, b_lo), (p_hi, b_hi)


def _repeat_range(value: float, details: Any) -> tuple[float, float]:
    """Lowest and highest value over a ceiling's timed repeats (value ∝ 1 / seconds per call)."""
    per_call = details.get("per_call_s") if isinstance(details, dict) else None
    try:
        t = sorted(float(x) for x in per_call or [] if float(x) > 0)
    except (TypeError, ValueError):
        t = []
    if not t:
        return value, value
    med = t[len(t) // 2] if len(t) % 2 else 0.5 * (t[len(t) // 2 - 1] + t[len(t) // 2])
    return value * med / t[-1], value * med / t[0]


def roof_of(platform: str, peaks_df: pd.DataFrame | None = None) -> Roof:
    """The ceilings of ``platform``: measured peaks stored for exactly that device name, and its datasheet.

    Args:
        platform: a device name as `analysis.frame.prepare` derives it (torch's name, e.g. ``NVIDIA H200``).
        peaks_df: `roofline.storage.peaks_frame` of the store (any platforms; filtered here), or None.
    """
    from deepgap.roofline.specs import spec_for, spec_peak

    roof = Roof(platform)
    if peaks_df is not None and len(peaks_df) and "device_name" in peaks_df:
        df = peaks_df[(peaks_df["status"] == "ok") & (peaks_df["device_name"] == platform)]
        if "created_at" in df:
            df = df.sort_values("created_at")  # the latest measurement of a name wins
        for r in df.to_dict("records"):
            if r["value"] is not None and math.isfinite(float(r["value"])):
                roof.measured[str(r["name"])] = float(r["value"])
                roof.measured_range[str(r["name"])] = _repeat_range(float(r["value"]), r.get("details"))
        roof.measured_runs = sorted({str(r) for r in df["run_id"]})
    spec = spec_for(platform)
    if spec is not None:
        roof.datasheet_gpu = str(spec.get("gpu", ""))
        for name in (*PRECISIONS, BANDWIDTH_NAME):
            v = spec_peak(spec, name)
            if v is not None:
                roof.datasheet[name] = v
    return roof


def pair_source(a: Roof, b: Roof, precision: str) -> str | None:
    """``measured`` when both sides measured ``precision`` and memory, else ``datasheet`` if both have it."""
    for source in ("measured", "datasheet"):
        if a.has(source, precision) and b.has(source, precision):
            return source
    return None


def predicted_ratio(
    intensity_a: float, intensity_b: float, ceiling_a: tuple[float, float], ceiling_b: tuple[float, float]
) -> dict[str, Any]:
    """Roofline throughput ratio A/B of one configuration pair, with each side's bound.

    Each ceiling is (peak TFLOP/s, bandwidth GB/s); intensities in FLOP/byte. A side is ``memory``-bound
    left of its ridge point, ``compute``-bound at or right of it.
    """
    out: dict[str, Any] = {"intensity_a": intensity_a, "intensity_b": intensity_b}
    att = []
    for side, ai, (peak, bw) in (("a", intensity_a, ceiling_a), ("b", intensity_b, ceiling_b)):
        ridge = ridge_point(peak, bw)
        att.append(min(peak, ai * bw / 1e3))
        out[f"ridge_{side}"] = ridge
        out[f"bound_{side}"] = "memory" if ai < ridge else "compute"
        out[f"attainable_tflops_{side}"] = att[-1]
    out["predicted_ratio"] = att[0] / att[1] if att[1] > 0 else float("nan")
    out["bound"] = (
        out["bound_a"] if out["bound_a"] == out["bound_b"] else f"{out['bound_a']}/{out['bound_b']}"
    )
    return out


def _per_op(op_costs: OpCostsFn, r: dict[str, Any], bs_a: int, bs_b: int, ceil_a, ceil_b) -> dict[str, Any]:
    """The per-op roofline's throughput ratio (batch / summed op time) and memory-time shares, or nothing."""
    try:
        costs = op_costs(str(r["model"]), int(r["resolution"]))
        t_a, share_a = per_op_time(costs, bs_a, str(r["precision"]), *ceil_a)
        t_b, share_b = per_op_time(costs, bs_b, str(r["precision"]), *ceil_b)
        ratio = (bs_a / t_a) / (bs_b / t_b)
    except Exception:  # noqa: BLE001 — a model the counter cannot run: the finer prediction is missing
        return {}
    return {"predicted_ratio_per_op": ratio, "memory_time_share_a": share_a, "memory_time_share_b": share_b}


def _empty(reason: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(PREDICT_COLUMNS, float("nan"))
    row.update(bound_a="", bound_b="", bound="", roofline_source=reason, departs=None)
    return row


def add_predictions(
    pairs: pd.DataFrame,
    roofs: dict[str, Roof],
    intensity: IntensityFn | None = None,
    op_costs: OpCostsFn | None = None,
) -> pd.DataFrame:
    """`PREDICT_COLUMNS` added to a frame of `analysis.compare` pairs (matched or best batch); a copy.

    ``departs`` is True where the prediction's range (``predicted_ratio_low``…``_high``) and the measured
    ratio's 95% CI (``speedup_ci_low``…``speedup_ci_high``) do not overlap, False where they do, None
    without a CI or a prediction.
    ``intensity`` defaults to `eager_intensity`, counted only for pairs whose platforms both have ceilings.
    """
    import pandas as pd

    intensity = intensity or eager_intensity
    op_costs = op_costs or eager_op_costs
    df = pairs.copy()
    if df.empty:
        for c in PREDICT_COLUMNS:
            df[c] = pd.Series(dtype=object)
        return df
    rows = []
    for r in df.to_dict("records"):
        a, b = roofs.get(str(r.get("platform_a"))), roofs.get(str(r.get("platform_b")))
        prec = str(r["precision"])
        source = pair_source(a, b, prec) if a is not None and b is not None else None
        if source is None:
            rows.append(_empty(f"none: no {prec} and memory ceilings for both platforms"))
            continue
        try:  # matched pairs share one batch_size; best-batch pairs have one per side
            bs_a, bs_b = (int(r.get(f"batch_size_{s}", r.get("batch_size"))) for s in "ab")
            ai_a = float(intensity(str(r["model"]), int(r["resolution"]), bs_a, prec))
            ai_b = float(intensity(str(r["model"]), int(r["resolution"]), bs_b, prec))
        except Exception as exc:  # a model the counter cannot build: no prediction, and why
            rows.append(_empty(f"none: intensity unavailable ({type(exc).__name__})"))
            continue
        row = predicted_ratio(ai_a, ai_b, a.ceiling(source, prec), b.ceiling(source, prec))
        (a_lo, a_hi), (b_lo, b_hi) = a.ceiling_range(source, prec), b.ceiling_range(source, prec)
        row["predicted_ratio_low"] = predicted_ratio(ai_a, ai_b, a_lo, b_hi)["predicted_ratio"]
        row["predicted_ratio_high"] = predicted_ratio(ai_a, ai_b, a_hi, b_lo)["predicted_ratio"]
        label = (
            "measured peaks (deepgap peaks) of both"
            if source == "measured"
            else f"datasheet: {a.datasheet_gpu} vs {b.datasheet_gpu}"
        )
        row["roofline_source"] = label
        row.update(_per_op(op_costs, r, bs_a, bs_b, a.ceiling(source, prec), b.ceiling(source, prec)))
        pred, lo, hi = row["predicted_ratio"], r.get("speedup_ci_low"), r.get("speedup_ci_high")
        p_lo, p_hi = row["predicted_ratio_low"], row["predicted_ratio_high"]
        row["measured_over_predicted"] = float(r["speedup"]) / pred if pred and pred == pred else float("nan")
        finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (p_lo, p_hi, lo, hi))
        row["departs"] = bool(p_hi < lo or p_lo > hi) if finite else None  # the two ranges do not overlap
        rows.append(row)
    extra = pd.DataFrame(rows, index=df.index).reindex(columns=PREDICT_COLUMNS)
    for c in PREDICT_COLUMNS:
        df[c] = extra[c]
    return df


def ceilings_table(roofs: dict[str, Roof]) -> pd.DataFrame:
    """One row per platform and ceiling: measured value, datasheet value, measured/datasheet, unit.

    What the report shows as "each platform's measured ceilings"; a ceiling neither source has is left out.
    """
    import pandas as pd

    rows = []
    for p, roof in roofs.items():
        for name in (*PRECISIONS, BANDWIDTH_NAME):
            m, d = roof.measured.get(name), roof.datasheet.get(name)
            if m is None and d is None:
                continue
            rows.append(
                {
                    "platform": p,
                    "ceiling": name,
                    "unit": "GB/s" if name == BANDWIDTH_NAME else PRECISION_TABLE[name].peak_unit,
                    "measured": m,
                    "datasheet": d,
                    "measured_over_datasheet": m / d if m is not None and d else None,
                    "datasheet_gpu": roof.datasheet_gpu,
                    "measured_runs": ",".join(roof.measured_runs),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "platform",
            "ceiling",
            "unit",
            "measured",
            "datasheet",
            "measured_over_datasheet",
            "datasheet_gpu",
            "measured_runs",
        ],
    )
