"""The rooflines as interactive figures: hover a point for its model, precision, batch and numbers.

The model-level rooflines (inference, and the training step from `deepgap profile --mode train`) are
`roofline_spec`; the kernel-cluster roofline, a panel per profile, is `cluster_roofline_spec`.

Why: the static roofline was a PNG whose 6-point labels named only a dozen of its points; here every point
is hoverable (model, precision, batch, arithmetic intensity, achieved TFLOP/s), the ceilings are lines with
their peak and bandwidth in the legend, and a legend click hides a precision. The spec is the report's
(`deepgap.render.plotly_spec`), drawn by the page's own plotly.js; the PNG stays in the report's files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepgap.core.records import kv_cache_suffix
from deepgap.render.plotly_spec import axis_refs, axis_style, log_ticks, rounded, spec
from deepgap.roofline.figures import PREC_COLORS, Frames, roofline_ceilings, roofline_points

PLOTLY_MARKERS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "cross", "star", "x")


@dataclass(frozen=True)
class _Point:
    """One hoverable roofline point: its model (the marker), precision (the colour and legend), place, hover."""

    model: str
    precision: str
    intensity: float  # FLOP/byte
    tflops: float
    hover: tuple[str, ...]  # the first line bold
    symbol: str | None = None  # else the model's marker


def roofline_spec(f: Frames, *, bytes_model: str = "traffic") -> dict[str, Any] | None:
    """The plotly spec of `figures.roofline_figure`'s points and ceilings, or None with nothing to place."""
    pts = roofline_points(f, bytes_model)
    if not pts:
        return None
    dev, ceilings = roofline_ceilings(pts, f)
    points = [
        _Point(
            str(p[0]),
            str(p[1]),
            p[3],
            p[4],
            (f"{p[0]} {p[1]} {p[2]}", f"{p[3]:.3g} FLOP/byte · {p[4]:.3g} TFLOP/s"),
            "triangle-up" if p[5] == "train" else None,
        )
        for p in pts
    ]
    return _panel(points, ceilings, "arithmetic intensity (FLOP/byte)", f" — {dev}" if dev else "")


def _panel(points: list[_Point], ceilings: list, x_title: str, title_tail: str = "") -> dict[str, Any]:
    """One log-log roofline: the ceilings' lines, then a trace of points per precision, markers per model."""
    ais = [p.intensity for p in points] + [c.ridge_flop_per_byte for c in ceilings]
    xs = np.logspace(np.log10(min(ais) / 3), np.log10(max(ais) * 3), 60)
    xr, yr, xk, yk = axis_refs(0)
    traces: list[dict[str, Any]] = [_ceiling_trace(c, xs, xr, yr) for c in ceilings]
    models = sorted({p.model for p in points})
    for prec in sorted({p.precision for p in points}):
        mine = [p for p in points if p.precision == prec]
        lines = "".join(f"<br>%{{customdata[{i}]}}" for i in range(1, len(mine[0].hover)))
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [rounded(p.intensity) for p in mine],
                "y": [rounded(p.tflops) for p in mine],
                "xaxis": xr,
                "yaxis": yr,
                "name": prec,
                "legendgroup": prec,
                "showlegend": True,
                "marker": {
                    "color": PREC_COLORS.get(prec, "#000"),
                    "size": 9,
                    "line": {"color": "#000", "width": 0.5},
                    "symbol": [
                        p.symbol or PLOTLY_MARKERS[models.index(p.model) % len(PLOTLY_MARKERS)] for p in mine
                    ],
                },
                "customdata": [list(p.hover) for p in mine],
                "hovertemplate": "<b>%{customdata[0]}</b>" + lines + "<extra></extra>",
                "meta": {"model": [p.model for p in mine], "precision": prec},
            }
        )
    tx = log_ticks([float(x) for x in xs])
    ty = log_ticks([p.tflops for p in points] + [c.peak_tflops for c in ceilings])
    axes = {
        xk: {**axis_style(x_title), "type": "log", "tickvals": tx[0], "ticktext": tx[1], "anchor": yr},
        yk: {**axis_style("TFLOP/s"), "type": "log", "tickvals": ty[0], "ticktext": ty[1], "anchor": xr},
    }
    return spec(traces, axes, [{"title": f"markers: {', '.join(models)}{title_tail}", "x": xr, "y": yr}])


def _ceiling_trace(c: Any, xs: Any, xr: str, yr: str) -> dict[str, Any]:
    """One ceiling's attainable-TFLOP/s line on panel (``xr``, ``yr``), in its precision's colour."""
    return {
        "type": "scatter",
        "mode": "lines",
        "x": [rounded(x) for x in xs],
        "y": [rounded(y) for y in c.attainable_tflops(xs)],
        "xaxis": xr,
        "yaxis": yr,
        "name": f"{c.label}: {c.peak_tflops:,.3g} TFLOP/s, {c.bandwidth_gb_s:,.4g} GB/s",
        "showlegend": True,
        "line": {
            "color": PREC_COLORS.get(c.precision, "#000"),
            "dash": "dash" if c.source == "spec" else "solid",
        },
        "hoverinfo": "skip",
        "meta": {"precision": c.precision},
    }


def _ceiling_traces(ceilings: list, xs: Any, xr: str, yr: str, shown: set[str]) -> list[dict[str, Any]]:
    """One line per ceiling on panel (``xr``, ``yr``); each name in the legend once (``shown``)."""
    out = []
    for c in ceilings:
        t = _ceiling_trace(c, xs, xr, yr)
        t.update(legendgroup=t["name"], showlegend=t["name"] not in shown)
        t["line"]["width"] = 1.3
        out.append(t)
        shown.add(t["name"])
    return out


