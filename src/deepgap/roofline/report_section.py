"""The report's roofline section: model- and cluster-level rooflines, the paper's comparison, its table.

Drawn by `deepgap.roofline.figures` (matplotlib figures and DataFrames) and wrapped here into the
report's `Figure` records and tables, the way `deepgap.serving.show.report_section` does for serving.
The inference roofline needs only ordinary results (FLOPs per image are stored with each), so it
appears for every GPU or CPU run; cluster rooflines and the training step need `deepgap profile`
runs, measured ceilings need `deepgap peaks` (the spec sheet is used without them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.render.draw import Figure, drawn_figure, pending_figure
from deepgap.render.formatting import fmt_list, fmt_ms, fmt_num
from deepgap.render.sections import Parts, ReportContext, Section, register

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store


def _sig(col: str, digits: int = 4):
    return lambda r: fmt_num(r.get(col), f".{digits}g")


TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "roofline_theory_vs_measured": (
        "Theoretical time (FLOPs / peak, eager-traffic bytes / bandwidth, the larger) vs measured time — the "
        "paper's table, by ceiling; bytes at the precision's size (int8, fp8: 1 byte an element); a time below "
        "the eager bound (a fusing engine) or below the floor (fewest bytes) is flagged",
        [
            ("model", "model"),
            ("mode", "mode"),
            ("engine", "engine"),
            ("precision", "precision"),
            ("batch", "batch_size"),
            ("device", "device_name"),
            ("ceiling", "ceiling"),
            ("peak TFLOP/s", _sig("peak_tflops")),
            ("GB/s", _sig("bandwidth_gb_s")),
            ("theoretical ms (eager bytes)", lambda r: fmt_ms(r.get("theoretical_s"))),
            ("limiter", "limiter"),
            ("floor ms (fewest bytes)", lambda r: fmt_ms(r.get("floor_s"))),
            ("measured ms", lambda r: fmt_ms(r.get("measured_s"))),
            ("measured / theoretical", _sig("measured_over_theoretical", 3)),
            ("achieved TFLOP/s", _sig("achieved_tflops")),
            ("fraction of peak", _sig("fraction_of_peak", 3)),
            ("flags", lambda r: fmt_list(r.get("flags"))),
        ],
    ),
    "roofline_peaks": (
        "Measured ceilings of the device (deepgap peaks)",
        [
            ("device", "device_name"),
            ("ceiling", "name"),
            ("kind", "kind"),
            ("value", _sig("value")),
            ("unit", "unit"),
            ("status", "status"),
            ("reason", "reason"),
            ("run", "run_id"),
        ],
    ),
    "roofline_paper_reference": (
        "The paper's training-step rows (T4, L4, V100), for comparison — every time in ms (the paper printed "
        "its theoretical times as seconds: they are milliseconds, 270 GFLOP / 8.1 TFLOP/s = 33 ms)",
        [
            ("model", "model"),
            ("GPU", "gpu"),
            ("batch", "batch_size"),
            ("steps averaged", "steps_averaged"),
            ("GFLOP per step (reported)", _sig("step_gflop_reported")),
            ("peak fp32 TFLOP/s", _sig("peak_fp32_tflops")),
            ("bandwidth GB/s", _sig("bandwidth_gb_s")),
            ("DRAM GB/s", _sig("dram_gb_s")),
            ("GFLOP/s", _sig("gflop_s")),
            ("FLOP/byte", _sig("intensity_flop_per_byte")),
            ("measured ms", _sig("measured_time_ms")),
            ("theoretical ms (FLOPs / peak)", _sig("theoretical_time_ms")),
            ("theoretical ms as printed (printed as s)", _sig("theoretical_time_printed_ms")),
            ("implied GFLOP per step", _sig("implied_gflop_per_step")),
            ("implied GFLOP per image", _sig("implied_gflop_per_image")),
            ("source", "source"),
        ],
    ),
}


def section(
    store_path: str | Store, run_ids: list[str] | None = None, interactive: bool = True
) -> tuple[dict[str, pd.DataFrame], list[Figure]]:
    """Roofline tables and figures of ``store_path`` (nothing when it holds no successful result or profile).

    ``store_path``: a path, or the report build's open `Store` (`deepgap.store.reading`). ``interactive``:
    the model-level and cluster rooflines also get their plotly versions (`deepgap.roofline.interactive`).
    """
    from deepgap.roofline import figures_paper as rfp
    from deepgap.roofline import storage
    from deepgap.store import reading

    with reading(store_path) as st:
        results = st.results_frame(run_ids)
        peaks = storage.peaks_frame(st, run_ids)
        profiles = storage.profiles_frame(st, run_ids)
        kernels = (
            storage.kernels_frame(st, [int(p) for p in profiles["profile_id"]]) if len(profiles) else None
        )
    ok = results[results["status"] == "ok"] if len(results) else results
    if not len(ok) and not len(profiles):
        return {}, []
    figs = _measured_figures(_with_roofline_columns(ok, peaks), peaks, profiles, kernels, interactive)
    figs.append(
        drawn_figure(
            "fig_roofline_paper",
            "The paper's roofline (T4, L4, V100)",
            "The roofline study's Fig. 1 redrawn from its own published table, beside ours.",
            rfp.paper_roofline_figure,
        )
    )
    paper = rfp.paper_reference_table()
    tvm = rfp.theoretical_vs_measured(profiles if len(profiles) else None, ok, peaks)
    out = {
        "roofline_theory_vs_measured": tvm,
        "roofline_peaks": peaks.drop(columns=["details"], errors="ignore"),
        "roofline_paper_reference": paper,
    }
    return {k: v for k, v in out.items() if len(v)}, figs


def _with_roofline_columns(ok: pd.DataFrame, peaks: pd.DataFrame) -> pd.DataFrame:
    """``ok`` with its roofline columns, computed once for the PNG and the plotly figure (each did it).

    On a failure, ``ok`` as it is: each figure then computes them itself and says why it cannot be drawn.
    """
    from deepgap.roofline import model as rm

    if not len(ok):
        return ok
    try:
        return rm.add_roofline_columns(ok, peaks)
    except Exception:  # noqa: BLE001 — the figures report it (`drawn_figure`)
        return ok


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build (its tables' columns: `TABLE_SPECS`)."""
    found, figs = section(ctx.source, ctx.run_ids, ctx.interactive)
    return Parts(found, figs)


