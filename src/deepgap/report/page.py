"""``deepgap report``: a store → one self-contained HTML file, plus its figures' PNGs and its tables as CSV.

The PNGs are those the page shows as images: every figure's with ``--static``; on the default
(interactive) page only those of figures without a plotly version (`draw_pngs`).

Rendering only: the tables and figures come from the sections registered in `deepgap.render.sections`
(the core one in `deepgap.report.core`, then serving, roofline, platforms); this module formats, embeds
PNGs as ``data:`` URIs (the page fetches nothing, online or off) and writes atomically: everything is
written into a temporary folder beside the target and moved into place last, so a failure leaves no
half-written report. Tables and figures go to ``<name>_files/``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap.analysis import aggregate, config_label, prepare
from deepgap.analysis.frame import MEMORY_LABELS
from deepgap.analysis.recommend import recommend
from deepgap.analysis.samples import pooled_samples_fn  # noqa: F401  (re-exported)
from deepgap.core.envinfo import redact_text
from deepgap.core.errors import UsageError
from deepgap.core.version import __version__
from deepgap.render import draw as figures
from deepgap.render.formatting import (
    TABLE_SPECS,
    csv_frame,
    env_rows,
    fmt_gib,
    fmt_ips,
    fmt_list,
    fmt_ms,
    html_table,
)
from deepgap.render.machines import MACHINE_HEADERS, machines
from deepgap.render.sections import ReportContext, TableSpec
from deepgap.render.style import platform_names
from deepgap.render.units import DECODE, of_frame
from deepgap.report import answer as report_answer
from deepgap.report import answer_ratios
from deepgap.report import core as report_core
from deepgap.report import interactive as fi
from deepgap.report import sections as report_sections
from deepgap.report.output_path import check_output, files_dir_name
from deepgap.report.screenshot import find_chromium, screenshot  # noqa: F401  (re-exported)
from deepgap.store import Store, guard, reading
from deepgap.store.paths import claim_folder


@dataclass
class Report:
    """Everything the template shows: run environments, tables, figures, the short answer."""

    store_path: str
    generated_at: str
    runs: list[dict[str, Any]]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[figures.Figure] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    answer_table: pd.DataFrame = field(default_factory=pd.DataFrame)  # platform × model × objective
    how_sure: pd.DataFrame = field(default_factory=pd.DataFrame)  # platform × model: spread, flags, gaps
    interactive: bool = False  # plotly figures (else PNGs only)
    filters: dict[str, list[str]] = field(default_factory=dict)  # filter menus: model, engine, …
    table_specs: dict[str, TableSpec] = field(default_factory=dict)  # this build's tables: title, columns
    ratios: pd.DataFrame = field(default_factory=pd.DataFrame)  # fastest GPU over each other GPU, per model


def load_context(
    store_path: str, run_ids: list[str] | None = None, interactive: bool = False, store: Store | None = None
) -> ReportContext:
    """Read the chosen runs' results (prepared and aggregated) and telemetry once, for every section.

    ``store``: the build's open store (kept open, and in the context for the sections), else one
    opened here and closed.
    """
    with reading(store if store is not None else store_path) as st:
        runs = st.runs()
        known = {r["run_id"] for r in runs}
        for rid in run_ids or []:
            if rid not in known:
                raise UsageError(f"no run {rid!r} in {store_path}", "list runs with `deepgap show --runs`")
        runs = [r for r in runs if not run_ids or r["run_id"] in run_ids]
        df = prepare(st.results_frame(list(run_ids) if run_ids else None))
        agg = aggregate(df, samples=st.samples)
        tel_by_run = {r["run_id"]: st.telemetry_frame(r["run_id"]) for r in runs} if not df.empty else {}
    return ReportContext(store_path, run_ids, interactive, runs, df, agg, tel_by_run, store)


def shown_store_path(store_path: str) -> str:
    """The store path the page's header shows; redacted, its file name only (folders may name a user)."""
    return redact_text(os.path.basename(store_path)) if guard.READ["redact"] else os.path.abspath(store_path)


