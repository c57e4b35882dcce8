"""Interactive versions of the report's per-batch figures (plotly JSON, drawn by the page's own plotly.js).

Why: with five engines and four precisions a static panel either shows too much or hides a series;
hovering names the exact configuration, its CI and flags, a legend click hides a precision in every
panel at once, and the page's filters (model, engine, precision, batch) act on every figure. The
panels and styles are the static figures' (`deepgap.figure_style`), so the PNG beside each figure
shows the same thing. plotly is optional: `available` says whether it is installed, and without it
the report is the static one. Nothing is fetched: `bundle` is plotly.js from the installed package.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from deepgap.analysis.frame import config_label
from deepgap.figure_style import color, dash, facets, marker, series_label, series_of, thread_list
from deepgap.report_format import fmt_ci, fmt_list
from deepgap.stats import finite_or_none as _num

NCOLS = 4
PANEL_PX = 250
OVERLAY_GROUPS = ("flagged", "CI target missed", "Pareto frontier", "pipelined (no sync)")


def available() -> bool:
    """Whether plotly is installed (the report falls back to static figures when it is not)."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def bundle() -> str:
    """plotly.js, minified, from the installed plotly package (embedded once per page)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()



def _hover(r: dict[str, Any], ylabel: str) -> list[str]:
    flags = fmt_list(r.get("flags"))
    warns = fmt_list(r.get("warnings"))
    note = ("FLAGGED: " + flags if flags else "") + (" warning: " + warns if warns else "")
    ci = fmt_ci(r.get("throughput_ci_low_ips"), r.get("throughput_ci_high_ips"))
    return [config_label(r), f"throughput 95% CI {ci} img/s", note.strip(), ylabel]


def _grid(titles: list[str]):
    from plotly.subplots import make_subplots

    n = len(titles)
    cols = max(1, min(NCOLS, n))
    rows = math.ceil(n / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        horizontal_spacing=0.06,
        vertical_spacing=min(0.12, 0.5 / rows),
        subplot_titles=titles,
    )
    fig.update_annotations(font_size=10)
    return fig, rows, cols


def _finish(fig, rows: int) -> dict[str, Any]:
    import plotly.io as pio

    names = {t.name for t in fig.data if t.showlegend}
    legend_rows = math.ceil(sum(len(n) * 6.5 + 45 for n in names) / 1150) if names else 0
    top = 40 + 22 * legend_rows
    fig.update_layout(
        height=PANEL_PX * rows + 60 + top,
        margin={"l": 50, "r": 10, "t": top, "b": 40},
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "x": 0,
            "font": {"size": 10},
        },
        hoverlabel={"font": {"size": 11}},
        template="plotly_white",
        font={"size": 10},
    )
    return json.loads(pio.to_json(fig, validate=False, remove_uids=True))


def _meta(r: dict[str, Any], batches: list[int]) -> dict[str, Any]:
    return {
        "platform": str(r["platform"]),
        "model": str(r["model"]),
        "engine": str(r["engine"]),
        "precision": str(r["precision"]),
        "batch": batches,
    }


def lines(
    agg: pd.DataFrame,
    ycol: str,
    ylabel: str,
    scale: float = 1.0,
    logy: bool = False,
    err: tuple[str, str] | None = None,
    label_fn=None,
) -> dict[str, Any] | None:
    """``ycol`` against batch size, one panel per platform, model and engine family (≤ 8 series each)."""
    import plotly.graph_objects as go

    data = agg[agg[ycol].notna()] if ycol in agg and not agg.empty else agg.iloc[0:0]
    panels = facets(data)
    if not panels:
        return None
    fig, rows, cols = _grid([t for t, _ in panels])
    threads = thread_list(data)
    shown: set[str] = set()
    first_axis: dict[tuple, int] = {}
    for i, (_, sub) in enumerate(panels):
        row, col = divmod(i, cols)
        for _, s in series_of(sub):
            s = s.sort_values("batch_size")
            recs = s.to_dict("records")
            r0 = recs[0]
            lab = label_fn(r0, False) if label_fn else series_label(r0, False)  # engine: marker and hover
            ys = [(_num(r[ycol]) or float("nan")) * scale for r in recs]
            bs = [int(r["batch_size"]) for r in recs]
            trace = go.Scatter(
                x=bs,
                y=ys,
                mode="lines+markers",
                name=lab,
                legendgroup=lab,
                showlegend=lab not in shown,
                line={"color": color(r0, threads), "dash": dash(r0, plotly=True), "width": 1.5},
                marker={"symbol": marker(r0["engine"], plotly=True), "size": 6},
                customdata=[_hover(r, ylabel) for r in recs],
                hovertemplate="<b>%{customdata[0]}</b><br>batch %{x}<br>%{customdata[3]} %{y:.4g}"
                "<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
                meta=_meta(r0, bs),
            )
            if err:
                lo = [(_num(r.get(err[0])) or float("nan")) * scale for r in recs]
                hi = [(_num(r.get(err[1])) or float("nan")) * scale for r in recs]
                trace.error_y = {
                    "type": "data",
                    "array": [max(0.0, h - y) if h == h else 0 for h, y in zip(hi, ys, strict=True)],
                    "arrayminus": [
                        max(0.0, y - lo_) if lo_ == lo_ else 0 for lo_, y in zip(lo, ys, strict=True)
                    ],
                    "thickness": 1,
                    "width": 2,
                }
            fig.add_trace(trace, row=row + 1, col=col + 1)
            shown.add(lab)
            bad = [r for r in recs if r["flagged"]]
            if bad:  # a red ✕ over each flagged point, filtered with its series
                fig.add_trace(
                    go.Scatter(
                        x=[int(r["batch_size"]) for r in bad],
                        y=[(_num(r[ycol]) or float("nan")) * scale for r in bad],
                        mode="markers",
                        name="flagged",
                        legendgroup="flagged",
                        showlegend="flagged" not in shown,
                        marker={"symbol": "x", "size": 11, "color": "red"},
                        customdata=[_hover(r, ylabel) for r in bad],
                        hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[2]}<extra></extra>",
                        meta=_meta(r0, [int(r["batch_size"]) for r in bad]),
                    ),
                    row=row + 1,
                    col=col + 1,
                )
                shown.add("flagged")
        ax = i + 1
        key = (sub["platform"].iloc[0], sub["model"].iloc[0])
        ticks = sorted(int(b) for b in sub["batch_size"].unique())
        fig.update_xaxes(
            type="log",
            tickvals=ticks,
            ticktext=[str(t) for t in ticks],
            title_text="batch size",
            title_font={"size": 9},
            row=row + 1,
            col=col + 1,
        )
        fig.update_yaxes(
            type="log" if logy else "linear",
            title_text=ylabel if col == 0 else None,
            title_font={"size": 9},
            row=row + 1,
            col=col + 1,
        )
        if key in first_axis:  # panels of one platform and model share their y scale
            fig.layout[
                f"yaxis{ax if ax > 1 else ''}"
            ].matches = f"y{first_axis[key] if first_axis[key] > 1 else ''}"
        else:
            first_axis[key] = ax
    return _finish(fig, rows)


def pareto(par: pd.DataFrame) -> dict[str, Any] | None:
    """Median latency against throughput per platform and model; colour = precision, marker = engine."""
    import plotly.graph_objects as go

    if par.empty:
        return None
    keys = list(par.groupby(["platform", "model"], sort=True).groups)
    fig, rows, cols = _grid([f"{p} — {m}" for p, m in keys])
    threads = thread_list(par)
    shown: set[str] = set()
    for i, (platform, model) in enumerate(keys):
        row, col = divmod(i, cols)
        sub = par[(par["platform"] == platform) & (par["model"] == model)]
        for prec, s in sub.groupby("precision", sort=True):  # one trace per precision: markers name engines
            recs = s.sort_values(["engine", "memory_format", "threads", "batch_size"]).to_dict("records")
            lab = str(prec)
            fig.add_trace(
                go.Scatter(
                    x=[r["latency_median_s"] * 1e3 for r in recs],
                    y=[r["throughput_ips"] for r in recs],
                    mode="markers",
                    name=lab,
                    legendgroup=lab,
                    showlegend=lab not in shown,
                    marker={
                        "symbol": [
                            marker(r["engine"], plotly=True)
                            + ("" if r.get("memory_format", "nchw") == "nchw" else "-open")
                            for r in recs
                        ],
                        "size": 7,
                        "color": [color(r, threads) for r in recs],
                    },
                    customdata=[_hover(r, "images/s") for r in recs],
                    hovertemplate="<b>%{customdata[0]}</b><br>median %{x:.3g} ms · %{y:,.0f} img/s"
                    "<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
                    meta={
                        "platform": str(platform),
                        "model": str(model),
                        "precision": lab,
                        "engine": [str(r["engine"]) for r in recs],
                        "batch": [int(r["batch_size"]) for r in recs],
                    },
                ),
                row=row + 1,
                col=col + 1,
            )
            shown.add(lab)
        front = sub[sub["on_frontier"]].sort_values("latency_median_s")
        if len(front):
            fig.add_trace(
                go.Scatter(
                    x=(front["latency_median_s"] * 1e3).tolist(),
                    y=front["throughput_ips"].tolist(),
                    mode="lines",
                    line={"shape": "hv", "color": "black", "width": 1},
                    name="Pareto frontier",
                    legendgroup="Pareto frontier",
                    showlegend="Pareto frontier" not in shown,
                    hoverinfo="skip",
                    meta={"platform": str(platform), "model": str(model)},
                ),
                row=row + 1,
                col=col + 1,
            )
            shown.add("Pareto frontier")
        fig.update_xaxes(
            type="log",
            title_text="median latency per batch (ms)",
            title_font={"size": 9},
            row=row + 1,
            col=col + 1,
        )
        fig.update_yaxes(
            title_text="images/s" if col == 0 else None, title_font={"size": 9}, row=row + 1, col=col + 1
        )
    return _finish(fig, rows)


def series_per_panel(spec: dict[str, Any]) -> dict[str, int]:
    """Axis pair → the number of series (traces) drawn in it, overlays (flag marks, frontier) not counted."""
    out: dict[str, int] = {}
    for t in spec.get("data", []):
        if (t.get("legendgroup") or t.get("name") or "") in OVERLAY_GROUPS:
            continue
        axes = f"{t.get('xaxis', 'x')}{t.get('yaxis', 'y')}"
        out[axes] = out.get(axes, 0) + 1
    return out