SECTION = register(Section("roofline", 20, build, TABLE_SPECS))


def _measured_figures(placed, peaks, profiles, kernels, interactive: bool) -> list[Figure]:
    """The inference roofline, and the training-step and kernel-cluster ones where profiles hold them."""
    from deepgap.roofline import figures as rf
    from deepgap.roofline import interactive as ri

    infer = profiles[profiles["mode"] == "infer"] if len(profiles) else profiles
    train = profiles[profiles["mode"] == "train"] if len(profiles) else profiles
    inference, training = rf.Frames(placed, peaks, infer), rf.Frames(None, peaks, train)
    clusters = rf.Frames(peaks=peaks, profiles=profiles, kernels=kernels)
    figs = [
        pending_figure(
            "fig_roofline_inference",
            "Inference roofline",
            "Every measured configuration at its arithmetic intensity and achieved TFLOP/s, under the device's "
            "spec-sheet ceilings and, where `deepgap peaks` ran, its measured ones.",
            lambda: rf.roofline_figure(inference, title="Inference roofline"),
        ),
    ]
    if interactive:  # every point hoverable (an interactive page then draws no PNG of it)
        figs[0].attach_plotly(lambda: ri.roofline_spec(inference))
    if len(train):
        figs.append(
            pending_figure(
                "fig_roofline_train",
                "Training-step roofline",
                "Forward + backward + optimizer step (deepgap profile --mode train).",
                lambda: rf.roofline_figure(training, title="Training-step roofline"),
            )
        )
        if interactive:
            figs[-1].attach_plotly(lambda: ri.roofline_spec(training))
    if kernels is not None and len(kernels):
        figs.append(
            pending_figure(
                "fig_roofline_clusters",
                "Kernel-cluster roofline",
                "Per profile, the kernels grouped into clusters (convolution, GEMM, elementwise, "
                "normalization, pooling, copy) at their attributed FLOPs and bytes; marker area: the "
                "cluster's share of the step's time.",
                lambda: rf.cluster_roofline_figure(clusters, source="torch"),
            )
        )
        if interactive:
            figs[-1].attach_plotly(lambda: ri.cluster_roofline_spec(clusters, source="torch"))
    return figs
