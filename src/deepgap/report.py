"""``deepgap report``: a store → one self-contained HTML file, plus every figure as PNG and table as CSV.

Rendering only: the numbers come from `deepgap.analysis`, the drawings from `deepgap.figures`; this
module formats, embeds PNGs as ``data:`` URIs (the page fetches nothing, online or off) and writes
atomically: everything is written into a temporary folder beside the target and moved into place
last, so a failure leaves no half-written report. Tables and figures go to ``<name>_files/``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap import __version__, figures, figures_summary
from deepgap.analysis import aggregate, config_label, failures, prepare, reference, tables
from deepgap.analysis import compare as cmp
from deepgap.analysis.frame import MEMORY_LABELS
from deepgap.analysis.recommend import recommend
from deepgap.errors import UsageError
from deepgap.report_format import (
    ENV_SUMMARY,
    TABLE_SPECS,
    csv_frame,
    env_rows,
    fmt_gib,
    fmt_ips,
    fmt_list,
    fmt_ms,
    html_table,
)
from deepgap.store import Store


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


def pooled_samples_fn(store: Store):
    """A function: result ids → their raw per-iteration latencies from ``store``, pooled (empty if none)."""
    import numpy as np

    def fn(ids: list[int]):
        arrs = [a for rid in ids for a in store.samples(int(rid))]
        return np.concatenate(arrs) if arrs else np.empty(0)

    return fn


def build(store_path: str, run_ids: list[str] | None = None) -> Report:
    """Read the store and compute every table and figure (nothing is written)."""
    store = Store(store_path, readonly=True)
    try:
        runs = store.runs()
        known = {r["run_id"] for r in runs}
        for rid in run_ids or []:
            if rid not in known:
                raise UsageError(f"no run {rid!r} in {store_path}", "list runs with `deepgap show --runs`")
        runs = [r for r in runs if not run_ids or r["run_id"] in run_ids]
        df = prepare(store.results_frame(list(run_ids) if run_ids else None))
        agg = aggregate(df)
        tel = []
        if not df.empty:
            precs = dict(zip(df["result_id"].astype(int), df["precision"], strict=False))
            for r in runs:
                t = store.telemetry_frame(r["run_id"])
                tel.append((f"run {r['run_id']} — {r['env'].get('device_name', '')}", t, precs))
    finally:
        store.close()
    rep = Report(os.path.abspath(store_path), _dt.datetime.now().isoformat(timespec="seconds"), runs)
    ok = df[df["status"] == "ok"] if not df.empty else df
    rep.counts = {
        "runs": len(runs),
        "measurements": len(df),
        "ok": len(ok),
        "failed": len(df) - len(ok),
        "configurations": len(agg),
        "flagged": int(agg["flagged"].sum()) if len(agg) else 0,
        "excluded": int(agg["n_excluded"].sum()) if len(agg) else 0,
    }
    sp32, par = tables.speedup_vs_fp32(agg), tables.pareto(agg)
    en, ts, spc = tables.energy(agg), tables.thread_scaling(agg), tables.speedup_vs_cpu(agg)
    rep.tables = {
        "table1_peak_throughput": tables.table1(agg, reference.gpu_peaks()),
        "paper_comparison": cmp.compare_paper(agg, reference.paper_peaks()),
        "speedup_vs_cpu": spc,
        "speedup_vs_fp32": sp32,
        "pareto_frontier": par[par["on_frontier"]] if len(par) else par,
        "energy": en,
        "cpu_thread_scaling": ts,
        "configurations": agg,
        "failures": failures(df),
    }
    measurements = df.drop(columns=["extra"], errors="ignore")
    rep.tables["measurements"] = measurements
    rep.tables["environment"] = pd.DataFrame(
        [
            {
                "run_id": r["run_id"],
                "status": r["status"],
                "command": r["command"],
                **{f"env.{k}": v for k, v in r["env"].items()},
            }
            for r in runs
        ]
    )
    rep.figures = [
        figures_summary.thermal_timeline(tel),
        figures.throughput_vs_batch(agg),
        figures_summary.bars(
            _latency_bars(agg),
            "fig07_median_latency",
            "Median latency per model and precision (fig. 7)",
            "Median latency at batch 1 (or the smallest batch measured: see the label) with 95% CI bars.",
            "latency_ms",
            "ms",
            fmt="{:.3g}",
            err=("ci_low_ms", "ci_high_ms"),
        ),
        figures.latency_vs_batch(agg),
        figures.memory_vs_batch(agg),
        figures_summary.pareto(par),
        figures.speedup_vs_fp32(sp32),
        figures.energy_vs_batch(
            agg, "ips_per_watt", "fig_perf_per_watt", "Performance per watt", "images/s per W"
        ),
        figures.energy_vs_batch(
            agg, "joules_per_image", "fig_joules_per_image", "Energy per image", "mJ per image", scale=1e3
        ),
        figures_summary.bars(
            spc,
            "fig_speedup_vs_cpu",
            "Speedup over the CPU baseline",
            "Peak throughput of each "
            "platform and precision over the best FP32 CPU configuration of the same model (see the table).",
            "speedup_vs_cpu",
            "× CPU",
            fmt="{:.3g}×",
            why="unavailable: needs a CPU run and another device",
        ),
        figures_summary.thread_scaling(ts),
    ]
    from deepgap.serving.report_section import section as serving_section  # serve runs' tables and figures

    serving_tables, serving_figures = serving_section(store_path, run_ids)
    rep.tables.update(serving_tables)
    rep.figures += serving_figures
    from deepgap.roofline.report_section import section as roofline_section  # rooflines, seed comparison

    roofline_tables, roofline_figures = roofline_section(store_path, run_ids)
    rep.tables.update(roofline_tables)
    rep.figures += roofline_figures
    by_model: dict[tuple, dict[str, Any]] = {}
    for rec in [*recommend(agg, "throughput"), *recommend(agg, "latency")]:
        entry = by_model.setdefault(
            (rec.model, rec.resolution), {"model": rec.model, "resolution": rec.resolution}
        )
        entry[rec.objective] = rec.choice
        entry["reason"] = rec.reason
    rep.answers = list(by_model.values())
    return rep


def _latency_bars(agg: pd.DataFrame) -> pd.DataFrame:
    """Fig. 7's rows: per platform, model and series, the smallest batch measured (batch 1 when present)."""
    if agg.empty:
        return agg
    keys = ["platform", "model", "engine", "precision", "memory_format", "threads", "resolution"]
    first = agg.sort_values("batch_size").groupby(keys, sort=True).head(1)
    return first.assign(
        latency_ms=first["latency_median_s"] * 1e3,
        ci_low_ms=first["latency_median_ci_low_s"] * 1e3,
        ci_high_ms=first["latency_median_ci_high_s"] * 1e3,
        model=[f"{m} bs{b}" for m, b in zip(first["model"], first["batch_size"], strict=False)],
    )


