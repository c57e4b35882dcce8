"""The report's summary figures: Pareto frontier (fig. 10), bars (fig. 7, × CPU), threads, thermal (fig. 5).

The concept here is the figures that summarise a sweep in one picture each (not against batch size, which is
`deepgap.report.figures_batch`). Drawn with the primitives of `deepgap.render.draw` (same conventions: draw what
`deepgap.analysis` computed, mark flagged points).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from deepgap.core.precision import PRECISIONS
from deepgap.render.draw import (
    NO_MEASUREMENT,
    PREC_COLORS,
    Figure,
    flag_marks,
    make_figure,
    panel_legend,
    pending_figure,
    plain_ticks,
    pyplot,
    subplots_grid,
)
from deepgap.render.style import MAX_SERIES, facets, label_panel, marker, series_of, thread_list
from deepgap.render.style import color as style_color
from deepgap.render.style import series_label as style_label
from deepgap.render.units import of_frame, seq_len_of


def pareto(par: pd.DataFrame) -> Figure:
    """Fig. 10: median latency vs throughput, every batch a point, the frontier as a black line."""
    if par.empty:
        return Figure(
            "fig10_pareto",
            "Latency–throughput Pareto frontier (fig. 10)",
            "",
            unavailable=NO_MEASUREMENT,
        )
    return pending_figure(
        "fig10_pareto",
        "Latency–throughput Pareto frontier (fig. 10)",
        "Each point is a batch size (labelled); colour = precision, marker = engine (key above), hollow = "
        "channels-last. Upper-left "
        "is better; the black line joins the unflagged configurations that no other configuration beats on "
        "both latency and throughput.",
        lambda: _draw_pareto(par),
    )


def _draw_pareto(par: pd.DataFrame):
    """Fig. 10's matplotlib figure (drawn only where a page needs the PNG)."""
    seqs = par["seq_len"] if "seq_len" in par else [0] * len(par)
    par = par.assign(_seq=[seq_len_of(v) for v in seqs])  # a text model: a panel per sequence length
    keys = list(par.groupby(["platform", "model", "_seq"], sort=True).groups)
    fig, axes = subplots_grid(len(keys), w=4.2, h=3.1, ncols=3)
    threads = thread_list(par)
    for ax, (platform, model, seq) in zip(axes, keys, strict=False):
        sub = par[(par["platform"] == platform) & (par["model"] == model) & (par["_seq"] == seq)].assign(
            _ms=lambda d: d["latency_median_s"] * 1e3
        )
        named: set[str] = set()  # one legend entry per precision (colour); markers name the engine
        for _, s in series_of(sub):
            r0 = s.iloc[0]
            lab = f"{r0['precision']} {_mode(r0)}".strip()  # "int8 int8-resident": its own legend entry
            cl = r0.get("memory_format", "nchw") != "nchw"  # channels-last: hollow markers
            c = style_color(r0, threads)
            ax.scatter(
                s["_ms"],
                s["throughput_ips"],
                label=lab if lab not in named else "_nolegend_",
                s=20,
                facecolors="none" if cl else c,
                edgecolors=c,
                marker=marker(r0["engine"]),
            )
            named.add(lab)
            for r in s.to_dict("records"):
                ax.annotate(
                    str(int(r["batch_size"])),
                    (r["_ms"], r["throughput_ips"]),
                    fontsize=5,
                    xytext=(3, 2),
                    textcoords="offset points",
                )
        on = sub[sub["on_frontier"]]
        modes = [_mode(r) for r in on.to_dict("records")]
        for mode in sorted(set(modes)) or [""]:  # one frontier per input mode: never one line through both
            front = on[[m == mode for m in modes]].sort_values("_ms")
            ax.step(
                front["_ms"],
                front["throughput_ips"],
                where="post",
                color="black",
                lw=1,
                ls=":" if mode else "-",
                label=f"Pareto frontier {mode}".strip(),
            )
        flag_marks(ax, sub, "_ms", "throughput_ips")
        ax.set_xscale("log")
        plain_ticks(ax)
        title = f"{platform} — {model}" + (f" seq {seq}" if seq else "")
        label_panel(ax, title, "median latency per batch (ms)", of_frame(sub).rate)
        panel_legend(ax)
    return fig


def _mode(r) -> str:
    """A row's input mode, "" for the default (`deepgap.core.records.INPUT_MODES`)."""
    m = r.get("input_mode")
    return m if isinstance(m, str) else ""


def bars(
    frame: pd.DataFrame,
    name: str,
    title: str,
    caption: str,
    value: str,
    ylabel: str,
    panel: str = "platform",
    fmt: str = "{:.3g}",
    err: tuple[str, str] | None = None,
    why: str = "",
) -> Figure:
    """Grouped bars: one panel per ``panel`` value and engine family (≤ 8 bars a group), groups by model."""
    if frame.empty:
        return Figure(name, title, caption, unavailable=why or NO_MEASUREMENT)
    caption += " ✕ = flagged, ○ = CI target missed."
    return pending_figure(name, title, caption, lambda: _draw_bars(frame, value, ylabel, panel, fmt, err))


