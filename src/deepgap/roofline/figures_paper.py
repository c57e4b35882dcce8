"""The roofline study's figures beside deepgap's: theoretical vs measured time, the seed paper's roofline.

Why apart from `deepgap.roofline.figures`: those draw what deepgap measured on its ceilings; these set it
beside the roofline study's numbers (`data/roofline_study.csv`), a comparison with its own tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.roofline import model as rm
from deepgap.roofline.figures import MARKERS, _axes_labels, _figure

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def theoretical_vs_measured(
    profiles_df: pd.DataFrame | None = None,
    results_df: pd.DataFrame | None = None,
    peaks_df: pd.DataFrame | None = None,
    spec_row: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """The paper's table "theoretical time vs measured time", per configuration and ceiling (spec, measured).

    Columns: `TVM_COLUMNS`: model, mode, engine, precision, batch_size, device_name, flops_per_step,
    bytes_per_step (eager traffic at the precision's bytes per element: 1 for int8/fp8), min_bytes_per_step,
    ceiling, peak_tflops, bandwidth_gb_s, theoretical_compute_s (FLOPs / peak, the paper's eq. 6),
    theoretical_memory_s (eager-traffic bytes / bandwidth), theoretical_s (the larger), limiter, floor_s
    (FLOPs / peak or fewest bytes / bandwidth, the larger), measured_s, measured_over_theoretical,
    achieved_tflops, fraction_of_peak, flagged and flags. Inference rows come from ``results_df`` (one per
    result: a batch's median latency is the measured time), profile rows from ``profiles_df``.

    Why flags: eager traffic (every op reads its inputs and writes its outputs) is what unfused PyTorch
    moves; an engine that fuses (quant, compile, TensorRT) moves less, so its time can fall below
    ``theoretical_s``. Such a row is flagged, never shown as a plain ratio below 1; one below ``floor_s``
    (which no engine can beat) is flagged as a number that cannot be true.
    """
    import pandas as pd

    from deepgap.roofline.specs import spec_for

    rows = []
    for it in _measured_steps(profiles_df, results_df):
        srow = spec_row if spec_row is not None else spec_for(str(it["device_name"]))  # no frame per row
        rows += [_tvm_row(it, c) for c in rm.ceilings(it["precision"], peaks_df, srow, it["device_name"])]
    return pd.DataFrame(rows, columns=list(TVM_COLUMNS))


TVM_COLUMNS = (
    "model",
    "mode",
    "engine",
    "precision",
    "batch_size",
    "device_name",
    "flops_per_step",
    "bytes_per_step",
    "min_bytes_per_step",
    "ceiling",
    "peak_tflops",
    "bandwidth_gb_s",
    "theoretical_compute_s",
    "theoretical_memory_s",
    "theoretical_s",
    "limiter",
    "floor_s",
    "measured_s",
    "measured_over_theoretical",
    "achieved_tflops",
    "fraction_of_peak",
    "flagged",
    "flags",
)
BELOW_FLOOR = "measured below the floor (FLOPs / peak, fewest bytes / bandwidth): cannot be true"
BELOW_EAGER = (
    "measured below the eager-traffic bound: a fusing engine moves fewer bytes than eager PyTorch's ops, "
    "so that bound does not hold for it"
)


def _tvm_row(it: dict[str, Any], c: rm.Ceiling) -> dict[str, Any]:
    """`theoretical_vs_measured`'s row of one measured step against one ceiling, flagged where it beats a bound."""
    t = rm.theoretical_time(it["flops_per_step"], c.peak_tflops, it["bytes_per_step"], c.bandwidth_gb_s)
    floor = rm.theoretical_time(
        it["flops_per_step"], c.peak_tflops, it["min_bytes_per_step"], c.bandwidth_gb_s
    ).bound_s
    measured = it["measured_s"]
    ach = it["flops_per_step"] / measured / 1e12 if measured else float("nan")
    flags = []
    if measured is not None and measured == measured:
        if floor == floor and measured < floor:
            flags.append(BELOW_FLOOR)
        elif t.bound_s == t.bound_s and measured < t.bound_s:
            flags.append(BELOW_EAGER)
    return {
        **it,
        "ceiling": c.source,
        "peak_tflops": c.peak_tflops,
        "bandwidth_gb_s": c.bandwidth_gb_s,
        "theoretical_compute_s": t.compute_s,
        "theoretical_memory_s": t.memory_s,
        "theoretical_s": t.bound_s,
        "limiter": t.limiter,
        "floor_s": floor,
        "measured_over_theoretical": measured / t.bound_s if t.bound_s else float("nan"),
        "achieved_tflops": ach,
        "fraction_of_peak": rm.fraction(ach, c.peak_tflops),
        "flagged": bool(flags),
        "flags": flags,
    }


def _measured_steps(
    profiles_df: pd.DataFrame | None, results_df: pd.DataFrame | None
) -> list[dict[str, Any]]:
    """One item per measured step: profiles' training/inference steps, then results' inference batches."""
    from deepgap.roofline.model import model_cost

    items: list[dict[str, Any]] = []
    if profiles_df is not None and len(profiles_df):
        for _, r in profiles_df[profiles_df["status"] == "ok"].iterrows():
            items.append(
                dict(
                    model=r["model"],
                    mode=r["mode"],
                    engine="eager",  # `deepgap profile` times eager PyTorch steps
                    precision=r["precision"],
                    batch_size=int(r["batch_size"]),
                    device_name=r.get("device_name", ""),
                    flops_per_step=r["flops_per_step"],
                    bytes_per_step=r["bytes_per_step"],
                    min_bytes_per_step=_num(r.get("min_bytes_per_step")),
                    measured_s=r["step_time_median_s"],
                )
            )
    if results_df is not None and len(results_df):
        for _, r in results_df[results_df["status"] == "ok"].iterrows():
            try:
                cost = model_cost(str(r["model"]), int(r["resolution"]), "infer")
            except Exception:
                continue
            b = int(r["batch_size"])
            prec = r["precision"] if r["precision"] in rm.PRECISIONS else "fp32"
            items.append(
                dict(
                    model=r["model"],
                    mode="infer",
                    engine=r.get("engine", ""),
                    precision=r["precision"],
                    batch_size=b,
                    device_name=r.get("device_name", ""),
                    flops_per_step=cost.flops(b),
                    bytes_per_step=cost.traffic_bytes(b, prec),  # the precision's itemsize: int8/fp8 1 byte
                    min_bytes_per_step=cost.min_bytes(b, prec),
                    measured_s=r["latency_median_s"],
                )
            )
    return items


def _num(v: Any) -> float:
    """A stored number as a float; NaN where there is none (an older profile without its fewest bytes)."""
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


PAPER_KEPT = (
    "model",
    "gpu",
    "batch_size",
    "steps_averaged",
    "step_gflop_reported",
    "peak_fp32_tflops",
    "bandwidth_gb_s",
    "dram_gb_s",
    "gflop_s",
    "intensity_flop_per_byte",
)


def paper_reference_table() -> pd.DataFrame:
    """The paper's T4/L4/V100 training-step rows (`deepgap.roofline.specs.load_study`), every time in ms.

    Why in ms, each column named so: the study printed its theoretical times as seconds that are
    milliseconds (270 GFLOP / 8.1 TFLOP/s is 33 ms; it printed "33.33 s") beside measured step times in
    seconds, and this table held both under ``_s`` names. Here ``measured_time_ms`` is the measured step,
    ``theoretical_time_ms`` its eq. 6 recomputed (FLOPs / peak) and ``theoretical_time_printed_ms`` the
    number it printed, which is that time in ms (the paper's "s" is the error).
    """
    from deepgap.roofline.specs import load_study

    df = load_study()
    out = df[list(PAPER_KEPT)].copy()
    out["measured_time_ms"] = df["measured_time_s"] * 1e3
    out["theoretical_time_ms"] = df["theoretical_time_s_recomputed"] * 1e3
    out["theoretical_time_printed_ms"] = df["theoretical_time_s_printed"]  # printed as "s"; its values are ms
    for c in ("implied_gflop_per_step", "implied_gflop_per_image", "source"):
        out[c] = df[c]
    return out


def paper_roofline_figure() -> Figure:
    """The paper's Fig. 1 redrawn from its own table: three FP32 rooflines and its nine model points."""
    import numpy as np

    df = paper_reference_table()
    fig, (ax,) = _figure()
    colors = {"NVIDIA T4": "#1f77b4", "NVIDIA L4": "#d62728", "NVIDIA V100": "#2ca02c"}
    xs = np.logspace(-1, 3, 200)
    for gpu, g in df.groupby("gpu", sort=False):
        peak, bw = float(g["peak_fp32_tflops"].iloc[0]), float(g["bandwidth_gb_s"].iloc[0])
        ax.plot(
            xs,
            rm.attainable_tflops(xs, peak, bw),
            "--",
            color=colors.get(gpu, "k"),
            label=f"{gpu} spec fp32: {peak} TFLOP/s, {bw:.0f} GB/s",
        )
    models = list(dict.fromkeys(df["model"]))
    for _, r in df.iterrows():
        ax.scatter(
            r["intensity_flop_per_byte"],
            r["gflop_s"] / 1e3,
            color=colors.get(r["gpu"], "k"),
            marker=MARKERS[models.index(r["model"])],
            edgecolor="k",
            s=45,
            zorder=3,
        )
    for i, m in enumerate(models):
        ax.scatter([], [], marker=MARKERS[i], color="w", edgecolor="k", label=m)
    _axes_labels(
        ax,
        "The paper's training step (T4/L4/V100, ncu CUDA-core FLOPs; tensor-core work not counted)",
        "Arithmetic intensity (FLOP/byte, DRAM)",
    )
    ax.legend(fontsize=6, loc="lower right")
    return fig
