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

    Columns: model, mode, precision, batch_size, device_name, flops_per_step, bytes_per_step, ceiling,
    peak_tflops, bandwidth_gb_s, theoretical_compute_s (FLOPs / peak, the paper's eq. 6), theoretical_memory_s
    (bytes / bandwidth), theoretical_s (the larger), limiter, measured_s, measured_over_theoretical,
    achieved_tflops, fraction_of_peak. Inference rows come from ``results_df`` (one per result: a batch's
    median latency is the measured time), profile rows from ``profiles_df``.
    """
    import pandas as pd

    from deepgap.roofline.specs import spec_for

    items = _measured_steps(profiles_df, results_df)
    rows = []
    for it in items:
        srow = spec_row if spec_row is not None else spec_for(str(it["device_name"]))  # no frame per row
        for c in rm.ceilings(it["precision"], peaks_df, srow, it["device_name"]):
            t = rm.theoretical_time(
                it["flops_per_step"], c.peak_tflops, it["bytes_per_step"], c.bandwidth_gb_s
            )
            ach = it["flops_per_step"] / it["measured_s"] / 1e12 if it["measured_s"] else float("nan")
            rows.append(
                {
                    **it,
                    "ceiling": c.source,
                    "peak_tflops": c.peak_tflops,
                    "bandwidth_gb_s": c.bandwidth_gb_s,
                    "theoretical_compute_s": t.compute_s,
                    "theoretical_memory_s": t.memory_s,
                    "theoretical_s": t.bound_s,
                    "limiter": t.limiter,
                    "measured_over_theoretical": it["measured_s"] / t.bound_s if t.bound_s else float("nan"),
                    "achieved_tflops": ach,
                    "fraction_of_peak": rm.fraction(ach, c.peak_tflops),
                }
            )
    cols = [
        "model",
        "mode",
        "precision",
        "batch_size",
        "device_name",
        "flops_per_step",
        "bytes_per_step",
        "ceiling",
        "peak_tflops",
        "bandwidth_gb_s",
        "theoretical_compute_s",
        "theoretical_memory_s",
        "theoretical_s",
        "limiter",
        "measured_s",
        "measured_over_theoretical",
        "achieved_tflops",
        "fraction_of_peak",
    ]
    return pd.DataFrame(rows, columns=cols)


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
                    precision=r["precision"],
                    batch_size=int(r["batch_size"]),
                    device_name=r.get("device_name", ""),
                    flops_per_step=r["flops_per_step"],
                    bytes_per_step=r["bytes_per_step"],
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
                    precision=r["precision"],
                    batch_size=b,
                    device_name=r.get("device_name", ""),
                    flops_per_step=cost.flops(b),
                    bytes_per_step=cost.traffic_bytes(b, prec),
                    measured_s=r["latency_median_s"],
                )
            )
    return items


def paper_reference_table() -> pd.DataFrame:
    """The paper's T4/L4/V100 training-step rows (see `deepgap.roofline.specs.load_study`)."""
    from deepgap.roofline.specs import load_study

    return load_study()


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
