"""A report section for two or more GPU platforms of one store: ratios beside the roofline's prediction.

Registered in `deepgap.render.sections` like the roofline and serving sections (tables by name, `Figure`
records); it computes with `deepgap.analysis.platforms.side_by_side` and draws
one figure: every matched and best-batch ratio (with its 95% CI) against the ratio the platforms'
ceilings predict, on the diagonal where the roofline explains it. A store with fewer than two GPU
platforms gives nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepgap.render.formatting import fmt_ci, fmt_ips, fmt_num, fmt_x
from deepgap.render.sections import Parts, ReportContext, Section, register

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.render.draw import Figure
    from deepgap.store import Store


def _departs(r: dict[str, Any]) -> str:
    return {True: "departs", False: "agrees"}.get(r.get("departs"), "–")


def _config(r: dict[str, Any]) -> str:
    fmt = r.get("memory_format") or "nchw"
    return f"{r.get('engine')} {r.get('precision')}" + ("" if fmt == "nchw" else f" {fmt}")


def _batches(r: dict[str, Any]) -> str:
    """``256``, or ``256 / 32`` when A and B ran at different batches (their configurations say which)."""
    a, b = (str(r.get(k) or "") for k in ("configuration_a", "configuration_b"))
    ba, bb = (next((w[2:] for w in t.split() if w.startswith("bs") and w[2:].isdigit()), "") for t in (a, b))
    return ba if ba == bb or not bb else f"{ba} / {bb}"


def _mj(r: dict[str, Any]) -> str:
    a, b = r.get("joules_per_image_a"), r.get("joules_per_image_b")
    return f"{fmt_num(1e3 * a if a else None)} · {fmt_num(1e3 * b if b else None)}"


# A/B columns narrow enough for a 1280 px page: platforms in the title, the full configurations,
# per-op predictions, memory-time share and ceilings' source in the CSV
_PAIR_COLUMNS: list[tuple[str, Any]] = [
    ("model", "model"),
    ("engine precision format", _config),
    ("batch A / B", _batches),
    ("A images/s", lambda r: fmt_ips(r.get("throughput_ips_a"))),
    ("B images/s", lambda r: fmt_ips(r.get("throughput_ips_b"))),
    (
        "A/B · 95% CI",
        lambda r: (
            f"{fmt_x(r.get('speedup'))} "
            + fmt_ci(r.get("speedup_ci_low"), r.get("speedup_ci_high"), lambda v: fmt_num(v, ".3g"))
        ),
    ),
    ("roofline A/B", lambda r: f"{fmt_x(r.get('predicted_ratio'))} ({r.get('bound') or '–'})"),
    ("vs roofline", _departs),
    ("mJ/image A · B", _mj),
]
TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "platforms_ceilings": (
        "Each platform's ceilings: measured (deepgap peaks) and datasheet",
        [
            ("platform", "platform"),
            ("ceiling", "ceiling"),
            ("unit", "unit"),
            ("measured", lambda r: fmt_num(r.get("measured"), ".4g")),
            ("datasheet", lambda r: fmt_num(r.get("datasheet"), ".4g")),
            ("measured / datasheet", lambda r: fmt_num(r.get("measured_over_datasheet"), ".3g")),
            ("datasheet row", "datasheet_gpu"),
        ],
    ),
    "platforms_best_batch": ("Platform A over platform B, each at its best batch", _PAIR_COLUMNS),
    "platforms_matched": ("Platform A over platform B, matched configurations", _PAIR_COLUMNS),
}


def ratio_figure(best: pd.DataFrame, matched: pd.DataFrame):
    """Measured ratio (95% CI bars) against the roofline's predicted ratio; filled markers depart."""
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.ticker import FormatStrFormatter

    fig = MplFigure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.subplots()
    lo_hi: list[float] = []
    for frame, marker, label in ((matched, "o", "matched"), (best, "s", "best batch")):
        if frame.empty or "predicted_ratio" not in frame:
            continue
        f = frame[frame["predicted_ratio"].notna()]
        for bound, colour in (("memory-bound", "tab:blue"), ("compute-bound or mixed", "tab:orange")):
            g = f[f["bound"] == "memory"] if bound == "memory-bound" else f[f["bound"] != "memory"]
            if g.empty:
                continue
            x, y = g["predicted_ratio"].astype(float), g["speedup"].astype(float)
            lo_ci, hi_ci = g["speedup_ci_low"].astype(float), g["speedup_ci_high"].astype(float)
            err = [(y - lo_ci).clip(lower=0), (hi_ci - y).clip(lower=0)]
            ax.errorbar(x, y, yerr=err, fmt="none", ecolor=colour, alpha=0.5)
            dep = g["departs"].fillna(False).astype(bool)
            if dep.any():
                ax.scatter(x[dep], y[dep], marker=marker, color=colour, label=f"{label}, {bound}, departs")
            if (~dep).any():
                ax.scatter(
                    x[~dep],
                    y[~dep],
                    marker=marker,
                    facecolors="none",
                    edgecolors=colour,
                    label=f"{label}, {bound}",
                )
            lo_hi += [*x, *lo_ci.dropna(), *hi_ci.dropna(), *y]
    if not lo_hi:
        raise ValueError("no ratio has a roofline prediction (no ceilings for both platforms)")
    lo, hi = min(lo_hi) * 0.9, max(lo_hi) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FormatStrFormatter("%.2g"))
        axis.set_minor_formatter(FormatStrFormatter("%.2g"))
    ax.set_xlabel("roofline-predicted throughput ratio A/B")
    ax.set_ylabel("measured throughput ratio A/B (95% CI)")
    ax.legend(fontsize=7)
    return fig


