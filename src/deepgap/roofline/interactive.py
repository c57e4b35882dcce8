"""The inference roofline as an interactive figure: hover a point for its model, precision, batch and numbers.

Why: the static roofline was a PNG whose 6-point labels named only a dozen of its points; here every point
is hoverable (model, precision, batch, arithmetic intensity, achieved TFLOP/s), the ceilings are lines with
their peak and bandwidth in the legend, and a legend click hides a precision. The spec is the report's
(`deepgap.render.plotly_spec`), drawn by the page's own plotly.js; the PNG stays in the report's files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from deepgap.render.plotly_spec import axis_refs, axis_style, log_ticks, rounded, spec
from deepgap.roofline.figures import PREC_COLORS, roofline_ceilings, roofline_points

PLOTLY_MARKERS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "cross", "star", "x")


def roofline_spec(
    results_df: pd.DataFrame | None,
    peaks_df: pd.DataFrame | None = None,
    *,
    profiles_df: pd.DataFrame | None = None,
    bytes_model: str = "traffic",
) -> dict[str, Any] | None:
    """The plotly spec of `figures.roofline_figure`'s points and ceilings, or None with nothing to place."""
    pts = roofline_points(results_df, peaks_df, None, profiles_df, bytes_model)
    if not pts:
        return None
    dev, ceilings = roofline_ceilings(pts, results_df, peaks_df, None, profiles_df)
    ais = [p[3] for p in pts] + [c.ridge_flop_per_byte for c in ceilings]
    xs = np.logspace(np.log10(min(ais) / 3), np.log10(max(ais) * 3), 60)
    xr, yr, xk, yk = axis_refs(0)
    traces: list[dict[str, Any]] = []
    for c in ceilings:
        traces.append(
            {
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
        )
    models = sorted({p[0] for p in pts})
    for prec in sorted({p[1] for p in pts}):
        mine = [p for p in pts if p[1] == prec]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [rounded(p[3]) for p in mine],
                "y": [rounded(p[4]) for p in mine],
                "xaxis": xr,
                "yaxis": yr,
                "name": str(prec),
                "legendgroup": str(prec),
                "showlegend": True,
                "marker": {
                    "color": PREC_COLORS.get(prec, "#000"),
                    "size": 9,
                    "line": {"color": "#000", "width": 0.5},
                    "symbol": [
                        "triangle-up"
                        if p[5] == "train"
                        else PLOTLY_MARKERS[models.index(p[0]) % len(PLOTLY_MARKERS)]
                        for p in mine
                    ],
                },
                "customdata": [
                    [f"{p[0]} {p[1]} {p[2]}", f"{p[3]:.3g} FLOP/byte · {p[4]:.3g} TFLOP/s"] for p in mine
                ],
                "hovertemplate": "<b>%{customdata[0]}</b><br>%{customdata[1]}<extra></extra>",
                "meta": {"model": [str(p[0]) for p in mine], "precision": str(prec)},
            }
        )
    tx = log_ticks([float(x) for x in xs])
    ty = log_ticks([p[4] for p in pts] + [c.peak_tflops for c in ceilings])
    axes = {
        xk: {
            **axis_style("arithmetic intensity (FLOP/byte)"),
            "type": "log",
            "tickvals": tx[0],
            "ticktext": tx[1],
            "anchor": yr,
        },
        yk: {**axis_style("TFLOP/s"), "type": "log", "tickvals": ty[0], "ticktext": ty[1], "anchor": xr},
    }
    return spec(
        traces,
        axes,
        [{"title": f"markers: {', '.join(models)}" + (f" — {dev}" if dev else ""), "x": xr, "y": yr}],
    )
