"""Summary figures of the report: Pareto frontier (fig. 10), bars (fig. 7, × CPU), threads, thermal (fig. 5).

Same conventions as `deepgap.figures`: draw what `deepgap.analysis` computed, mark flagged points.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from deepgap.figures import (
    _SERIES,
    PREC_COLORS,
    Figure,
    _grid,
    _legend,
    _marks,
    _plain_ticks,
    _plt,
    _png,
    _style,
    series_label,
)


def pareto(par: pd.DataFrame) -> Figure:
    """Fig. 10: median latency vs throughput, every batch a point, the frontier as a black line."""
    if par.empty:
        return Figure(
            "fig10_pareto",
            "Latency–throughput Pareto frontier (fig. 10)",
            "",
            unavailable="unavailable: no successful measurement",
        )
    keys = list(par.groupby(["platform", "model"], sort=True).groups)
    fig, axes = _grid(len(keys))
    engines = sorted(par["engine"].unique())
    threads = sorted(int(t) for t in par["threads"].unique() if int(t) > 0)
    for ax, (platform, model) in zip(axes, keys, strict=False):
        sub = par[(par["platform"] == platform) & (par["model"] == model)].assign(
            _ms=lambda d: d["latency_median_s"] * 1e3
        )
        for _, s in sub.groupby([c for c in _SERIES if c in sub], sort=True):
            ax.scatter(
                s["_ms"],
                s["throughput_ips"],
                label=series_label(s.iloc[0]),
                s=22,
                **_style(s.iloc[0], engines, threads),
            )
            for r in s.to_dict("records"):
                ax.annotate(
                    str(int(r["batch_size"])),
                    (r["_ms"], r["throughput_ips"]),
                    fontsize=6,
                    xytext=(3, 2),
                    textcoords="offset points",
                )
        front = sub[sub["on_frontier"]].sort_values("_ms")
        ax.step(
            front["_ms"], front["throughput_ips"], where="post", color="black", lw=1, label="Pareto frontier"
        )
        _marks(ax, sub, "_ms", "throughput_ips")
        ax.set_xscale("log")
        _plain_ticks(ax)
        ax.set_title(f"{platform} — {model}", fontsize=9)
        ax.set_xlabel("median latency per batch (ms)", fontsize=8)
        ax.set_ylabel("images/s", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        _legend(ax)
    return Figure(
        "fig10_pareto",
        "Latency–throughput Pareto frontier (fig. 10)",
        "Each point is a batch size (labelled). Upper-left is better; the black line joins the "
        "unflagged configurations that no other configuration beats on both latency and throughput.",
        png=_png(fig),
    )


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
    """Grouped bars: one panel per ``panel`` value, groups by model, one bar per engine/precision."""
    if frame.empty:
        return Figure(name, title, caption, unavailable=why or "unavailable: no successful measurement")
    panels = sorted(frame[panel].unique())
    all_threads = (
        sorted(int(t) for t in frame["threads"].unique() if int(t) > 0) if "threads" in frame else []
    )
    fig, axes = _grid(len(panels), w=5.5, h=3.4, ncols=2)
    for ax, p in zip(axes, panels, strict=False):
        sub = frame[frame[panel] == p]
        models = sorted(sub["model"].unique())
        labels = sorted({series_label(r) for r in sub.to_dict("records")})
        width = 0.8 / max(1, len(labels))
        for j, lab in enumerate(labels):
            rows = [r for r in sub.to_dict("records") if series_label(r) == lab]
            xs = [models.index(r["model"]) + (j - (len(labels) - 1) / 2) * width for r in rows]
            ys = [r[value] for r in rows]
            yerr = None
            if err:
                yerr = np.abs(
                    np.array([[r[value] - r[err[0]] for r in rows], [r[err[1]] - r[value] for r in rows]])
                )
            color = _style(rows[0], [], all_threads)["color"]
            ax.bar(xs, ys, width=width, color=color, alpha=0.85, label=lab, yerr=yerr, capsize=2)
            for x, y, r in zip(xs, ys, rows, strict=False):
                text = fmt.format(y) + (" ✕" if r["flagged"] else "") + (" ○" if r["warnings"] else "")
                ax.annotate(
                    text,
                    (x, y),
                    ha="center",
                    fontsize=6,
                    xytext=(0, 2),
                    textcoords="offset points",
                    color="red" if r["flagged"] else "black",
                )
        ax.set_xticks(range(len(models)), models, fontsize=7)
        ax.set_title(str(p), fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.tick_params(labelsize=7)
        _legend(ax)
    return Figure(name, title, caption + " ✕ = flagged, ○ = CI target missed.", png=_png(fig))


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
    keys = list(ts.groupby(["platform", "model"], sort=True).groups)
    fig, axes = _grid(len(keys))
    for ax, (platform, model) in zip(axes, keys, strict=False):
        sub = ts[(ts["platform"] == platform) & (ts["model"] == model)]
        for (eng, prec, bs), s in sub.groupby(["engine", "precision", "batch_size"], sort=True):
            s = s.sort_values("threads")
            ax.plot(s["threads"], s["throughput_ips"], marker="o", ms=3, label=f"{eng} {prec} bs{bs}")
            _marks(ax, s, "threads", "throughput_ips")
        ax.set_title(f"{platform} — {model}", fontsize=9)
        ax.set_xticks(sorted(int(t) for t in sub["threads"].unique()))
        ax.set_xlabel("intra-op threads", fontsize=8)
        ax.set_ylabel("images/s", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        _legend(ax)
    return Figure(
        "fig_cpu_thread_scaling",
        title,
        "Throughput (batch / median latency) against the number of "
        "intra-op threads; the table gives speedup and parallel efficiency over the fewest threads.",
        png=_png(fig),
    )


def thermal_timeline(runs: Iterable[tuple[str, pd.DataFrame, dict[int, str]]]) -> Figure:
    """Fig. 5: temperature, power and utilization over time, measurement windows shaded by precision.

    Args:
        runs: (label, telemetry frame of one run, result id → precision) for each run with telemetry.
    """
    name, title = "fig05_thermal_timeline", "Thermal timeline (fig. 5)"
    runs = [(lab, t, p) for lab, t, p in runs if not t.empty and "phase" in t]
    runs = [
        (
            lab,
            t[t["phase"].isin(["thermal", "measure"])]
            if t["phase"].isin(["thermal", "measure"]).any()
            else t,
            p,
        )
        for lab, t, p in runs
    ]
    if not runs:
        return Figure(name, title, "", unavailable="unavailable: no telemetry in these runs")
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.8 * len(runs)), squeeze=False)
    fig.subplots_adjust(
        left=0.06, right=0.94, bottom=0.45 / (2.8 * len(runs)), top=1 - 0.3 / (2.8 * len(runs)), hspace=0.5
    )
    for ax, (label, tel, precs) in zip(axes[:, 0], runs, strict=False):
        tel = tel.sort_values("t_s")
        x = tel["t_s"] - tel["t_s"].min()
        meta = ("run_id", "result_id", "phase", "t_s")
        num = {c: pd.to_numeric(tel[c], errors="coerce") for c in tel.columns if c not in meta}
        tel = tel.assign(**{c: v for c, v in num.items()})
        cols = [c for c, v in num.items() if v.notna().any()]  # metrics that hold numbers
        for c in [c for c in cols if "temp" in c]:
            ax.plot(x, tel[c], color="tab:red", lw=1, label=f"{c} (°C)")
        for c in [c for c in cols if "util" in c]:
            ax.plot(x, tel[c], color="tab:gray", lw=0.8, ls=":", label=f"{c} (%)")
        ax2 = ax.twinx()
        for c in [c for c in cols if "power" in c]:
            ax2.plot(x, tel[c], color="tab:blue", lw=1, label=f"{c} (W)")
        meas = tel[tel["phase"] == "measure"].assign(_x=x)
        for rid, win in meas.groupby("result_id"):
            p = precs.get(int(rid), "")
            ax.axvspan(
                win["_x"].min(), win["_x"].max() + 0.5, color=PREC_COLORS.get(p, "#cccccc"), alpha=0.12, lw=0
            )
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("seconds since first sample", fontsize=8)
        ax.set_ylabel("°C / %", fontsize=8)
        ax2.set_ylabel("W", fontsize=8)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        if h1 or h2:
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    return Figure(
        name,
        title,
        "Telemetry of the thermal warm-up and of every measured configuration; measured "
        "windows are shaded by precision (blue fp32, orange fp16, green int8).",
        png=_png(fig),
    )
