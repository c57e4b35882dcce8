"""Interactive bar figures (Fig. 7's median latency, the speedup over the CPU): every platform overlaid.

Why: the static versions were PNGs with one panel per platform and engine family and 5-point labels no one
could read. Here each panel holds one device kind (GPUs together, the CPU apart: its latencies are 100×
longer, so the axes agree only within a kind), bars grouped by model, one series per platform and
configuration (colour = precision as everywhere; the first platform's bars filled, the others' hatched), at
most `MAX_SERIES` a panel (more are cut into parts, titled ``(1/2)``); hovering names the configuration,
the number and its 95% CI, what a × CPU is over, and its flags.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.render.style import MAX_SERIES, color, platform_names, series_label, thread_list
from deepgap.report.interactive import _axis, _axis_style, _r, _spec

PATTERNS = ("/", "x", ".", "\\")  # the second, third … platform's bars; the first's are filled


def _kind(device: Any) -> str:
    return "CPU" if str(device) == "cpu" else "GPU"


def bars(
    frame: pd.DataFrame, value: str, ylabel: str, err: tuple[str, str] | None = None, fmt: str = "{:.3g}"
) -> dict[str, Any] | None:
    """Grouped bars of ``value`` by model, per device kind; ``err``: the columns of its 95% CI."""
    if frame.empty:
        return None
    threads, short = thread_list(frame), platform_names(frame)
    several = len(short) > 1
    traces: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    panels: list[dict[str, str]] = []
    devices = frame["device"] if "device" in frame else ["cuda"] * len(frame)  # × CPU rows: GPUs only
    for kind, sub in frame.assign(_kind=[_kind(d) for d in devices]).groupby("_kind", sort=False):
        keys = ["platform", "engine", "precision", "memory_format", "threads"]
        keys += [k for k in ("input_mode",) if k in sub]  # a resident input: a bar of its own, labelled
        series = list(sub.groupby(keys, sort=True))
        parts = [series[i : i + MAX_SERIES] for i in range(0, len(series), MAX_SERIES)]
        for n, part in enumerate(parts):
            i = len(panels)
            xr, yr, xk, yk = _axis(i)
            title = f"{kind}" + (f" ({n + 1}/{len(parts)})" if len(parts) > 1 else "")
            panels.append({"title": title, "x": xr, "y": yr})
            models = sorted({str(m) for _, s in part for m in s["model"]})
            for (platform, *_), s in part:
                recs = s.to_dict("records")
                r0 = recs[0]
                name = (f"{short[str(platform)]} " if several else "") + series_label(r0, True)
                t = _trace(recs, name, value, err, fmt, xr, yr, color(r0, threads))
                k = list(short).index(str(platform))  # the first platform filled, the others hatched
                if k:
                    t["marker"]["pattern"] = {"shape": PATTERNS[(k - 1) % len(PATTERNS)], "solidity": 0.4}
                traces.append(t)
            axes[xk] = {
                **_axis_style(None),
                "type": "category",
                "categoryorder": "array",
                "categoryarray": models,
                "anchor": yr,
            }
            axes[yk] = {**_axis_style(ylabel), "anchor": xr}
    spec = _spec(traces, axes, panels)
    spec["layout"]["barmode"] = "group"
    return spec


def _trace(recs, name, value, err, fmt, xr, yr, colour) -> dict[str, Any]:
    ys = [r[value] for r in recs]
    t: dict[str, Any] = {
        "type": "bar",
        "x": [str(r["model"]) for r in recs],
        "y": [_r(y) for y in ys],
        "xaxis": xr,
        "yaxis": yr,
        "name": name,
        "legendgroup": name,
        "showlegend": True,
        "marker": {
            "color": colour,
            "line": {"color": ["red" if r["flagged"] else colour for r in recs], "width": 2},
        },
        "text": [fmt.format(y) + (" ✕" if r["flagged"] else "") for y, r in zip(ys, recs, strict=True)],
        "textposition": "outside",
        "customdata": [_hover(r, value, err, fmt) for r in recs],
        "hovertemplate": "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>",
        "meta": {
            "platform": str(recs[0]["platform"]),
            "model": [str(r.get("model_name", r["model"])) for r in recs],
            "engine": str(recs[0]["engine"]),
            "precision": str(recs[0]["precision"]),
            "batch": [int(r["batch_size"]) for r in recs],
        },
    }
    if err:
        t["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": [_r(max(0.0, r[err[1]] - r[value])) for r in recs],
            "arrayminus": [_r(max(0.0, r[value] - r[err[0]])) for r in recs],
            "thickness": 1,
            "width": 3,
        }
    return t


def _hover(r: dict[str, Any], value: str, err: tuple[str, str] | None, fmt: str) -> list[str]:
    ci = f" 95% CI [{fmt.format(r[err[0]])}, {fmt.format(r[err[1]])}]" if err else ""
    flags = ", ".join(map(str, r.get("flags") or []))
    where = (
        r.get("configuration")
        or f"{r['model']} {series_label(r)} bs{int(r['batch_size'])} on {r['platform']}"
    )
    pairing = f"over {r['cpu_configuration']}: {r.get('cpu_match', '')}" if r.get("cpu_configuration") else ""
    return [
        str(where),
        fmt.format(r[value]) + ci,
        "; ".join(x for x in (pairing, flags and "FLAGGED: " + flags) if x),
    ]
