"""Figure 10 as an interactive panel: median latency against throughput per model, platforms overlaid.

Why apart from `deepgap.report.interactive` (the panel specs every line figure shares): the Pareto view
is points, not lines, with its frontier and its own hover, and it was the largest single figure there.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.render.style import (
    color,
    is_open,
    marker,
    overlay_facets,
    platform_names,
    thread_list,
)
from deepgap.render.units import of_frame
from deepgap.report.interactive import _axis, _axis_style, _hover, _r, _spec, log_ticks


def _mode(v: Any) -> str:
    """An ``input_mode`` cell as text, "" for the default input."""
    return v if isinstance(v, str) else ""


def pareto(par: pd.DataFrame) -> dict[str, Any] | None:
    """Median latency against throughput per model, every platform overlaid; colour = precision."""
    if par.empty:
        return None
    threads, short = thread_list(par), platform_names(par)
    order = list(short)
    units = of_frame(par)  # seq/s for a text model (render.units)
    ci = ("throughput_ci_low_ips", "throughput_ci_high_ips", f"throughput {units.short}")
    traces: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    panels: list[dict[str, str]] = []
    shown: set[str] = set()
    for i, (title, sub) in enumerate(overlay_facets(par)):
        xr, yr, xk, yk = _axis(i)
        panels.append({"title": title, "x": xr, "y": yr})
        sub = sub.assign(input_mode=[_mode(m) for m in sub.get("input_mode", [""] * len(sub))])
        keys = ["platform", "precision", "input_mode"]  # a resident input: its own trace and frontier
        for (platform, prec, mode), s in sub.groupby(keys, sort=True):  # markers name engines
            recs = s.sort_values(["engine", "memory_format", "threads", "batch_size"]).to_dict("records")
            lab = f"{short[str(platform)]} {prec}" if len(short) > 1 else str(prec)
            lab = f"{lab} {mode}".strip()
            traces.append(
                {
                    "type": "scatter",
                    "x": [_r(r["latency_median_s"] * 1e3) for r in recs],
                    "y": [_r(r["throughput_ips"]) for r in recs],
                    "xaxis": xr,
                    "yaxis": yr,
                    "mode": "markers",
                    "name": lab,
                    "legendgroup": lab,
                    "showlegend": lab not in shown,
                    "marker": {
                        "symbol": [
                            marker(r["engine"], plotly=True) + ("-open" if is_open(r, order) else "")
                            for r in recs
                        ],
                        "size": 8,
                        "color": [color(r, threads) for r in recs],
                    },
                    "customdata": [_hover(r, ci, 1.0, short) for r in recs],
                    "hovertemplate": f"<b>%{{customdata[0]}}</b><br>median %{{x:.3g}} ms · %{{y:,.0f}} {units.short}"
                    "<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
                    "meta": {
                        "platform": str(platform),
                        "model": str(recs[0]["model"]),
                        "precision": str(prec),
                        "engine": [str(r["engine"]) for r in recs],
                        "batch": [int(r["batch_size"]) for r in recs],
                    },
                }
            )
            shown.add(lab)
        traces += _frontiers(sub, (xr, yr), order, shown)
        tv, tt = log_ticks((sub["latency_median_s"] * 1e3).tolist())
        axes[xk] = {
            **_axis_style("median latency per batch (ms)"),
            "type": "log",
            "tickvals": tv,
            "ticktext": tt,
            "anchor": yr,
        }
        axes[yk] = {**_axis_style(units.rate), "anchor": xr}
    return _spec(traces, axes, panels)


def _frontiers(sub: pd.DataFrame, xy: tuple[str, str], order: list, shown: set[str]) -> list[dict[str, Any]]:
    """One panel's Pareto frontiers, a step line per platform and input mode (dotted for an open marker)."""
    xr, yr = xy
    traces: list[dict[str, Any]] = []
    for (platform, mode), s in sub.groupby(["platform", "input_mode"], sort=True):
        front = s[s["on_frontier"]].sort_values("latency_median_s")
        name = f"Pareto frontier {mode}".strip()
        if len(front):
            traces.append(
                {
                    "type": "scatter",
                    "x": [_r(v * 1e3) for v in front["latency_median_s"]],
                    "y": [_r(v) for v in front["throughput_ips"]],
                    "xaxis": xr,
                    "yaxis": yr,
                    "mode": "lines",
                    "line": {
                        "shape": "hv",
                        "color": "black",
                        "width": 1,
                        "dash": "dot" if is_open({"platform": platform}, order) else "solid",
                    },
                    "name": name,
                    "legendgroup": name,
                    "showlegend": name not in shown,
                    "hoverinfo": "skip",
                    "meta": {"platform": str(platform), "model": str(front["model"].iloc[0])},
                }
            )
            shown.add(name)
    return traces
