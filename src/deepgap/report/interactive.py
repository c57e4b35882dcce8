"""Interactive versions of the report's per-batch figures (plotly JSON, drawn by the page's own plotly.js).

Why: with five engines, four precisions and two GPUs a static panel either shows too much or hides a
series; hovering names the exact configuration, the CI of the number plotted and its flags, a legend
click hides a series in every panel, and the page's filters act on every figure. The panels and styles
are the static figures' (`deepgap.render.style.overlay_facets`), so the PNG shows the same thing.

A spec is plain JSON written here (no plotly objects: building them was most of the report's time):
``data`` (traces, each on its panel's ``xN``/``yN`` axes), ``layout`` (axes without positions) and
``panels`` (title and axes of each panel, in order). The page places the panels itself (`report.html`):
as many columns as its width allows, and only the panels a filter leaves something in.
plotly is a dependency: `require` fails early when it is missing (``--static`` needs no plotly), and
`bundle_b64` is the installed plotly.min.js, gzipped and base64-encoded, embedded once per page.
"""

from __future__ import annotations

import base64
import functools
import gzip
from typing import Any

import pandas as pd

from deepgap.core.errors import UsageError
from deepgap.core.stats import finite_or_none as _num
from deepgap.render.formatting import fmt_list
from deepgap.render.plotly_spec import NCOLS, log_ticks  # noqa: F401  (re-exported: the figures' modules)
from deepgap.render.plotly_spec import axis_refs as _axis
from deepgap.render.plotly_spec import axis_style as _axis_style
from deepgap.render.plotly_spec import rounded as _r
from deepgap.render.plotly_spec import spec as _spec
from deepgap.render.style import (
    color,
    dash,
    is_open,
    marker,
    overlay_facets,
    overlay_label,
    overlay_series_records,
    platform_names,
    series_label,
    thread_list,
)

OVERLAY_GROUPS = ("flagged", "tail band", "Pareto frontier")


def available() -> bool:
    """Whether plotly is installed."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """A `UsageError` when plotly is missing: the interactive page needs its plotly.js (checked at start)."""
    if not available():
        raise UsageError(
            "the interactive report needs plotly, which is not installed",
            "pip install plotly (a dependency of deepgap), or pass --static for PNG figures only",
        )


def bundle() -> str:
    """plotly.js, minified, from the installed plotly package."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@functools.lru_cache(maxsize=1)
def bundle_b64() -> str:
    """plotly.min.js gzipped and base64-encoded: 4.8 MB becomes 2.0 MB; the page inflates it once."""
    return base64.b64encode(gzip.compress(bundle().encode("utf-8"), 9, mtime=0)).decode("ascii")


def _ci_text(r: dict[str, Any], ci: tuple[str, str, str] | None, scale: float) -> str:
    """The 95% CI of the plotted number, or that none is stored for it."""
    if ci is None:
        return "no CI stored for this number"
    lo, hi = _num(r.get(ci[0])), _num(r.get(ci[1]))
    if lo is None or hi is None:
        return "no CI stored for this number"
    return f"{ci[2]} 95% CI [{lo * scale:.4g}, {hi * scale:.4g}]"


def _hover(
    r: dict[str, Any], ci: tuple[str, str, str] | None, scale: float, short: dict[str, str], extra: str = ""
) -> list[str]:
    """[which configuration, the CI of the number plotted, flags and warnings] of one point."""
    flags = fmt_list(r.get("flags"))
    warns = fmt_list(r.get("warnings"))
    note = ("FLAGGED: " + flags if flags else "") + (" warning: " + warns if warns else "")
    where = short.get(str(r["platform"]), str(r["platform"]))
    return [
        f"{r['model']} · {where} · {series_label(r)} bs{int(r['batch_size'])}",
        _ci_text(r, ci, scale) + extra,
        note.strip(),
    ]


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
    ci: tuple[str, str, str] | None = None,
    band: tuple[str, ...] | None = None,
    label_fn=None,
) -> dict[str, Any] | None:
    """``ycol`` against batch size, one panel per model (every platform and engine overlaid).

    ``ci``: (low column, high column, what it is) of the plotted number: error bars and the hover's
    CI. ``band``: (column, name[, name column]) of an upper bound drawn as a shaded band from the line up
    to it (the latency figure's tail), its value in the hover too, named per point by the name column
    ("max of n=20", `analysis.tails`) where given.
    """
    data = agg[agg[ycol].notna()] if ycol in agg and not agg.empty else agg.iloc[0:0]
    panels = overlay_facets(data)
    if not panels:
        return None
    threads, short = thread_list(data), platform_names(data)
    order = list(short)
    traces: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    spec_panels: list[dict[str, str]] = []
    shown: set[str] = set()
    for i, (title, sub) in enumerate(panels):
        xr, yr, xk, yk = _axis(i)
        spec_panels.append({"title": title, "x": xr, "y": yr})
        yvals: list[float] = []
        for recs in overlay_series_records(sub):  # each series' rows by batch size
            r0 = recs[0]
            lab = overlay_label(r0, short) if label_fn is None else label_fn(r0, short)
            ys = [_r((_num(r[ycol]) or float("nan")) * scale) for r in recs]
            bs = [int(r["batch_size"]) for r in recs]
            col = color(r0, threads)
            sym = marker(r0["engine"], plotly=True) + ("-open" if is_open(r0, order) else "")
            extra = []
            if band:
                extra = [
                    f"<br>{band[1]} {(_num(r.get(band[0])) or float('nan')) * scale:.4g}"
                    + (f" ({r.get(band[2])})" if len(band) > 2 and r.get(band[2]) else "")
                    for r in recs
                ]
            hover = [_hover(r, ci, scale, short, extra[k] if extra else "") for k, r in enumerate(recs)]
            if band:  # the band first, under the line: one closed shape from the median up to the band
                up = [_r((_num(r.get(band[0])) or float("nan")) * scale) for r in recs]
                traces.append(_band_trace(r0, bs, ys, up, (xr, yr), col, lab))
                yvals += [u for u in up if u is not None]
            t = {
                "type": "scatter",
                "x": bs,
                "y": ys,
                "xaxis": xr,
                "yaxis": yr,
                "mode": "lines+markers",
                "name": lab,
                "legendgroup": lab,
                "showlegend": lab not in shown,
                "line": {"color": col, "dash": dash(r0, plotly=True), "width": 1.5},
                "marker": {"symbol": sym, "size": 7, "color": col},
                "customdata": hover,
                "hovertemplate": "<b>%{customdata[0]}</b><br>batch %{x}<br>"
                + ylabel
                + " %{y:.4g}<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
                "meta": _meta(r0, bs),
            }
            if ci:
                t["error_y"] = _error_y(recs, ci, scale, ys, col)
            traces.append(t)
            shown.add(lab)
            yvals += [y for y in ys if y is not None]
            bad = [k for k, r in enumerate(recs) if r["flagged"]]
            if bad:  # a red ✕ over each flagged point, filtered with its series
                marks = [bs[k] for k in bad], [ys[k] for k in bad], [hover[k] for k in bad]
                traces.append(_flag_trace(r0, *marks, (xr, yr), "flagged" not in shown))
                shown.add("flagged")
        axes.update(_panel_axes(sub, (xr, yr, xk, yk), ylabel, logy, yvals))
    return _spec(traces, axes, spec_panels)


