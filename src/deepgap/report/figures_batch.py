"""The report's figures against batch size: throughput, latency, memory, speedup over fp32, energy.

Figs. 6, 8, 9 and 11 of the paper and the energy figures, each as small multiples of one panel per
platform and model.

Drawn with the helpers of `deepgap.render.draw` (colour by precision, marker by engine, flagged points marked).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from deepgap.analysis import tails
from deepgap.render.draw import (
    NO_MEASUREMENT,
    Figure,
    flag_marks,
    panel_legend,
    pending_figure,
    plain_ticks,
    series_style,
    shared_legend,
    subplots_grid,
)
from deepgap.render.style import (
    is_open,
    label_panel,
    overlay_facets,
    overlay_label,
    overlay_series,
    platform_names,
    thread_list,
)
from deepgap.render.units import of_frame, seq_len_of


def _per_panel(
    agg: pd.DataFrame,
    name: str,
    title: str,
    caption: str,
    ylabel: str,
    draw: Callable[[object, pd.DataFrame, dict], None],
    xlabel: str = "batch size",
    logx: bool = True,
    logy: bool = False,
    need: str | None = None,
    why: str = "",
) -> Figure:
    """Small multiples: one panel per model (`overlay_facets`), every platform and engine overlaid.

    ``draw(ax, series_rows, style)`` draws one series; the second platform's markers are open.
    """
    data = agg if need is None or agg.empty else agg[agg[need].notna()] if need in agg else agg.iloc[0:0]
    if data.empty:
        return Figure(name, title, caption, unavailable=why or NO_MEASUREMENT)
    return pending_figure(name, title, caption, lambda: _draw_panels(data, xlabel, ylabel, draw, logx, logy))


def _draw_panels(data: pd.DataFrame, xlabel: str, ylabel: str, draw, logx: bool, logy: bool):
    """`_per_panel`'s matplotlib figure (drawn only where a page needs the PNG)."""
    panels = overlay_facets(data)
    fig, axes = subplots_grid(len(panels), w=4.4, h=3.0, ncols=3)
    threads = thread_list(data)
    short = platform_names(data)
    order = list(short)
    for ax, (ptitle, sub) in zip(axes, panels, strict=False):
        for _, s in overlay_series(sub):
            r0 = s.iloc[0]
            st = series_style(r0, threads)
            st["label"] = overlay_label(r0, short)
            if is_open(r0, order):
                st["mfc"] = "none"
            draw(ax, s.sort_values("batch_size"), st)
        if logx:
            ax.set_xscale("log", base=2)
            plain_ticks(ax, sorted(sub["batch_size"].unique()))
        if logy:
            ax.set_yscale("log")
            plain_ticks(ax, axis="y")
        label_panel(ax, ptitle, xlabel, ylabel)
    used = list(axes[: len(panels)])
    if not shared_legend(fig, used):
        for ax in used:
            panel_legend(ax)
    return fig


def throughput_vs_batch(agg: pd.DataFrame) -> Figure:
    """Fig. 6: throughput (batch / median latency, with 95% CI) and pipelined throughput vs batch."""

    def draw(ax, s, st):
        err = np.abs(
            np.vstack(
                [
                    s["throughput_ips"] - s["throughput_ci_low_ips"],
                    s["throughput_ci_high_ips"] - s["throughput_ips"],
                ]
            )
        )
        ax.errorbar(
            s["batch_size"],
            s["throughput_ips"],
            yerr=np.nan_to_num(err),
            capsize=2,
            **st,
        )
        if s["throughput_pipelined_ips"].notna().any():
            ax.plot(
                s["batch_size"],
                s["throughput_pipelined_ips"],
                ls=":",
                color=st["color"],
                alpha=0.6,
                lw=1,
                label="dotted: pipelined (no sync)",
            )
        flag_marks(ax, s, "batch_size", "throughput_ips")

    return _per_panel(
        agg,
        "fig06_throughput_vs_batch",
        "Throughput vs batch size (fig. 6)",
        "Lines: batch / median synchronized latency (the paper's throughput), 95% CI bars. Dotted: "
        "pipelined throughput (back-to-back iterations, no sync in between). Dashed lines: channels-last.",
        of_frame(agg).rate,
        draw,
    )


def latency_vs_batch(agg: pd.DataFrame) -> Figure:
    """Fig. 8: median latency vs batch with a band up to the tail: a p99 where n supports one, else the max."""

    def draw(ax, s, st):
        ax.plot(s["batch_size"], s["latency_median_s"] * 1e3, **st)
        ax.fill_between(
            s["batch_size"],
            s["latency_median_s"] * 1e3,
            s["latency_tail_s"] * 1e3 if "latency_tail_s" in s else s["latency_p99_s"] * 1e3,
            color=st["color"],
            alpha=0.18,
            lw=0,
        )
        flag_marks(ax, s.assign(_ms=s["latency_median_s"] * 1e3), "batch_size", "_ms")

    fig = _per_panel(
        agg,
        "fig08_latency_vs_batch",
        "Latency vs batch size with tail bands (fig. 8)",
        "Line: median latency per batch (ms). Shaded band: from the median up to the tail of the pooled "
        f"samples: their p99 where n ≥ {tails.P99_MIN_N} supports one, else their maximum, named "
        '"max of n" in the hover (too few calls for a p99).',
        "latency per batch (ms, log scale)",
        draw,
        logy=True,
    )
    return fig


