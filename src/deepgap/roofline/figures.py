"""Roofline figures and the "theoretical vs measured time" table, as pure functions of DataFrames.

Each function takes frames (from `deepgap.store.Store.results_frame` and `deepgap.roofline.storage`) and
returns a matplotlib ``Figure`` (``matplotlib.figure.Figure``, no pyplot state) or a DataFrame; the report
renders them.
Spec ceilings are dashed, measured ceilings solid, one colour per precision; a figure that has nothing to show
says "unavailable: <why>" in its body instead of being empty. ``python -m deepgap.roofline.render STORE DIR``
writes every figure (PNG) and table (CSV) of a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepgap.core.precision import column
from deepgap.roofline import model as rm

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

PREC_COLORS = column("colour")  # the precision table's: the same colours as every other figure
CLUSTER_COLORS = {
    "convolution": "#1f77b4",
    "gemm": "#d62728",
    "attention": "#9467bd",
    "normalization": "#ff7f0e",
    "elementwise": "#2ca02c",
    "reduction": "#8c564b",
    "pooling": "#e377c2",
    "copy": "#7f7f7f",
    "optimizer": "#bcbd22",
    "other": "#17becf",
}
MARKERS = "osD^vP*Xh<>p"


@dataclass(frozen=True)
class Frames:
    """The stored frames a roofline figure reads, passed as one: what every function here takes.

    ``results``: `Store.results_frame` rows; ``peaks``, ``profiles``, ``kernels``: `deepgap.roofline.storage`'s
    frames; ``spec_row``: a `specs.spec_for` row (None: looked up from the frames' device name).
    """

    results: pd.DataFrame | None = None
    peaks: pd.DataFrame | None = None
    profiles: pd.DataFrame | None = None
    kernels: pd.DataFrame | None = None
    spec_row: dict[str, Any] | None = None


def _figure(w: float = 7.5, h: float = 5.0, ncols: int = 1, nrows: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [a for row in axes for a in row]


def _unavailable(ax, why: str) -> None:
    ax.text(0.5, 0.5, f"unavailable: {why}", ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_axis_off()


def _draw_ceilings(ax, ceilings: list[rm.Ceiling], x_lo: float, x_hi: float) -> None:
    import numpy as np

    xs = np.logspace(np.log10(x_lo), np.log10(x_hi), 200)
    for c in ceilings:
        style = "--" if c.source == "spec" else "-"
        ax.plot(
            xs,
            c.attainable_tflops(xs),
            style,
            color=PREC_COLORS.get(c.precision, "k"),
            lw=1.3,
            alpha=0.8,
            label=f"{c.label}: {c.peak_tflops:,.3g} TFLOP/s, {c.bandwidth_gb_s:,.4g} GB/s",
        )


def _spec_for_frame(df: pd.DataFrame, spec_row: dict[str, Any] | None) -> dict[str, Any] | None:
    from deepgap.roofline.specs import spec_for

    if spec_row is not None or df is None or len(df) == 0 or "device_name" not in df:
        return spec_row
    return spec_for(str(df["device_name"].iloc[0]))


def _axes_labels(ax, title: str, xlabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)


def roofline_points(f: Frames, bytes_model: str = "traffic") -> list[tuple]:
    """(model, precision, label, intensity, achieved TFLOP/s, kind) of every placeable configuration."""
    import numpy as np

    pts = []  # (model, precision, label, ai, tflops, marker-kind)
    if f.results is not None and len(f.results):
        ok = f.results[f.results["status"] == "ok"]
        if len(ok) and "intensity_flop_per_byte" not in ok:
            ok = rm.add_roofline_columns(ok, f.peaks, f.spec_row, bytes_model)
        for _, r in ok.iterrows():
            pts.append(
                (
                    r["model"],
                    r["precision"],
                    f"bs{int(r['batch_size'])}",
                    r["intensity_flop_per_byte"],
                    r["achieved_tflops"],
                    "infer",
                )
            )
    if f.profiles is not None and len(f.profiles):
        for _, r in f.profiles[f.profiles["status"] == "ok"].iterrows():
            b = r["min_bytes_per_step"] if bytes_model == "min" else r["bytes_per_step"]
            pts.append(
                (
                    r["model"],
                    r["precision"],
                    f"{r['mode']} bs{int(r['batch_size'])}",
                    r["flops_per_step"] / b if b else np.nan,
                    r["achieved_tflops"],
                    r["mode"],
                )
            )
    return [p for p in pts if p[3] == p[3] and p[4] == p[4] and p[3] > 0 and p[4] > 0]


def roofline_ceilings(pts: list[tuple], f: Frames) -> tuple[str | None, list[rm.Ceiling]]:
    """(device name, the ceilings of the points' precisions): the spec sheet's and, where measured, ours."""
    frame = f.results if f.results is not None and len(f.results) else f.profiles
    spec_row = _spec_for_frame(frame, f.spec_row)
    dev = (
        str(frame["device_name"].iloc[0])
        if frame is not None and "device_name" in frame and len(frame)
        else None
    )
    precs = sorted({p[1] for p in pts}, key=lambda x: rm.PRECISIONS.index(x) if x in rm.PRECISIONS else 99)
    return dev, [c for p in precs for c in rm.ceilings(p, f.peaks, spec_row, dev)]


def roofline_figure(f: Frames, *, bytes_model: str = "traffic", title: str | None = None) -> Figure:
    """Model-level roofline: every measured configuration at (intensity, achieved TFLOP/s) under its ceilings.

    Args:
        f: the frames: ``results`` (inference; failed rows are ignored, roofline columns are added with
            `deepgap.roofline.model.add_roofline_columns` when missing), ``peaks`` (measured ceilings),
            ``profiles`` (drawn as triangles: training steps and profiled passes).
        bytes_model: ``traffic`` (eager estimate) or ``min`` (lower bound) for the intensity axis.
        title: figure title.
    """
    fig, (ax,) = _figure()
    pts = roofline_points(f, bytes_model)
    if not pts:
        _unavailable(ax, "no successful configuration with FLOPs and bytes to place on a roofline")
        return fig
    dev, ceilings = roofline_ceilings(pts, f)
    ais = [p[3] for p in pts] + [c.ridge_flop_per_byte for c in ceilings]
    _draw_ceilings(ax, ceilings, min(ais) / 3, max(ais) * 3)
    models = sorted({p[0] for p in pts})
    groups: dict[tuple[str, str], list[tuple]] = {}  # one scatter per marker and colour, not one per point
    for p in pts:
        m = "^" if p[5] == "train" else MARKERS[models.index(p[0]) % len(MARKERS)]
        groups.setdefault((m, PREC_COLORS.get(p[1], "k")), []).append(p)
    for (m, colour), mine in groups.items():
        ax.scatter(
            [p[3] for p in mine],
            [p[4] for p in mine],
            marker=m,
            color=colour,
            edgecolor="k",
            lw=0.4,
            s=42,
            zorder=3,
        )
    for p in labelled_points(pts):
        ax.annotate(
            f"{p[0]} {p[1]} {p[2]}", (p[3], p[4]), fontsize=6, xytext=(3, 3), textcoords="offset points"
        )
    for i, mname in enumerate(models):
        ax.scatter([], [], marker=MARKERS[i % len(MARKERS)], color="w", edgecolor="k", label=mname)
    if any(p[5] == "train" for p in pts):
        ax.scatter([], [], marker="^", color="w", edgecolor="k", label="training step")
    xl = "Arithmetic intensity (FLOP/byte, " + (
        "eager-traffic estimate)" if bytes_model == "traffic" else "minimum bytes)"
    )
    _axes_labels(ax, title or f"Model-level roofline{' — ' + dev if dev else ''}", xl)
    ax.legend(fontsize=6, loc="lower right")
    return fig


def labelled_points(pts: list[tuple], max_labels: int = 12) -> list[tuple]:
    """The points to label: every point when there are few, else the fastest per (model, precision, mode).

    So a 60-configuration sweep stays readable (the CSV beside the figure has every point).
    """
    if len(pts) <= max_labels:
        return pts
    best: dict[tuple, tuple] = {}
    for p in pts:
        key = (p[0], p[1], p[5])
        if key not in best or p[4] > best[key][4]:
            best[key] = p
    return list(best.values())


def _profile_title(row: Any) -> str:
    return f"{row['model']} {row['mode']} {row['precision']} bs{int(row['batch_size'])}"


@dataclass
class ClusterPanel:
    """One profile's panel of the kernel-cluster roofline: its clusters on and off the roofline, its ceilings.

    Computed once for the PNG (`cluster_roofline_figure`) and the interactive figure
    (`deepgap.roofline.interactive.cluster_roofline_spec`), so both place the same points.
    """

    title: str
    model: str
    precision: str
    on: pd.DataFrame  # clusters with both FLOPs and bytes (`trace.cluster_table` rows)
    off: pd.DataFrame  # clusters without FLOPs: listed, not placed
    ceilings: list[rm.Ceiling]


def cluster_panels(f: Frames, source: str = "torch", max_panels: int = 6) -> list[ClusterPanel]:
    """The panels of `cluster_roofline_figure` (its arguments), at most ``max_panels``, one per profile."""
    from deepgap.roofline.trace import cluster_table

    df = f.kernels[f.kernels["source"] == source] if f.kernels is not None and len(f.kernels) else None
    pids = list(dict.fromkeys(df["profile_id"]))[:max_panels] if df is not None else []
    prof = f.profiles.set_index("profile_id") if f.profiles is not None and len(f.profiles) else None
    out = []
    for pid in pids:
        ct = cluster_table(df[df["profile_id"] == pid])
        row = prof.loc[pid] if prof is not None and pid in prof.index else None
        prec = row["precision"] if row is not None else "fp32"
        dev = row["device_name"] if row is not None and "device_name" in row else None
        srow = (
            f.spec_row
            if f.spec_row is not None
            else _spec_for_frame(prof.loc[[pid]].reset_index() if row is not None else None, None)
        )
        on = ct[(ct["intensity_flop_per_byte"] > 0) & (ct["achieved_tflops"] > 0)]
        title = (_profile_title(row) if row is not None else f"profile {pid}") + f" [{source}]"
        model = str(row["model"]) if row is not None else ""
        out.append(
            ClusterPanel(
                title, model, str(prec), on, ct.drop(on.index), rm.ceilings(prec, f.peaks, srow, dev)
            )
        )
    return out


def cluster_roofline_figure(f: Frames, *, source: str = "torch", max_panels: int = 6) -> Figure:
    """Kernel-cluster rooflines (the paper's Figs. 2–4): a panel per profile, point size ∝ share of GPU time.

    Args:
        f: the frames: ``kernels`` (per kernel name, per step), ``peaks`` (measured ceilings),
            ``profiles`` (panel titles, precisions and device names).
        source: ``torch`` (FLOPs attributed from the op counter; elementwise estimate included) or ``ncu``
            (CUDA-core FLOPs and DRAM bytes from Nsight Compute counters).
        max_panels: at most this many profiles.
    """
    panels = cluster_panels(f, source, max_panels)
    if not panels:
        fig, (ax,) = _figure()
        _unavailable(
            ax,
            f"no {source} kernel profiles in the store"
            + (" (run deepgap profile --ncu on a machine with Nsight Compute)" if source == "ncu" else ""),
        )
        return fig
    ncols = min(len(panels), 3)
    fig, axes = _figure(6.0, 4.6, ncols, (len(panels) + ncols - 1) // ncols)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    for ax, p in zip(axes, panels, strict=False):
        on, off, cs = p.on, p.off, p.ceilings
        if not len(on):
            _unavailable(ax, "no cluster with both FLOPs and bytes")
            continue
        ais = list(on["intensity_flop_per_byte"]) + [c.ridge_flop_per_byte for c in cs]
        _draw_ceilings(ax, cs, min(ais) / 3, max(ais) * 3)
        for _, c in on.iterrows():
            ax.scatter(
                c["intensity_flop_per_byte"],
                c["achieved_tflops"],
                s=30 + 900 * c["time_share"],
                alpha=0.7,
                color=CLUSTER_COLORS.get(c["cluster"], "k"),
                edgecolor="k",
                lw=0.4,
                zorder=3,
                label=f"{c['cluster']} ({100 * c['time_share']:.0f}% time)",
            )
        if len(off):
            ax.text(0.01, 0.01, not_plotted(off), transform=ax.transAxes, fontsize=6, va="bottom")
        _axes_labels(ax, p.title, "Arithmetic intensity (FLOP/byte)")
        ax.legend(fontsize=6, loc="best")
    return fig


def not_plotted(off: pd.DataFrame) -> str:
    """The clusters a panel cannot place (no FLOPs), with their shares of the time."""
    return "not plotted (no FLOPs): " + ", ".join(
        f"{c} {100 * s:.0f}%" for c, s in off[["cluster", "time_share"]].itertuples(index=False)
    )