def cluster_roofline_spec(f: Frames, *, source: str = "torch") -> dict[str, Any] | None:
    """The plotly spec of `figures.cluster_roofline_figure`: a panel per profile, hover a cluster for its numbers.

    Why: the PNG's 6-point legends and labels were unreadable at the page's width; here each cluster names
    its kernels, time per step and share, intensity and achieved TFLOP/s on hover, a legend click hides a
    cluster in every panel, and marker area still follows the share of the step's time. None when no
    panel has a cluster to place.
    """
    from deepgap.roofline.figures import cluster_panels, not_plotted

    panels = [p for p in cluster_panels(f, source) if len(p.on)]
    if not panels:
        return None
    traces: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    titles = []
    shown: set[str] = set()
    for i, p in enumerate(panels):
        xr, yr, xk, yk = axis_refs(i)
        ais = [float(v) for v in p.on["intensity_flop_per_byte"]] + [
            c.ridge_flop_per_byte for c in p.ceilings
        ]
        xs = np.logspace(np.log10(min(ais) / 3), np.log10(max(ais) * 3), 60)
        traces += _ceiling_traces(p.ceilings, xs, xr, yr, shown)
        for r in p.on.to_dict("records"):
            traces.append(_cluster_trace(r, p, (xr, yr), shown))
            shown.add(str(r["cluster"]))
        tx = log_ticks([float(x) for x in xs])
        ty = log_ticks([float(v) for v in p.on["achieved_tflops"]] + [c.peak_tflops for c in p.ceilings])
        axes[xk] = {
            **axis_style("arithmetic intensity (FLOP/byte)"),
            "type": "log",
            "tickvals": tx[0],
            "ticktext": tx[1],
            "anchor": yr,
        }
        axes[yk] = {
            **axis_style("TFLOP/s"),
            "type": "log",
            "tickvals": ty[0],
            "ticktext": ty[1],
            "anchor": xr,
        }
        title = p.title + (
            f"<br>{not_plotted(p.off)}" if len(p.off) else ""
        )  # a second line: panels are narrow
        titles.append({"title": title, "x": xr, "y": yr})
    return spec(traces, axes, titles)


def _cluster_trace(r: dict, p: Any, xy: tuple[str, str], shown: set[str]) -> dict[str, Any]:
    """One kernel cluster's marker on panel ``p``: its area the share of the step's time, its numbers on hover."""
    from deepgap.roofline.figures import CLUSTER_COLORS

    xr, yr = xy
    name = str(r["cluster"])
    share = float(r["time_share"])
    return {
        "type": "scatter",
        "mode": "markers",
        "x": [rounded(r["intensity_flop_per_byte"])],
        "y": [rounded(r["achieved_tflops"])],
        "xaxis": xr,
        "yaxis": yr,
        "name": name,
        "legendgroup": name,
        "showlegend": name not in shown,
        "marker": {
            "color": CLUSTER_COLORS.get(name, "#000"),
            "size": round(float(np.sqrt(30 + 900 * share)), 1),  # the PNG's area, as a diameter
            "opacity": 0.75,
            "line": {"color": "#000", "width": 0.5},
        },
        "customdata": [
            [
                f"{name} — {p.title}",
                f"{100 * share:.1f}% of the step's time · {r['time_per_step_s'] * 1e3:.3g} ms per step"
                f" · {int(r['kernels'])} kernel(s)",
                f"{r['intensity_flop_per_byte']:.3g} FLOP/byte · {r['achieved_tflops']:.3g} TFLOP/s",
            ]
        ],
        "hovertemplate": "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
        "meta": {"model": p.model, "precision": p.precision},
    }


def decode_roofline_spec(tab: Any, distance: Callable[[dict[str, Any]], str]) -> dict[str, Any] | None:
    """The plotly spec of `decode_figure.decode_roofline_figure`: hover a decode point for its numbers.

    Why: the PNG labels every point with its engine, precision, batch and share of the memory bound in
    6-point type, which overlap where batches sit close; here each point names its model, device, lengths
    and the distance to its memory bound on hover (``distance(row)``: the report table's wording,
    `deepgap.analysis.decode_roofline.distance_text`), and a legend click hides a precision. None with
    nothing to place.
    """
    from deepgap.roofline.decode_figure import decode_ceilings, placed

    rows = placed(tab)
    if rows is None or rows.empty:
        return None
    points = [
        _Point(
            str(r["model"]),
            str(r["precision"]),
            float(r["intensity_flop_per_byte"]),
            float(r["achieved_tflops"]),
            _decode_hover(r, distance(r)),
        )
        for r in rows.to_dict("records")
    ]
    x_title = "arithmetic intensity (FLOP/byte: weights + KV cache at the mean context)"
    return _panel(points, decode_ceilings(rows), x_title)


def _decode_hover(r: dict[str, Any], distance: str) -> tuple[str, str, str]:
    """A decode point's three hover lines: what it is, where it sits, how far from its memory bound."""
    what = (
        f"{r['model']} {r['engine']} {r['precision']} bs{int(r['batch_size'])} "
        f"{r.get('input_len')}/{r.get('output_len')}{kv_cache_suffix(r.get('kv_cache'))} on {r.get('device_name')}"
    )
    where = f"{float(r['intensity_flop_per_byte']):.3g} FLOP/byte · {float(r['achieved_tflops']):.3g} TFLOP/s"
    return what, where, distance