def build(store_path: str, run_ids: list[str] | None = None, interactive: bool = True) -> Report:
    """Read the store and build every registered section (`deepgap.render.sections`); nothing is written.

    ``interactive``: also draw plotly versions of the per-batch figures (plotly must be installed:
    `figures_interactive.require`; there is no silent fallback to a static page).
    """
    if interactive:
        fi.require()
    store = Store(store_path, readonly=True)  # opened once: every section reads through it (ctx.source)
    try:
        return _build(store_path, run_ids, interactive, store)
    finally:
        store.close()


def _build(store_path: str, run_ids: list[str] | None, interactive: bool, store: Store) -> Report:
    ctx = load_context(store_path, run_ids, interactive, store)
    df, agg = ctx.results, ctx.configurations
    rep = Report(shown_store_path(store_path), _dt.datetime.now().isoformat(timespec="seconds"), ctx.runs)
    ok = int((df["status"] == "ok").sum()) if not df.empty else 0
    rep.counts = {
        "runs": len(ctx.runs),
        "measurements": len(df),
        "ok": ok,
        "failed": len(df) - ok,
        "configurations": len(agg),
        "flagged": int(agg["flagged"].sum()) if len(agg) else 0,
        "excluded": int(agg["n_excluded"].sum()) if len(agg) else 0,
    }
    rep.interactive = ctx.interactive
    for section in report_sections.registered():
        parts = section.build(ctx)
        rep.tables.update(parts.tables)
        rep.figures += parts.figures
        rep.table_specs.update({**section.table_specs, **parts.table_specs})
    report_core.point_to_decode(rep.figures, agg, decode := rep.tables.get("decode"))
    rep.counts.update(report_core.other_workloads(rep.tables))
    rep.answer_table, rep.how_sure = report_answer.answers(agg, df, decode)
    rep.ratios = answer_ratios.cross_gpu_ratios(agg, pooled_samples_fn(store))
    if rep.interactive and not agg.empty:
        rep.filters = {
            "model": sorted(map(str, agg["model"].unique())),
            "engine": sorted(map(str, agg["engine"].unique())),
            "precision": sorted(map(str, agg["precision"].unique())),
            "batch": [str(b) for b in sorted(int(b) for b in agg["batch_size"].unique())],
        }
    by_model: dict[tuple, dict[str, Any]] = {}
    for rec in [*recommend(agg, "throughput"), *recommend(agg, "latency")]:
        entry = by_model.setdefault(
            (rec.model, rec.resolution), {"model": rec.model, "resolution": rec.resolution}
        )
        entry[rec.objective] = rec.choice
        entry["reason"] = rec.reason
    rep.answers = list(by_model.values())
    return rep


