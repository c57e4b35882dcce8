"""One look for every figure of the report: a colour per precision, a marker per engine, small multiples.

Why a module of its own: the static (matplotlib) and interactive (plotly) figures must agree, so that
fp16 is orange and ``cudagraph`` a square in every panel of every figure, and both must cut a crowded
plot the same way. `facets` splits configurations into panels by platform, model and engine family,
and never lets a panel carry more than `MAX_SERIES` series (a panel that would is cut into parts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from deepgap.core.precision import colour, column
from deepgap.render.units import seq_len_of

MAX_SERIES = 8  # series per panel: more and the legend outgrows the plot
PREC_COLORS = column("colour")  # precision → colour: a live view of the precision table
OTHER_COLOR = "#7f7f7f"  # a precision the table does not know
# engine → (matplotlib marker, plotly symbol); unknown engines take the spare ones in name order
ENGINE_MARKERS = {
    "eager": ("o", "circle"),
    "cudagraph": ("s", "square"),
    "compile": ("^", "triangle-up"),
    "compile-freeze": ("v", "triangle-down"),
    "compile-max-autotune": (">", "triangle-right"),
    "compile-reduce-overhead": ("<", "triangle-left"),
    "onnxruntime": ("D", "diamond"),
    "onnxruntime-trt": ("d", "diamond-tall"),
    "tensorrt": ("P", "cross"),
    "quant": ("X", "x"),
}
_SPARE = [("*", "star"), ("h", "hexagon"), ("p", "pentagon"), ("H", "hexagon2"), ("8", "octagon")]
FORMAT_DASH = {"nchw": ("-", "solid"), "channels_last": ("--", "dash")}
SERIES_COLS = ["engine", "precision", "memory_format", "threads", "include_transfer", "input_mode"]


def label_panel(ax, title: str, xlabel: str | None, ylabel: str, grid: str = "both") -> None:
    """A small panel's title, axis labels (``xlabel`` None: none), grid and tick size, as in every figure."""
    ax.set_title(title, fontsize=8)
    if xlabel is not None:
        ax.set_xlabel(xlabel, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.grid(alpha=0.3, axis=grid)
    ax.tick_params(labelsize=6)


def engine_family(engine: str) -> str:
    """``compile-freeze`` → ``compile``, ``onnxruntime-trt`` → ``onnxruntime``: the facet an engine joins."""
    return str(engine).split("-")[0]


def marker(engine: str, plotly: bool = False) -> str:
    """The engine's marker, the same in every figure."""
    pair = ENGINE_MARKERS.get(str(engine))
    if pair is None:
        pair = _SPARE[sum(map(ord, str(engine))) % len(_SPARE)]
    return pair[1 if plotly else 0]


def shade(color: str, threads: int, all_threads: list[int]) -> str:
    """Fewer CPU threads → a lighter shade of the precision's colour, so thread series stay apart."""
    from matplotlib.colors import to_hex, to_rgb

    if threads <= 0 or len(all_threads) < 2 or threads not in all_threads:
        return color
    f = 0.6 * (1 - all_threads.index(threads) / (len(all_threads) - 1))
    return to_hex(tuple(c + (1 - c) * f for c in to_rgb(color)))


def color(r, all_threads: list[int] | None = None) -> str:
    """The precision's colour (shaded by thread count on CPU sweeps)."""
    return shade(colour(str(r["precision"]), OTHER_COLOR), int(r.get("threads") or 0), all_threads or [])


def dash(r, plotly: bool = False) -> str:
    """Line style by memory format (solid NCHW, dashed channels-last)."""
    return FORMAT_DASH.get(str(r.get("memory_format", "nchw")), (":", "dot"))[1 if plotly else 0]


def series_label(r, with_engine: bool = True) -> str:
    """Legend text of a series: [engine] precision, memory format, threads, transfer, input mode."""
    s = f"{r['engine']} {r['precision']}" if with_engine else str(r["precision"])
    if r.get("memory_format", "nchw") != "nchw":
        s += f" {r['memory_format']}"
    if int(r.get("threads") or 0):
        s += f" t{int(r['threads'])}"
    if r.get("include_transfer"):
        s += " +H2D"
    if isinstance(r.get("input_mode"), str) and r.get("input_mode"):  # never drawn as the default input's
        s += f" {r['input_mode']}"
    return s


def thread_list(frame: pd.DataFrame) -> list[int]:
    """The CPU thread counts present (for shading)."""
    return sorted(int(t) for t in frame["threads"].unique() if int(t) > 0) if "threads" in frame else []


def series_of(sub: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The series of one panel: one per engine, precision, format, threads and transfer setting."""
    cols = [c for c in SERIES_COLS if c in sub]
    return [(k if isinstance(k, tuple) else (k,), g) for k, g in sub.groupby(cols, sort=True)]


def facets(
    frame: pd.DataFrame, keys: Iterable[str] = ("platform", "model"), by_family: bool = True
) -> list[tuple[str, pd.DataFrame]]:
    """Panels of ``frame``: (title, rows) per ``keys`` and engine family, each ≤ `MAX_SERIES` series."""
    if frame.empty:
        return []
    keys = [k for k in keys if k in frame]
    data = frame.assign(_family=[engine_family(e) for e in frame["engine"]]) if by_family else frame
    group = [*keys, "_family"] if by_family else keys
    out = []
    for key, sub in data.groupby(group, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        title = " — ".join(str(k) for k in key)
        series = series_of(sub)
        parts = math.ceil(len(series) / MAX_SERIES)
        size = math.ceil(len(series) / parts)  # balanced parts: 9 series → 5 + 4, not 8 + 1
        for i in range(parts):
            chunk = series[i * size : (i + 1) * size]
            rows = pd.concat([g for _, g in chunk])
            out.append(
                (
                    title + (f" ({i + 1}/{parts})" if parts > 1 else ""),
                    rows.drop(columns="_family", errors="ignore"),
                )
            )
    return out


# Overlaid panels (the per-batch figures): every platform and engine of one model in one panel
PRECISION_ORDER = list(PREC_COLORS)  # the precision table's order: fp32 first


def platform_names(frame: pd.DataFrame) -> dict[str, str]:
    """Platform → its short name (``NVIDIA H100 80GB HBM3`` → ``H100``); full names if short ones clash."""
    names = sorted(map(str, frame["platform"].unique()), reverse=True) if "platform" in frame else []
    short = {
        n: (
            n.split()[1]
            if n.split()[0] in ("NVIDIA", "AMD", "Intel") and len(n.split()) > 1
            else n.split()[0]
            if n.split()
            else n
        )
        for n in names
    }
    return short if len(set(short.values())) == len(short) else {n: n for n in names}


def is_open(r, frame_platforms: list[str]) -> bool:
    """Open markers for every platform but the first (in reverse name order: ``H200`` before ``H100``)."""
    return len(frame_platforms) > 1 and str(r["platform"]) != frame_platforms[0]


def overlay_label(r, short: dict[str, str]) -> str:
    """Legend text of an overlaid series: [platform] engine precision, format, threads, transfer."""
    lab = series_label(r, True)
    return f"{short[str(r['platform'])]} {lab}" if len(short) > 1 else lab


def overlay_series(sub: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The series of an overlaid panel: one per platform, engine, precision, format, threads, transfer."""
    cols = [c for c in ["platform", *SERIES_COLS] if c in sub]
    return [(k if isinstance(k, tuple) else (k,), g) for k, g in sub.groupby(cols, sort=True)]


def overlay_series_records(sub: pd.DataFrame, by: str = "batch_size") -> list[list[dict[str, Any]]]:
    """Each series of `overlay_series` as its rows' records sorted by ``by``, in the same order.

    The same records as ``s.sort_values(by).to_dict("records")`` per series, from one ``to_dict`` of the
    panel: the interactive figures need only the records, and a frame per series cost their build a second.
    """
    if not len(sub):
        return []
    cols = [c for c in ["platform", *SERIES_COLS] if c in sub]
    groups = sub[cols].groupby(cols, sort=True)
    number, keys, recs = groups.ngroup().to_numpy(), sub[by].to_numpy(), sub.to_dict("records")
    out = []
    for k in range(groups.ngroups):
        rows = np.flatnonzero(number == k)
        out.append([recs[i] for i in rows[np.argsort(keys[rows], kind="quicksort")]])
    return out


def n_overlay_series(sub: pd.DataFrame) -> int:
    """``len(overlay_series(sub))`` without building each series' frame (packing panels only counts them)."""
    cols = [c for c in ["platform", *SERIES_COLS] if c in sub]
    return int(sub[cols].groupby(cols, sort=False).ngroups) if len(sub) else 0


def _kind(device) -> str:
    return "CPU" if str(device).startswith("cpu") else "GPU"


def overlay_facets(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Panels where the axes agree: one per model, text sequence length and device kind, all else overlaid.

    Why: a panel per platform, model and engine family left most panels with one point and never set
    two GPUs or two engines side by side. A panel holding more than `MAX_SERIES` series is cut by
    precision (precisions packed in the precision table's order, so fp32 and fp16 share a panel when
    they fit); one precision with too many series is cut into balanced parts, titled ``(1/2)``.
    CPU and GPU rows never share a panel (their scales differ a hundredfold).
    """
    if frame.empty:
        return []
    data = (
        frame.assign(_kind=[_kind(d) for d in frame["device"]])
        if "device" in frame
        else frame.assign(_kind="GPU")
    )
    # a text model's sequence lengths are panels of their own: a line through seq 128 and 384 is no series
    seqs = frame["seq_len"] if "seq_len" in frame else [0] * len(frame)
    data = data.assign(_seq=[seq_len_of(v) for v in seqs])
    out: list[tuple[str, pd.DataFrame]] = []
    kinds = data["_kind"].nunique()
    for (model, seq, kind), sub in data.groupby(["model", "_seq", "_kind"], sort=True):
        head = f"{model}" + (f" seq {seq}" if seq else "") + (f" — {kind}" if kinds > 1 else "")
        sub = sub.drop(columns=["_kind", "_seq"])
        if n_overlay_series(sub) <= MAX_SERIES:
            out.append((head, sub))
            continue
        precs = sorted(
            sub["precision"].astype(str).unique(),
            key=lambda p: (PRECISION_ORDER.index(p) if p in PRECISION_ORDER else 99, p),
        )
        packs: list[list[str]] = []
        size = 0
        for p in precs:
            n = n_overlay_series(sub[sub["precision"] == p])
            if packs and size + n <= MAX_SERIES:
                packs[-1].append(p)
                size += n
            else:
                packs.append([p])
                size = n
        for pack in packs:
            rows = sub[sub["precision"].astype(str).isin(pack)]
            series = overlay_series(rows)
            parts = math.ceil(len(series) / MAX_SERIES)
            step = math.ceil(len(series) / parts)
            for i in range(parts):
                chunk = pd.concat([g for _, g in series[i * step : (i + 1) * step]])
                part = f" ({i + 1}/{parts})" if parts > 1 else ""
                out.append((f"{head} — {', '.join(pack)}{part}", chunk))
    return out