def render_html(rep: Report, files_dir: str) -> str:
    """The report page (jinja2 template ``templates/report.html``)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("deepgap", "templates"), autoescape=jinja2.select_autoescape(["html"])
    )
    env.filters.update(ips=fmt_ips, ms=fmt_ms, gib=fmt_gib, lst=fmt_list)
    figs = [
        {
            "name": f.name,
            "title": f.title,
            "caption": f.caption,
            "unavailable": f.unavailable,
            "src": "data:image/png;base64," + base64.b64encode(f.png).decode() if f.png else None,
        }
        for f in rep.figures
    ]
    shown = [html_table(n, rep.tables[n]) for n in TABLE_SPECS if n in rep.tables and len(rep.tables[n])]
    empty = [TABLE_SPECS[n][0] for n in TABLE_SPECS if n in rep.tables and not len(rep.tables[n])]
    return env.get_template("report.html").render(
        rep=rep,
        version=__version__,
        figures=figs,
        tables=shown,
        empty_tables=empty,
        files_dir=files_dir,
        runs=[
            {
                "run_id": r["run_id"],
                "device": r["env"].get("device_name", ""),
                "rows": env_rows(r),
                "summary": [str(r["env"].get(k, "–")) for k in ENV_SUMMARY[1:-1]] + [r["command"]],
            }
            for r in rep.runs
        ],
        env_headers=ENV_SUMMARY,
        memory_labels=MEMORY_LABELS,
        config_label=config_label,
    )


def check_output(html_path: str) -> str:
    """Absolute output path, or a `UsageError` when it cannot be written (checked before any work)."""
    path = os.path.abspath(html_path)
    if os.path.isdir(path):
        raise UsageError(f"report path {html_path} is a directory", "pass a file name, e.g. -o report.html")
    folder = os.path.dirname(path)
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(
            f"cannot write {html_path}: {probe} is not a writable folder", "pass a writable -o path"
        )
    try:  # permission bits do not tell about read-only mounts, ACLs or a full disk: create and remove a file
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".deepgap-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"cannot write {html_path}: {exc.strerror} in {probe}", "pass a writable -o path") from None
    files = os.path.join(folder, files_dir_name(path))
    if os.path.exists(files) and not os.path.isdir(files):
        raise UsageError(f"{files} exists and is not a folder", "remove it or pass another -o path")
    return path


def files_dir_name(html_path: str) -> str:
    """``report.html`` → ``report_files`` (the folder of PNGs and CSVs beside the page)."""
    return os.path.splitext(os.path.basename(html_path))[0] + "_files"


def write_report(store_path: str, html_path: str, run_ids: list[str] | None = None) -> list[str]:
    """Write the HTML report, its PNGs and CSVs; returns the written paths (HTML first)."""
    path = check_output(html_path)
    rep = build(store_path, run_ids)
    folder, files = os.path.dirname(path), files_dir_name(path)
    html = render_html(rep, files)
    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder, prefix=".deepgap-report-")
    try:
        os.mkdir(os.path.join(tmp, files))
        written = [path]
        for f in rep.figures:
            if f.png:
                with open(os.path.join(tmp, files, f.name + ".png"), "wb") as fh:
                    fh.write(f.png)
                written.append(os.path.join(folder, files, f.name + ".png"))
        for name, frame in rep.tables.items():
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


def find_chromium() -> str | None:
    """A headless-capable Chromium on PATH (Debian's ``chromium`` package), or None."""
    for exe in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(exe):
            return shutil.which(exe)
    return None


def screenshot(
    html_path: str, png_path: str, width: int = 1200, height: int = 900, timeout_s: float = 120
) -> str:
    """Render ``html_path`` in headless Chromium (network blocked) and save a ``width``×``height`` PNG."""
    exe = find_chromium()
    if exe is None:
        raise UsageError("a screenshot needs Chromium, which is not installed", "apt-get install chromium")
    out = os.path.abspath(png_path)
    with tempfile.TemporaryDirectory() as profile:
        tmp_png = os.path.join(profile, "shot.png")
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}/p",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--window-size={width},{height}",
            f"--screenshot={tmp_png}",
            "file://" + os.path.abspath(html_path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if not os.path.exists(tmp_png):
            raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-800:]}")
        shutil.move(tmp_png, out)
    return out