def _script_json(obj: Any) -> str:
    """JSON for a ``<script>`` element: ``<``, ``>``, ``&`` as JSON escapes (Django's json_script), no markup."""
    import json

    text = json.dumps(obj, separators=(",", ":"), default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(rep: Report, files_dir: str) -> str:
    """The report page (jinja2 template ``templates/report.html``)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("deepgap", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        trim_blocks=True,  # the page's size is a budget (≤ 3 MB): no indentation repeated per table cell
        lstrip_blocks=True,
    )
    env.filters.update(ips=fmt_ips, ms=fmt_ms, gib=fmt_gib, lst=fmt_list)
    images = {f.name for f in draw_pngs(rep)}
    figs = [
        {
            "name": f.name,
            "title": f.title,
            "caption": f.caption,
            "unavailable": f.unavailable,
            "appendix": f.appendix,
            "plotly": _script_json(f.plotly) if rep.interactive and f.plotly else None,
            "png": bool(f.png),
            "src": "data:image/png;base64," + base64.b64encode(f.png).decode() if f.name in images else None,
        }
        for f in rep.figures
    ]
    interactive = any(f["plotly"] for f in figs)
    agg = rep.tables.get("configurations")
    platforms = list(platform_names(agg).values()) if agg is not None and len(agg) else []
    units = of_frame(agg)  # a text model's answer: output agreement, energy per sequence
    if (agg is None or not len(agg)) and rep.counts.get("decode"):
        units = DECODE  # a decoder-only store: its answer's accuracy is greedy tokens, not top-1
    specs = rep.table_specs or TABLE_SPECS  # a Report built by hand: the core tables
    shown = [html_table(n, rep.tables[n], specs[n]) for n in specs if n in rep.tables and len(rep.tables[n])]
    empty = [units.header(specs[n][0]) for n in specs if n in rep.tables and not len(rep.tables[n])]
    return env.get_template("report.html").render(
        rep=rep,
        version=__version__,
        figures=[f for f in figs if not f["appendix"]],
        appendix_figures=[f for f in figs if f["appendix"]],
        tables=shown,
        empty_tables=empty,
        files_dir=files_dir,
        answer_rows=answer_rows(rep.answer_table, rep.ratios, units.item),
        accuracy_header=units.header(report_answer.ANSWER_ACCURACY_HEADER),
        agreement=units.header("top-1 agreement"),
        has_ratios=bool(len(rep.ratios)),
        ratio_names=", ".join(sorted({f"{a} / {b}" for a, b in _ratio_pairs(rep.ratios)})),
        first_platform=platforms[0] if len(platforms) > 1 else "",
        other_platforms=", ".join(platforms[1:]),
        how_sure=rep.how_sure.to_dict("records"),
        machines=machines(rep.runs),
        machine_headers=MACHINE_HEADERS,
        runs=[
            {"run_id": r["run_id"], "device": r["env"].get("device_name", ""), "rows": env_rows(r)}
            for r in rep.runs
        ],
        memory_labels=MEMORY_LABELS,
        config_label=config_label,
        precision_colors=figures.PREC_COLORS,
        engine_markers=_marker_key(rep),
        interactive=interactive,
        plotly_b64=fi.bundle_b64() if interactive else "",
        filters=rep.filters if interactive else {},
    )


def draw_pngs(rep: Report) -> list[figures.Figure]:
    """Draw the PNGs of the figures the page shows as images: all with ``--static``, else those without plotly.

    Why not all: matplotlib was about 60% of a report build, and an interactive page shows the plotly
    version; its ``<noscript>`` line says that ``deepgap report --static`` gives the images.
    """
    shown = [f.draw_png() for f in rep.figures if not (rep.interactive and f.plotly)]
    return [f for f in shown if f.png]


def _ratio_pairs(ratios: pd.DataFrame) -> list[tuple[str, str]]:
    if ratios.empty:
        return []
    short = platform_names(pd.DataFrame({"platform": [*ratios["platform_a"], *ratios["platform_b"]]}))
    return [(short[a], short[b]) for a, b in zip(ratios["platform_a"], ratios["platform_b"], strict=True)]


def answer_rows(answer: pd.DataFrame, ratios: pd.DataFrame, item: str = "image") -> list[dict[str, Any]]:
    """The answer table's rows; with two GPUs, model by model, each model's ratio row first.

    Why first: a two-GPU store is asked how the GPUs compare, so the ratio leads its model's rows and
    the whole answer stays on the first screen (`answer_ratios.cross_gpu_ratios` computes it).
    ``item``: what the rows measure per joule ("image", or "sequence" for text models: `render.units`).
    """
    if ratios.empty or answer.empty:
        return _with_spans(answer)
    pairs = _ratio_pairs(ratios)
    out: list[dict[str, Any]] = []
    for model, res in dict.fromkeys(zip(answer["model"], answer["resolution"], strict=True)):
        keys = list(zip(ratios["model"], ratios["resolution"], strict=True))
        mine = [i for i, k in enumerate(keys) if k == (model, res)]
        for pair in dict.fromkeys(pairs[i] for i in mine):
            items = [ratios.iloc[i].to_dict() for i in mine if pairs[i] == pair]
            out.append(
                {
                    "ratio": True,
                    "model": model,
                    "resolution": int(res),
                    "label": " / ".join(pair),
                    "parts": [
                        {**it, "goal": RATIO_GOALS.get(it["goal"], it["goal"]).replace("image", item)}
                        for it in items
                    ],
                }
            )
        rows = answer[(answer["model"] == model) & (answer["resolution"] == res)]
        out += _with_spans(rows)
    return out


RATIO_GOALS = {"throughput": "throughput", "latency": "median latency", "per joule": "energy per image"}


def _with_spans(answer: pd.DataFrame) -> list[dict[str, Any]]:
    """Answer rows, the first of each model and platform carrying ``span`` (its row count)."""
    rows = answer.to_dict("records")
    for i, r in enumerate(rows):
        key = (r["platform"], r["model"], r["resolution"])
        first = i == 0 or key != (rows[i - 1]["platform"], rows[i - 1]["model"], rows[i - 1]["resolution"])
        r["span"] = (
            sum(1 for x in rows if (x["platform"], x["model"], x["resolution"]) == key) if first else 0
        )
    return rows


def _marker_key(rep: Report) -> list[tuple[str, str]]:
    """(engine, marker glyph) for the engines in this report: the key shown once above the figures."""
    from deepgap.render.style import marker

    glyph = {
        "o": "●",
        "s": "■",
        "^": "▲",
        "v": "▼",
        ">": "▶",
        "<": "◀",
        "D": "◆",
        "d": "♦",
        "P": "✚",
        "X": "✖",
    }
    agg = rep.tables.get("configurations")
    engines = sorted(map(str, agg["engine"].unique())) if agg is not None and len(agg) else []
    return [(e, glyph.get(marker(e), "★")) for e in engines]


def write_report(
    store_path: str, html_path: str, run_ids: list[str] | None = None, static: bool = False
) -> list[str]:
    """Write the HTML report, its PNGs and CSVs; returns the written paths (HTML first).

    ``static``: PNG figures only, no script, and the page says so. The default page is interactive and
    needs plotly (a `UsageError` at once when it is missing); a figure it draws with plotly has no PNG
    (neither on the page nor beside it), the others' PNGs are embedded and written beside it.
    """
    path = check_output(html_path, interactive=not static)
    return save(build(store_path, run_ids, interactive=not static), path)


def save(rep: Report, html_path: str) -> list[str]:
    """Write a built report (page, PNGs, CSVs) atomically; returns the written paths (HTML first)."""
    path = check_output(html_path, interactive=rep.interactive)
    folder, files = os.path.dirname(path), files_dir_name(path)
    html = render_html(rep, files)
    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder, prefix=".deepgap-report-")
    try:
        os.mkdir(os.path.join(tmp, files))
        claim_folder(os.path.join(tmp, files))
        written = [path]
        for f in draw_pngs(rep):
            if f.png:
                with open(os.path.join(tmp, files, f.name + ".png"), "wb") as fh:
                    fh.write(f.png)
                written.append(os.path.join(folder, files, f.name + ".png"))
        tables = {**rep.tables, "answer": rep.answer_table, "how_sure": rep.how_sure}
        if len(rep.ratios):
            tables["answer_ratios"] = rep.ratios
        for name, frame in tables.items():
            csv_frame(frame).to_csv(os.path.join(tmp, files, name + ".csv"), index=False)
            written.append(os.path.join(folder, files, name + ".csv"))
        with open(os.path.join(tmp, "page.html"), "w", encoding="utf-8") as fh:
            fh.write(html)
        final = os.path.join(folder, files)
        if os.path.isdir(final):
            os.rename(final, os.path.join(tmp, "old_files"))
        os.rename(os.path.join(tmp, files), final)
        os.replace(os.path.join(tmp, "page.html"), path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