def memory_vs_batch(agg: pd.DataFrame) -> Figure:
    """Fig. 9: peak memory vs batch, every stored memory figure labelled by its source."""
    styles = {
        "device_mem_used_bytes": ("-", "NVML device-wide peak used"),
        "peak_mem_reserved_bytes": ("--", "process peak reserved"),
        "peak_mem_allocated_bytes": (":", "process peak allocated"),
        "host_rss_bytes": ("-.", "host RSS"),
    }
    have = [c for c in styles if c in agg and agg[c].notna().any()] if not agg.empty else []

    def draw(ax, s, st):
        drawn = [c for c in have if s[c].notna().any()]
        for c in drawn:
            ax.plot(
                s["batch_size"],
                s[c] / 2**30,
                ls=styles[c][0],
                color=st["color"],
                marker=st["marker"],
                ms=3,
                label=st["label"] if c == drawn[0] else "_nolegend_",
            )
            ax.plot([], [], ls=styles[c][0], color="black", lw=1, label=styles[c][1])  # line-style key
        if drawn:
            flag_marks(ax, s.assign(_g=s[drawn[0]] / 2**30), "batch_size", "_g")

    agg2 = agg.assign(_any=agg[have].max(axis=1)) if have else agg.assign(_any=np.nan)
    return _per_panel(
        agg2,
        "fig09_memory_vs_batch",
        "Peak memory vs batch size (fig. 9)",
        "True peaks over the timed protocol (warm-up and timing; set-up excluded). Solid: NVML "
        "device-wide used memory, the maximum of the telemetry samples and the reading after timing "
        "(includes the CUDA context and other processes: the paper's way). Dashed: this process's "
        "allocator pool (peak reserved). Dotted: live tensors (peak allocated). Dash-dot: host RSS "
        "of CPU runs. Maximum over repeats and sweep passes.",
        "GiB",
        draw,
        need="_any",
        why="unavailable: no memory figure stored",
    )


def speedup_vs_fp32(sp: pd.DataFrame) -> Figure:
    """Fig. 11: throughput over FP32 at each batch."""

    def draw(ax, s, st):
        ax.plot(
            s["batch_size"],
            s["speedup"],
            **{**st, "label": f"{st['label']} / {s.iloc[0]['baseline_engine']} fp32"},
        )
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        flag_marks(ax, s, "batch_size", "speedup")

    return _per_panel(
        sp,
        "fig11_speedup_vs_fp32",
        "Speedup over FP32 (fig. 11)",
        "Throughput of each precision over FP32 of the same engine (eager FP32 when the engine has "
        "none) at the same platform, batch and threads, in the same memory format where FP32 was measured "
        "in it (else the fastest eager FP32 format). " + memory_formats_caption(sp),
        "× FP32",
        draw,
        why="unavailable: no precision measured beside FP32 at the same batch",
    )


FORMAT_LINE = {"nchw": "solid", "channels_last": "dashed"}  # `render.style.dash`: any other format dotted


def memory_formats_caption(sp: pd.DataFrame) -> str:
    """Fig. 11's words on memory formats: which it plots, and which rows divide by FP32 in another one.

    Why: the figure's rows may mix formats (the default GPU grid: quant int8/fp8 in channels_last beside
    eager fp16 in NCHW) and a row's FP32 may be of another format than its own; the caption said neither.
    """
    if "seq_len" in sp:  # a text model has no memory format: its rows are left out of these words
        sp = sp[[not seq_len_of(v) for v in sp["seq_len"]]]
    if sp.empty or "memory_format" not in sp:
        return ""
    fmts = sorted(map(str, sp["memory_format"].unique()))
    named = " and ".join(f"{f} ({FORMAT_LINE.get(f, 'dotted')})" for f in fmts)
    text = f"Memory format{'s' if len(fmts) > 1 else ''} plotted: {named}."
    if "baseline_memory_format" not in sp:
        return text
    across = sp[sp["memory_format"].astype(str) != sp["baseline_memory_format"].astype(str)]
    other: dict[tuple[str, ...], list[str]] = {}  # (engine, format, FP32's engine, its format) → precisions
    for r in across.to_dict("records"):
        key = tuple(
            str(r[c]) for c in ("engine", "memory_format", "baseline_engine", "baseline_memory_format")
        )
        if str(r["precision"]) not in other.setdefault(key, []):
            other[key].append(str(r["precision"]))
    if not other:
        return text + " Each row is over FP32 in its own format."
    pairs = "; ".join(
        f"{e} {', '.join(p)} in {f} over {be} FP32 in {bf}" for (e, f, be, bf), p in other.items()
    )
    return text + f" Over FP32 in another format (none measured in their own): {pairs}."


def energy_vs_batch(
    agg: pd.DataFrame, col: str, name: str, title: str, ylabel: str, scale: float = 1.0
) -> Figure:
    """Perf-per-watt or joules per image vs batch, where energy telemetry exists."""

    def draw(ax, s, st):
        ok = s[s[col].notna()]
        ax.plot(ok["batch_size"], ok[col] * scale, **st)
        flag_marks(ax, ok.assign(_v=ok[col] * scale), "batch_size", "_v")

    return _per_panel(
        agg,
        name,
        title,
        "From the telemetry joined to each configuration (mean power over its measured window).",
        ylabel,
        draw,
        need=col,
        why="unavailable: no energy telemetry in these runs",
    )