def _draw_bars(
    frame: pd.DataFrame, value: str, ylabel: str, panel: str, fmt: str, err: tuple[str, str] | None
):
    """`bars`' matplotlib figure (drawn only where a page needs the PNG)."""
    panels = facets(frame, keys=(panel,))
    all_threads = thread_list(frame)
    fig, axes = subplots_grid(len(panels), w=4.4, h=3.0, ncols=3)
    for ax, (ptitle, sub) in zip(axes, panels, strict=False):
        models = sorted(sub["model"].unique())
        several = sub["engine"].nunique() > 1
        groups = series_of(sub)
        width = 0.8 / max(1, len(groups))
        for j, (_, g) in enumerate(groups):
            rows = g.to_dict("records")
            lab = style_label(rows[0], several)
            xs = [models.index(r["model"]) + (j - (len(groups) - 1) / 2) * width for r in rows]
            ys = [r[value] for r in rows]
            yerr = None
            if err:
                yerr = np.abs(
                    np.array([[r[value] - r[err[0]] for r in rows], [r[err[1]] - r[value] for r in rows]])
                )
            color = style_color(rows[0], all_threads)
            hatch = "///" if rows[0].get("memory_format", "nchw") != "nchw" else None  # channels-last
            ax.bar(
                xs,
                ys,
                width=width,
                color=color,
                alpha=0.85,
                label=lab,
                yerr=yerr,
                capsize=2,
                hatch=hatch,
                edgecolor="white" if hatch else None,
            )
            for x, y, r in zip(xs, ys, rows, strict=False):
                text = fmt.format(y) + (" ✕" if r["flagged"] else "") + (" ○" if r["warnings"] else "")
                ax.annotate(
                    text,
                    (x, y),
                    ha="center",
                    fontsize=5,
                    xytext=(0, 2),
                    textcoords="offset points",
                    color="red" if r["flagged"] else "black",
                )
        ax.set_xticks(range(len(models)), models, fontsize=6)
        label_panel(ax, ptitle, None, ylabel, grid="y")
        panel_legend(ax)
    return fig


