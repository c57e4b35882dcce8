"""The report's section for the quant engine's own layers: where its time goes, on a roofline of its layers.

Registered in `deepgap.render.sections` like the roofline and platforms sections. The numbers come from
`deepgap.analysis.quant_layers` (the same rows `deepgap layers` prints): one summary row per quant
configuration, the layers with the most headroom (time above their roofline floor) per configuration,
and one figure: every layer of each configuration at its largest batch, achieved TOPS against arithmetic
intensity under its ceilings, marker area by time share. A store without quant measurements gives nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.analysis.quant_layers import CONFIG_KEYS, load
from deepgap.render.formatting import num_cell, pct_cell
from deepgap.render.sections import Parts, ReportContext, Section, register

if TYPE_CHECKING:
    import pandas as pd


TOP_ROWS = 8  # per configuration, in the layers table: the next bottlenecks, not all 54 rows
MAX_PANELS = 6


_n = num_cell


TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "quant_layers_summary": (
        "The quant engine per configuration: its rows (layers, stem, head) against the network's median",
        [
            ("device", "device_name"),
            ("model", "model"),
            ("precision", "precision"),
            ("batch", "batch_size"),
            ("network ms", _n("network_ms", ".4g")),
            ("rows ms", _n("layers_ms", ".4g")),
            ("their floor ms", _n("floor_ms", ".4g")),
            ("fused pairs saved ms", _n("pairs_saved_ms", ".3g")),
            ("outside rows ms", _n("outside_layers_ms", ".3g")),
            ("TOPS", _n("tops", ".0f")),
            ("memory-bound time", pct_cell("memory_bound_share")),
            ("next bottleneck", "next_bottleneck"),
            ("its headroom ms", _n("its_headroom_ms", ".3g")),
        ],
    ),
    "quant_layers": (
        f"The quant engine's layers with the most headroom (time above their roofline floor), "
        f"{TOP_ROWS} per configuration",
        [
            ("device", "device_name"),  # a two-GPU store's rows of one layer, told apart
            ("model", "model"),
            ("precision", "precision"),
            ("batch", "batch_size"),
            ("layer", "name"),
            ("GEMM M×N×K", "gemm"),
            ("tile", "tile"),
            ("µs", _n("time_s", ".4g", 1e6)),
            ("share", pct_cell("share")),
            ("TOPS", _n("tops", ".0f")),
            ("ops/byte", _n("intensity", ".0f")),
            ("roof TOPS", _n("attainable_tops", ".0f")),
            ("% of roof", pct_cell("roof_fraction")),
            ("headroom µs", _n("headroom_s", ".3g", 1e6)),
            ("bound", "bound"),
            ("ceiling", "ceiling"),
        ],
    ),
}


def roofline_figure(frame: pd.DataFrame):
    """Each configuration at its largest batch: its layers' TOPS against intensity, under their roofs."""
    import numpy as np

    from deepgap.render.draw import panel_legend, plain_ticks, subplots_grid
    from deepgap.render.style import platform_names

    largest = frame.groupby(["device_name", "model", "precision"])["batch_size"].transform("max")
    top = frame[frame["batch_size"] == largest]
    groups = list(top.groupby(CONFIG_KEYS, sort=True))[:MAX_PANELS]
    # each panel names its GPU (a two-GPU store has a panel of each): H200, or full names where short ones clash
    short = platform_names(top.rename(columns={"device_name": "platform"}))
    fig, axes = subplots_grid(len(groups))
    for ax, ((device, model, precision, bs), g) in zip(axes, groups, strict=False):
        kinds = (("q", "tab:blue", precision), ("fp16", "tab:orange", "fp16 (stem, head)"))
        for mode, colour, label in kinds:
            m = g[g["mode"] == mode]
            if len(m):
                ax.scatter(
                    m["intensity"],
                    m["tops"],
                    s=20 + 600 * m["share"],
                    alpha=0.6,
                    color=colour,
                    label=f"{label} rows",
                )
        x = np.logspace(0, 4, 64)
        for mode, colour in (("q", "tab:blue"), ("fp16", "tab:orange")):
            m = g[(g["mode"] == mode) & g["peak_tops"].notna()]
            if len(m):  # the roof: min(peak, intensity × bandwidth)
                r = m.iloc[0]
                ax.plot(
                    x,
                    np.minimum(r["peak_tops"], x * r["bandwidth_gb_s"] / 1e3),
                    color=colour,
                    lw=1,
                    ls="--",
                    label=f"roof ({r['ceiling']})",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_ticks(ax, [1, 10, 100, 1000, 10000])
        plain_ticks(ax, axis="y")
        ax.set_xlabel("ops per byte (fewest bytes)")
        ax.set_ylabel("TOPS")
        ax.set_title(f"{short.get(str(device), device)} · {model} {precision} batch {bs}", fontsize=9)
        panel_legend(ax)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    return fig


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build (nothing without quant measurements)."""
    from deepgap.render.draw import drawn_figure

    frame, summ = load(ctx.source, ctx.run_ids)
    if len(frame) == 0:
        return Parts()
    top = frame.sort_values("headroom_s", ascending=False).groupby(CONFIG_KEYS, sort=True).head(TOP_ROWS)
    top = top.sort_values(CONFIG_KEYS + ["headroom_s"], ascending=[True] * len(CONFIG_KEYS) + [False])
    name, title = "fig_quant_layers_roofline", "The quant engine's layers on their roofline"
    caption = (
        "Every layer of each quant configuration (a panel per device, model, precision and its largest "
        "batch): achieved TOPS against arithmetic intensity (fewest bytes), marker area by its share of the "
        "time; dashed, the roof of the 8-bit precision and of fp16 (the stem, the head, layers kept in fp16)."
    )
    fig = drawn_figure(name, title, caption, lambda: roofline_figure(frame))
    return Parts({"quant_layers_summary": summ, "quant_layers": top}, [fig])


SECTION = register(Section("quant_layers", 25, build, TABLE_SPECS))
