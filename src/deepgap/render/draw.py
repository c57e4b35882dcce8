"""Figure drawing primitives (matplotlib, Agg backend): the `Figure` record and the helpers every figure uses.

The concept here is *how* a figure is drawn, not which figures exist: every figure builder (the report's,
the serving and roofline sections') takes analysis frames and returns a `Figure` holding PNG bytes, or the
reason it is unavailable ("unavailable: no telemetry in these runs"), drawing what `deepgap.analysis`
computed and nothing more. One panel per platform and model, as in the paper's figures 6–11 (top row T4,
bottom row L4). Flagged configurations are drawn with a red ✕ over the point and a missed CI target with
an orange ring, so a flagged number is never shown unmarked. Colours follow the precision, markers the
engine. The report's figures themselves are in `deepgap.report.figures_batch` (metrics against batch size: figs.
6, 8, 9, 11, energy) and `deepgap.report.figures_summary` (one figure per sweep-wide comparison: Pareto, bars,
threads, thermal); this module sits below them and below the features as a render primitive.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap.render.style import ENGINE_MARKERS, PREC_COLORS, facets, series_of, thread_list  # noqa: F401
from deepgap.render.style import color as _color
from deepgap.render.style import dash as _dash
from deepgap.render.style import marker as _marker
from deepgap.render.style import series_label as _label

# legend entries that mark points rather than name a series (not counted against MAX_SERIES)
OVERLAYS = frozenset(
    {
        "flagged (see tables)",
        "CI target missed",
        "Pareto frontier",
        "dotted: pipelined (no sync)",
        "NVML device-wide peak used",
        "process peak reserved",
        "process peak allocated",
        "host RSS",
    }
)


NO_MEASUREMENT = "unavailable: no successful measurement"  # a figure's reason when it has no rows at all


@dataclass
class Figure:
    """One figure of the report: PNG bytes (drawn now, or pending until a page needs them), or why it cannot be.

    ``pending``: the function that draws its matplotlib figure, called by `draw_png` only when a page shows
    or writes the PNG. Why: an interactive page shows a figure's plotly version where it has one, and
    drawing the matplotlib PNG of every figure as well was about 60% of a report build (issue 49).
    """

    name: str  # file stem, e.g. "fig06_throughput_vs_batch"
    title: str
    caption: str
    png: bytes | None = None
    unavailable: str | None = None
    panels: dict[str, list[str]] = field(default_factory=dict)  # panel title → its series (legend entries)
    plotly: dict | None = None  # the interactive version (plotly figure JSON), when one is drawn
    appendix: bool = False  # shown in the appendix, not among the figures
    pending: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def draw_png(self) -> Figure:
        """Draw the pending matplotlib figure into ``png`` and ``panels`` (once); returns the figure.

        A drawing that raises makes the figure unavailable, saying why (`drawn_figure`'s rule).
        """
        draw, self.pending = self.pending, None
        if draw is not None and self.unavailable is None:
            try:
                fig = draw()
                self.panels, self.png = panels_of(fig), png_bytes(fig)
            except Exception as exc:  # noqa: BLE001 — one figure that cannot be drawn says why
                self.unavailable = f"unavailable: {type(exc).__name__}: {exc}"[:300]
        return self

    def attach_plotly(self, spec: Callable[[], dict | None]) -> None:
        """Give an available figure its plotly version ``spec()``: an interactive page then draws no PNG of it.

        A spec that raises leaves the figure to its PNG, and the caption names the failure (the page
        goes on, as for a PNG that cannot be drawn).
        """
        if self.unavailable is not None:
            return
        try:
            self.plotly = spec()
        except Exception as exc:  # noqa: BLE001
            self.caption += f" (interactive version unavailable: {type(exc).__name__}: {exc})"[:300]


def _reference(label: str) -> bool:
    """A reference line (a roofline ceiling), not a series of measurements."""
    return "TFLOP/s" in label and (" spec " in label or label.startswith("measured "))


def panels_of(fig) -> dict[str, list[str]]:
    """Each visible panel's title → the series in its legend.

    Twin axes are folded into their panel; flag marks, line-style keys and ceilings are not series.
    """
    out: dict[str, list[str]] = {}
    at: dict[tuple, str] = {}  # axes position → panel title (a twin axis sits where its panel is)
    for i, ax in enumerate(a for a in fig.axes if a.get_visible()):
        if ax.get_label() == "<colorbar>":
            continue
        labels = [lab for lab in ax.get_legend_handles_labels()[1] if not lab.startswith("_")]
        labels = [lab for lab in labels if lab not in OVERLAYS and not _reference(lab)]
        pos = tuple(round(v, 4) for v in ax.get_position().bounds)
        if pos in at:
            key = at[pos]
            out[key] += [lab for lab in labels if lab not in out[key]]
            continue
        key = ax.get_title() or f"panel {i + 1}"
        key = key if key not in out else f"{key} [{i + 1}]"
        out[key], at[pos] = list(dict.fromkeys(labels)), key
    return out


def make_figure(name: str, title: str, caption: str, fig, dpi: int = 90, **kw) -> Figure:
    """A `Figure` from a drawn matplotlib figure: its PNG and its panels' series."""
    panels = panels_of(fig)
    return Figure(name, title, caption, png=png_bytes(fig, dpi), panels=panels, **kw)


def pending_figure(name: str, title: str, caption: str, draw: Callable[[], Any], **kw) -> Figure:
    """A `Figure` whose matplotlib figure ``draw()`` is drawn only when its PNG is needed (`Figure.draw_png`)."""
    return Figure(name, title, caption, pending=draw, **kw)


def drawn_figure(name: str, title: str, caption: str, draw) -> Figure:
    """`make_figure` of ``draw()``, or a `Figure` that says why it could not be drawn (the report goes on)."""
    return pending_figure(name, title, caption, draw).draw_png()


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: the CLI starts faster without it)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig, dpi: int = 90) -> bytes:
    """PNG bytes, as a 64-colour palette image.

    Plots are flat colours and the page embeds every PNG: this keeps the report a third of the size
    (64 colours hold the precisions' colours and their anti-aliasing; the page's budget is 3 MB).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    try:
        from PIL import Image

        img = (
            Image.open(io.BytesIO(buf.getvalue()))
            .convert("RGB")
            .quantize(64, method=Image.Quantize.FASTOCTREE)
        )
        small = io.BytesIO()
        img.save(small, format="PNG", optimize=True)
        if small.tell() < buf.tell():
            return small.getvalue()
    except Exception:  # noqa: BLE001 — no Pillow, or an image it cannot read: keep matplotlib's PNG
        pass
    return buf.getvalue()


def subplots_grid(n: int, w: float = 4.4, h: float = 3.2, ncols: int = 3):
    """A figure of ``n`` panels, ``ncols`` a row, each ``w`` × ``h`` inches; returns it and its axes, flat."""
    plt = pyplot()
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    # Fixed margins instead of constrained layout: as readable here, and several times faster to render.
    fig.subplots_adjust(
        left=0.6 / (w * ncols),
        right=1 - 0.15 / (w * ncols),
        bottom=0.5 / (h * nrows),
        top=1 - 0.3 / (h * nrows),
        wspace=0.28,
        hspace=0.45,
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


series_label = _label  # kept for callers of the old name
_SERIES = ["engine", "precision", "memory_format", "threads", "include_transfer", "input_mode"]


def plain_ticks(ax, ticks: list | None = None, axis: str = "x") -> None:
    """Plain numbers on a log axis (no mathtext: clearer, and much faster to draw)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    a = ax.xaxis if axis == "x" else ax.yaxis
    if ticks is not None:
        a.set_ticks([float(t) for t in ticks])
    else:
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_locator(NullLocator())