def thread_scaling(ts: pd.DataFrame) -> Figure:
    """CPU throughput vs thread count, one line per engine/precision/batch."""
    title = "CPU thread scaling"
    if ts.empty:
        return Figure(
            "fig_cpu_thread_scaling",
            title,
            "",
            unavailable="unavailable: no CPU run with several thread counts",
        )
    panels = []
    for (platform, model), sub in ts.groupby(["platform", "model"], sort=True):
        lines = list(sub.groupby(["engine", "precision", "batch_size"], sort=True))
        parts = -(-len(lines) // MAX_SERIES)
        for i in range(parts):
            part = f" ({i + 1}/{parts})" if parts > 1 else ""
            panels.append((f"{platform} — {model}{part}", lines[i * MAX_SERIES : (i + 1) * MAX_SERIES]))
    fig, axes = subplots_grid(len(panels), w=4.2, h=3.0)
    for ax, (ptitle, lines) in zip(axes, panels, strict=False):
        ticks = set()
        for (eng, prec, bs), s in lines:
            s = s.sort_values("threads")
            ticks |= {int(t) for t in s["threads"]}
            ax.plot(
                s["threads"],
                s["throughput_ips"],
                marker=marker(eng),
                ms=3,
                color=style_color(s.iloc[0]),
                label=f"{eng} {prec} bs{bs}",
            )
            flag_marks(ax, s, "threads", "throughput_ips")
        ax.set_xticks(sorted(ticks))
        label_panel(ax, ptitle, "intra-op threads", of_frame(ts).rate)
        panel_legend(ax)
    return make_figure(
        "fig_cpu_thread_scaling",
        title,
        "Throughput (batch / median latency) against the number of "
        "intra-op threads; the table gives speedup and parallel efficiency over the fewest threads.",
        fig,
    )


GAP_S = 10.0  # a pause longer than this between samples (a compile, a skipped phase) is cut to 1 s


def _back_to_back(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, list[float], float]:
    """Runs' telemetry laid end to end, idle time between and inside runs cut out, lines broken there.

    Returns the joined frame with an ``_x`` column (seconds of recorded telemetry), the run boundaries,
    and the x scale (60 when minutes read better than seconds).
    """
    parts, bounds, offset = [], [], 0.0
    frames = sorted((f for f in frames if not f.empty), key=lambda f: float(f["t_s"].min()))
    for k, f in enumerate(frames):
        f = f.sort_values("t_s").reset_index(drop=True)
        dt = f["t_s"].diff().fillna(0.0).to_numpy()
        cut = dt > GAP_S
        x = offset + np.cumsum(np.where(cut, 1.0, dt))
        if k:
            bounds.append(offset)
        start = 0
        for i in [*np.flatnonzero(cut), len(f)]:  # an empty row ends each stretch: the line breaks there
            parts.append(f.iloc[start:i].assign(_x=x[start:i]))
            parts.append(pd.DataFrame({"_x": [x[i - 1] + 0.5 if i else offset]}))
            start = i
        offset = float(x[-1]) + max(1.0, 0.01 * float(x[-1]))
    joined = pd.concat(parts, ignore_index=True)
    scale = 60.0 if offset > 900 else 1.0
    return joined, [b / scale for b in bounds], scale


def thermal_timeline(
    runs: Iterable[tuple[str, pd.DataFrame | list[pd.DataFrame], dict[int, str]]],
    name: str = "fig05_thermal_timeline",
    title: str = "Thermal timeline (fig. 5)",
    appendix: bool = False,
) -> Figure:
    """Fig. 5: temperature, power and utilization over time, measurement windows shaded by precision.

    Args:
        name: file stem of the figure.
        title: its title.
        appendix: shown in the report's appendix (the per-run panels), drawn at a lower resolution.
        runs: (label, telemetry frame(s), result id → precision) per panel: one run, or a machine's
            runs (laid end to end, grey lines between runs).
    """
    panels = []
    for lab, frames, p in runs:
        frames = [frames] if isinstance(frames, pd.DataFrame) else list(frames)
        kept = []
        for t in frames:
            if t.empty or "phase" not in t:
                continue
            keep = t["phase"].isin(["thermal", "measure"])
            kept.append(t[keep] if keep.any() else t)
        if kept:
            panels.append((lab, kept, p))
    if not panels:
        return Figure(
            name, title, "", unavailable="unavailable: no telemetry in these runs", appendix=appendix
        )
    plt = pyplot()
    n = len(panels)
    fig, axes = plt.subplots(n, 1, figsize=(11, 3.1 * n), squeeze=False)
    fig.subplots_adjust(left=0.06, right=0.94, bottom=0.75 / (3.1 * n), top=1 - 0.3 / (3.1 * n), hspace=0.75)
    for ax, (label, frames, precs) in zip(axes[:, 0], panels, strict=False):
        _thermal_panel(ax, label, frames, precs)
    return make_figure(
        name,
        title,
        "Telemetry of the thermal warm-up and of every measured configuration; measured windows are shaded "
        "by precision (the colours of every figure: "
        + ", ".join(f"{p.colour_name} {n}" for n, p in PRECISIONS.items())
        + ").",
        fig,
        dpi=55 if appendix else 75,
        appendix=appendix,
    )


def _thermal_panel(ax, label: str, frames: list[pd.DataFrame], precs: dict[int, str]) -> None:
    """One panel of Fig. 5: temperatures and utilization on ``ax``, power on a twin axis, windows shaded."""
    tel, bounds, scale = _back_to_back(frames)
    x = tel["_x"] / scale
    meta = ("run_id", "result_id", "phase", "t_s", "_x")
    num = {c: pd.to_numeric(tel[c], errors="coerce") for c in tel.columns if c not in meta}
    tel = tel.assign(**{c: v for c, v in num.items()})
    cols = [c for c, v in num.items() if v.notna().any()]  # metrics that hold numbers
    styles = ["-", "--", "-.", ":"]
    for k, c in enumerate(c for c in cols if "temp" in c):
        ax.plot(x, tel[c], color="tab:red", lw=1, ls=styles[k % 4], label=f"{c} (°C)")
    for c in [c for c in cols if "util" in c]:
        ax.plot(x, tel[c], color="tab:gray", lw=0.8, ls=":", label=f"{c} (%)")
    ax2 = ax.twinx()
    for k, c in enumerate(c for c in cols if "power" in c):
        ax2.plot(
            x,
            tel[c],
            color=["tab:blue", "tab:purple", "tab:cyan"][k % 3],
            lw=1 if k == 0 else 0.7,
            alpha=1 if k == 0 else 0.7,
            label=f"{c} (W)",
        )
    for b in bounds:
        ax.axvline(b, color="#999999", lw=0.6)
    meas = tel[tel["phase"] == "measure"].assign(_xs=x)
    for rid, win in meas.groupby("result_id"):
        p = precs.get(int(rid), "")
        ax.axvspan(
            win["_xs"].min(),
            win["_xs"].max() + 0.5 / scale,
            color=PREC_COLORS.get(p, "#cccccc"),
            alpha=0.12,
            lw=0,
        )
    ax.set_title(label, fontsize=9)
    unit = "minutes" if scale == 60 else "seconds"
    ax.set_xlabel(
        f"{unit} of recorded telemetry (pauses over {GAP_S:.0f} s cut out"
        + ("; runs end to end, grey lines between them)" if bounds else ")"),
        fontsize=8,
    )
    ax.set_ylabel("°C / %", fontsize=8)
    ax2.set_ylabel("W", fontsize=8)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    if h1 or h2:  # under the panel, not over the data
        ax.legend(
            h1 + h2,
            l1 + l2,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncol=7,
            frameon=False,
        )