def section(
    store_path: str | Store, run_ids: list[str] | None = None, agg: pd.DataFrame | None = None
) -> tuple[dict[str, pd.DataFrame], list[Figure]]:
    """Tables ``platforms_ceilings``, ``platforms_best_batch``, ``platforms_matched`` and the ratio figure."""
    from deepgap.analysis.platforms import side_by_side
    from deepgap.render.draw import Figure, png_bytes

    out = side_by_side(store_path, run_ids=run_ids, agg=agg)
    if len(out["platforms"]) < 2:
        return {}, []
    names = " vs ".join(out["platforms"]["platform"])
    caption = (
        f"{names}: each measured ratio against the ratio the two platforms' ceilings predict at the "
        "configuration's arithmetic intensity (memory-bound: bandwidth ratio; compute-bound: compute ratio). "
        "Filled markers: the prediction lies outside the measured 95% CI."
    )
    if out.get("provenance"):  # different code or sessions: the intervals cover neither
        caption += " Warning: " + " ".join(out["provenance"])
    try:
        fig = Figure(
            "fig_platforms_ratio_vs_roofline",
            "Platform ratios vs the roofline",
            caption,
            png=png_bytes(ratio_figure(out["best_batch"], out["matched"])),
        )
    except Exception as exc:  # noqa: BLE001 — the figure says why it is missing, the report goes on
        fig = Figure(
            "fig_platforms_ratio_vs_roofline",
            "Platform ratios vs the roofline",
            caption,
            unavailable=f"unavailable: {type(exc).__name__}: {exc}"[:300],
        )
    tables = {
        "platforms_ceilings": out["ceilings"],
        "platforms_best_batch": out["best_batch"],
        "platforms_matched": out["matched"],
    }
    return {k: v for k, v in tables.items() if len(v)}, [fig]


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build."""
    found, figs = section(ctx.source, ctx.run_ids, ctx.configurations)
    titles = {}  # the platforms in the title, not in two columns of every row
    for key, (title, cols) in TABLE_SPECS.items():
        if key in found and "platform_a" in found[key] and len(found[key]):
            pairs = dict.fromkeys(zip(found[key]["platform_a"], found[key]["platform_b"], strict=True))
            names = "; ".join(f"A = {a}, B = {b}" for a, b in pairs)
            titles[key] = (title.replace("Platform A over platform B", f"A over B ({names})"), cols)
    return Parts(found, figs, titles)


SECTION = register(Section("platforms", 30, build, TABLE_SPECS))