def series_style(r, all_threads: list[int] | None = None, with_engine: bool = True) -> dict:
    """Colour by precision, marker by engine, line by memory format, and the series' legend text."""
    return {
        "color": _color(r, all_threads),
        "marker": _marker(r["engine"]),
        "ls": _dash(r),
        "label": _label(r, with_engine),
    }


def flag_marks(ax, sub: pd.DataFrame, x: str, y: str) -> None:
    """Overlay flagged (red ✕) and ci-not-met (orange ring) points."""
    fl = sub[sub["flagged"]]
    if len(fl):
        ax.scatter(fl[x], fl[y], marker="X", s=90, color="red", zorder=6, label="flagged (see tables)")
    w = sub[["ci-not-met" in (v or []) for v in sub["warnings"]]]
    if len(w):
        ax.scatter(
            w[x],
            w[y],
            marker="o",
            s=70,
            facecolors="none",
            edgecolors="orange",
            linewidths=2,
            zorder=6,
            label="CI target missed",
        )


def _entries(axes) -> dict[str, object]:
    seen: dict[str, object] = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        for h, lab in zip(handles, labels, strict=False):
            seen.setdefault(lab, h)
    return seen


def panel_legend(ax) -> None:
    """One legend entry per series drawn on ``ax`` (duplicates merged)."""
    seen = _entries([ax])
    if seen:
        ax.legend(seen.values(), seen.keys(), fontsize=7, loc="best")


LEGEND_IN_AXES_MAX = 6  # more entries than this would hide the data: one shared legend under the panels


def shared_legend(fig, axes, ncols: int = 4) -> bool:
    """Put a crowded legend under the panels (the figure grows to keep the panels' size)."""
    seen = _entries(axes)
    if len(seen) <= LEGEND_IN_AXES_MAX:
        return False
    width, height = fig.get_size_inches()
    extra = 0.2 * math.ceil(len(seen) / ncols) + 0.25
    bottom, top = fig.subplotpars.bottom * height, (1 - fig.subplotpars.top) * height
    fig.set_size_inches(width, height + extra)
    fig.subplots_adjust(bottom=(bottom + extra) / (height + extra), top=1 - top / (height + extra))
    fig.legend(seen.values(), seen.keys(), loc="lower center", ncol=ncols, fontsize=7, frameon=False)
    return True
