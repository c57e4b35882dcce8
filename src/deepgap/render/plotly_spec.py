"""A plotly figure as plain JSON, the way the report's page draws it: panels, axes, legend, number rounding.

Why in render: the report's figures (`deepgap.report.interactive`) and the roofline's (`deepgap.roofline`)
write the same spec for the same page script (`report.html`: it places the panels itself, as many columns
as the width allows), and the roofline sits below the report in the layers. A spec is ``data`` (traces,
each on its panel's ``xN``/``yN`` axes), ``layout`` (axes without positions) and ``panels`` (title and axes
of each panel, in order).
"""

from __future__ import annotations

import math
from typing import Any

from deepgap.core.stats import finite_or_none as _num

NCOLS = 3  # at most this many panels a row (fewer on a narrow screen: the page decides)


def rounded(v: Any) -> float | None:
    """A finite number rounded to 4 significant digits (the JSON stays small), else None."""
    v = _num(v)
    return float(f"{v:.4g}") if v is not None else None


def log_ticks(values: list[float]) -> tuple[list[float], list[str]]:
    """1-2-5 ticks over ``values`` with plain labels ("0.5", "1", "2", "5", "10"), not plotly's "5 2 10"."""
    vals = [v for v in values if v is not None and v == v and v > 0]
    if not vals:
        return [], []
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    ticks = [m * 10.0**e for e in range(lo, hi + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if min(vals) / 1.5 <= t <= max(vals) * 1.5] or [10.0**lo]
    if len(ticks) > 9:  # a wide range: decades only
        ticks = [10.0**e for e in range(lo, hi + 1)]
    return ticks, [f"{t:g}" for t in ticks]


def axis_refs(i: int) -> tuple[str, str, str, str]:
    """Panel ``i`` (0-based) → its trace refs ``x3``/``y3`` and layout keys ``xaxis3``/``yaxis3``."""
    n = "" if i == 0 else str(i + 1)
    return f"x{n}", f"y{n}", f"xaxis{n}", f"yaxis{n}"


def spec(data: list[dict], layout_axes: dict[str, Any], panels: list[dict[str, str]]) -> dict[str, Any]:
    """The figure: its traces, the shared layout (legend on top, the page moves it below the toolbar), panels."""
    names = {t["name"] for t in data if t.get("showlegend")}
    layout = {
        **layout_axes,
        "margin": {"l": 55, "r": 10, "t": 30, "b": 40},
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": 1.0,
            "yanchor": "bottom",
            "yref": "container",
            "font": {"size": 10},
        },
        "showlegend": bool(names),
        "hoverlabel": {"font": {"size": 11}},
        "font": {"size": 10, "family": "system-ui, sans-serif"},
        "plot_bgcolor": "#fff",
        "paper_bgcolor": "#fff",
        "hovermode": "closest",
    }
    return {"data": data, "layout": layout, "panels": panels, "cols": NCOLS}


def axis_style(title: str | None) -> dict[str, Any]:
    """One axis as every figure draws it: light grid, a line, its title small."""
    return {
        "title": {"text": title, "font": {"size": 9}} if title else None,
        "gridcolor": "#eee",
        "zeroline": False,
        "linecolor": "#999",
        "showline": True,
        "automargin": True,
    }