def _panel_axes(
    sub: pd.DataFrame, ax: tuple[str, str, str, str], ylabel: str, logy: bool, yvals: list
) -> dict:
    """One panel's axes: batch size on a log x axis ticked at the measured sizes; y log-ticked if ``logy``."""
    xr, yr, xk, yk = ax
    ticks = sorted(int(b) for b in sub["batch_size"].unique())
    x = {**_axis_style("batch size"), "type": "log", "tickvals": ticks, "ticktext": [str(t) for t in ticks]}
    y = {**_axis_style(ylabel), "type": "log" if logy else "linear", "anchor": xr}
    if logy:
        tv, tt = log_ticks(yvals)
        y.update(tickvals=tv, ticktext=tt)
    return {xk: {**x, "anchor": yr}, yk: y}


def _band_trace(r0: dict, bs: list[int], ys: list, up: list, xy: tuple[str, str], col: str, lab: str) -> dict:
    """The tail band: one closed, filled shape from the line (``ys``) up to the band (``up``)."""
    return {
        "type": "scatter",
        "x": bs + bs[::-1],
        "y": ys + up[::-1],
        "xaxis": xy[0],
        "yaxis": xy[1],
        "mode": "lines",
        "fill": "toself",
        "fillcolor": _rgba(col, 0.15),
        "line": {"width": 0, "color": col},
        "hoverinfo": "skip",
        "showlegend": False,
        "legendgroup": lab,
        "name": "tail band",
        "meta": _meta(r0, bs + bs[::-1]),
    }


def _error_y(recs: list[dict], ci: tuple[str, str, str], scale: float, ys: list, col: str) -> dict:
    """Error bars from each point (``ys``) to its CI's ends (``ci``'s low and high columns)."""
    lo = [(_num(r.get(ci[0])) or float("nan")) * scale for r in recs]
    hi = [(_num(r.get(ci[1])) or float("nan")) * scale for r in recs]
    return {
        "type": "data",
        "array": [
            _r(max(0.0, h - y)) if h == h and y is not None else 0 for h, y in zip(hi, ys, strict=True)
        ],
        "arrayminus": [
            _r(max(0.0, y - lo_)) if lo_ == lo_ and y is not None else 0
            for lo_, y in zip(lo, ys, strict=True)
        ],
        "thickness": 1,
        "width": 2,
        "color": col,
    }


def _flag_trace(r0: dict, xs: list[int], ys: list, hover: list, xy: tuple[str, str], legend: bool) -> dict:
    """A red ✕ over each flagged point of a series (at ``xs``, ``ys``), filtered with its series."""
    return {
        "type": "scatter",
        "x": xs,
        "y": ys,
        "xaxis": xy[0],
        "yaxis": xy[1],
        "mode": "markers",
        "name": "flagged",
        "legendgroup": "flagged",
        "showlegend": legend,
        "marker": {"symbol": "x", "size": 11, "color": "red"},
        "customdata": hover,
        "hovertemplate": "<b>%{customdata[0]}</b><br>%{customdata[2]}<extra></extra>",
        "meta": _meta(r0, xs),
    }


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    if len(h) != 6:
        return hex_colour
    return f"rgba({int(h[0:2], 16)},{int(h[2:4], 16)},{int(h[4:6], 16)},{alpha})"


def series_per_panel(spec: dict[str, Any]) -> dict[str, int]:
    """Axis pair → the number of series drawn in it; overlays (flag marks, bands, frontier) not counted."""
    out: dict[str, int] = {}
    for t in spec.get("data", []):
        if (t.get("legendgroup") or t.get("name") or "") in OVERLAY_GROUPS or t.get("name") in OVERLAY_GROUPS:
            continue
        if t.get("hoverinfo") == "skip":  # a band's lower edge
            continue
        axes = f"{t.get('xaxis', 'x')}{t.get('yaxis', 'y')}"
        out[axes] = out.get(axes, 0) + 1
    return out
