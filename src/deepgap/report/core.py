"""The report's core section: the paper's tables and figures of the measurements (figs. 5-11, table 1).

Computed by `deepgap.analysis`, drawn by `deepgap.report.figures_batch` and `deepgap.report.figures_summary`; with
``interactive``, the per-batch figures also get plotly versions (`deepgap.report.interactive`). Registered
first in `deepgap.render.sections`, so its tables and figures lead the page.
"""

from __future__ import annotations

import pandas as pd

from deepgap.analysis import compare as cmp
from deepgap.analysis import failures, reference, tables
from deepgap.analysis.thermal import thermal_state
from deepgap.render.draw import NO_MEASUREMENT, Figure
from deepgap.render.formatting import TABLE_SPECS
from deepgap.render.machines import machine_key, machine_label
from deepgap.render.sections import Parts, ReportContext, Section, register
from deepgap.render.style import overlay_label
from deepgap.render.units import of_frame, seq_len_of
from deepgap.report import figures_batch, figures_summary, interactive_bars, interactive_pareto
from deepgap.report import interactive as fi


def build(ctx: ReportContext) -> Parts:
    """Tables (table 1, paper comparison, speedups, energy, configurations, …) and figures 5-11."""
    runs, df, agg = ctx.runs, ctx.results, ctx.configurations
    tel, by_machine = _telemetry_panels(runs, df, ctx.telemetry)
    sp32, par = tables.speedup_vs_fp32(agg), tables.pareto(agg)
    en, ts, spc = tables.energy(agg), tables.thread_scaling(agg), tables.speedup_vs_cpu(agg)
    out = _tables(ctx, sp32, par, en, ts, spc)
    n_machines = len(by_machine)
    figs = [
        figures_summary.thermal_timeline(
            [(f"{lab} — {len(fr)} run(s)", fr, p) for lab, fr, p in by_machine.values()]
        ),
        figures_batch.throughput_vs_batch(agg),
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
        figures_batch.latency_vs_batch(agg),
        figures_batch.memory_vs_batch(agg),
        figures_summary.pareto(par),
        figures_batch.speedup_vs_fp32(sp32),
        figures_batch.energy_vs_batch(
            agg,
            "ips_per_watt",
            "fig_perf_per_watt",
            "Performance per watt",
            of_frame(agg).header("images/s per W"),
        ),
        figures_batch.energy_vs_batch(
            agg,
            "joules_per_image",
            "fig_joules_per_image",
            "Energy per image",
            of_frame(agg).header("mJ per image"),
            scale=1e3,
        ),
        figures_summary.bars(
            _cpu_bars(spc),
            "fig_speedup_vs_cpu",
            "Speedup over the CPU baseline",
            "Peak throughput of each platform and precision over its host CPU's best of the same model and "
            "precision (fp32 where the CPU has none), with the interval from both CIs (see the table).",
            "speedup_vs_cpu",
            "× CPU",
            fmt="{:.3g}×",
            err=("speedup_vs_cpu_ci_low", "speedup_vs_cpu_ci_high"),
            why="unavailable: needs a CPU run and another device (a default GPU run measures its host CPU "
            "too, unless --no-cpu-baseline)",
        ),
        figures_summary.thread_scaling(ts),
    ]
    if len(tel) > n_machines:  # the per-run panels, for the record
        figs.append(
            figures_summary.thermal_timeline(
                tel, "fig05b_thermal_timeline_per_run", "Thermal timeline of each run", appendix=True
            )
        )
    units = of_frame(agg)  # a text model's figures: seq/s, mJ per sequence (render.units)
    for f in figs:
        f.title, f.caption = units.header(f.title), units.header(f.caption)
    if ctx.interactive:
        _interactive(figs, agg, par, sp32, spc)
    return Parts(out, figs)


NO_FORWARD = "unavailable: no forward measurement; this store's rows are decode runs (the Decode table below)"


def other_workloads(tables: dict[str, pd.DataFrame]) -> dict[str, int]:
    """The header's counts of decode configurations and serve levels, apart from the batch-sweep measurements.

    Why: a decode- or serve-only store's header read "0 measurements" above its decode table or levels.
    """
    return {
        k: len(tables[t]) if t in tables else 0
        for k, t in (("decode", "decode"), ("levels", "serving_levels"))
    }


def point_to_decode(figs: list, agg: pd.DataFrame, decode: pd.DataFrame | None) -> None:
    """A decoder-only store: figures 6-11 (forward passes) say where its rows are, not that there are none."""
    if agg.empty and decode is not None and len(decode):
        for f in figs:
            if f.unavailable == NO_MEASUREMENT:
                f.unavailable = NO_FORWARD


def _telemetry_panels(runs: list, df: pd.DataFrame, tel_by_run: dict) -> tuple[list, dict]:
    """Fig. 5's panels: (label, GPU telemetry, result id → precision) per run, and per machine its runs."""
    tel, by_machine = [], {}
    if not df.empty:
        precs = dict(zip(df["result_id"].astype(int), df["precision"], strict=False))
        for r in runs:
            t = gpu_part(tel_by_run[r["run_id"]], df, r)
            tel.append((f"run {r['run_id']} — {r['env'].get('device_name', '')}", t, precs))
            by_machine.setdefault(machine_key(r), (machine_label(r), [], precs))[1].append(t)
    return tel, by_machine


def _tables(ctx: ReportContext, sp32, par, en, ts, spc) -> dict[str, pd.DataFrame]:
    """The core section's tables by name: the paper's, the comparisons, every measurement and run's setting."""
    runs, df, agg, tel_by_run = ctx.runs, ctx.results, ctx.configurations, ctx.telemetry
    out = {
        "table1_peak_throughput": tables.table1(agg),
        "paper_comparison": cmp.compare_paper(agg, reference.paper_peaks()),
        "speedup_vs_cpu": spc,
        "speedup_vs_fp32": sp32,
        "pareto_frontier": par[par["on_frontier"]] if len(par) else par,
        "energy": en,
        "cpu_thread_scaling": ts,
        "configurations": agg,
        "failures": failures(df),
        "thermal_state": thermal_state(runs, tel_by_run, df),
    }
    measurements = df.drop(columns=["extra"], errors="ignore")
    out["measurements"] = measurements
    out["environment"] = pd.DataFrame(
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
    return out


def gpu_part(tel: pd.DataFrame, df: pd.DataFrame, run: dict) -> pd.DataFrame:
    """A GPU run's telemetry without its host-CPU part's samples (CPU package readings under the same names).

    The CPU part (docs/cpu-baseline.md) is a second device of the run: its temperatures and power must not
    extend the GPU's thermal timeline.
    """
    if (run.get("env") or {}).get("device") == "cpu" or tel.empty or "result_id" not in tel or df.empty:
        return tel
    cpu = set(df.loc[(df["run_id"] == run["run_id"]) & (df["device"] == "cpu"), "result_id"].astype(int))
    return tel[~tel["result_id"].isin(cpu)] if cpu else tel


def _interactive(
    figs: list[Figure],
    agg: pd.DataFrame,
    par: pd.DataFrame,
    sp32: pd.DataFrame,
    spc: pd.DataFrame | None = None,
) -> None:
    """Attach plotly versions to the per-batch figures, Fig. 7 and the speedup over the CPU.

    An interactive page then draws no PNG of these figures (`deepgap.report.page`); ``--static`` does.
    """
    u = of_frame(agg)
    ci = ("throughput_ci_low_ips", "throughput_ci_high_ips", u.header("throughput img/s"))
    lat_ci = ("latency_median_ci_low_s", "latency_median_ci_high_s", "median latency ms")
    p99 = ("latency_tail_s", "tail (ms)", "latency_tail_name")  # a p99 only where n supports one

    def speedup_label(r, short):
        base = r.get("baseline_engine", r["engine"])
        return overlay_label(r, short) + ("" if base == r["engine"] else f" ÷ {base} fp32")

    specs = {
        "fig06_throughput_vs_batch": lambda: fi.lines(agg, "throughput_ips", u.rate, ci=ci),
        "fig08_latency_vs_batch": lambda: fi.lines(
            agg, "latency_median_s", "ms", 1e3, logy=True, ci=lat_ci, band=p99
        ),
        "fig10_pareto": lambda: interactive_pareto.pareto(par),
        "fig07_median_latency": lambda: interactive_bars.bars(
            _latency_bars(agg), "latency_ms", "median latency (ms)", err=("ci_low_ms", "ci_high_ms")
        ),
        "fig_speedup_vs_cpu": lambda: interactive_bars.bars(
            _cpu_bars(spc) if spc is not None else agg.iloc[0:0],
            "speedup_vs_cpu",
            "× CPU",
            err=("speedup_vs_cpu_ci_low", "speedup_vs_cpu_ci_high"),
            fmt="{:.3g}×",
        ),
        "fig11_speedup_vs_fp32": lambda: fi.lines(sp32, "speedup", "× FP32", label_fn=speedup_label),
        "fig_perf_per_watt": lambda: fi.lines(agg, "ips_per_watt", u.header("images/s per W")),
        "fig_joules_per_image": lambda: fi.lines(agg, "joules_per_image", u.header("mJ per image"), 1e3),
    }
    for f in figs:
        if f.name in specs:
            f.attach_plotly(specs[f.name])


def _latency_bars(agg: pd.DataFrame) -> pd.DataFrame:
    """Fig. 7's rows: per platform, model and series, the smallest batch measured (batch 1 when present)."""
    if agg.empty:
        return agg
    keys = ["platform", "model", "engine", "precision", "memory_format", "threads", "resolution"]
    keys += [k for k in ("input_mode",) if k in agg]  # a resident input is a bar of its own
    first = agg.sort_values("batch_size").groupby(keys, sort=True).head(1)
    return first.assign(
        latency_ms=first["latency_median_s"] * 1e3,
        ci_low_ms=first["latency_median_ci_low_s"] * 1e3,
        ci_high_ms=first["latency_median_ci_high_s"] * 1e3,
        model_name=first["model"],  # the page's model filter reads the model, not its label
        model=[f"{m} bs{b}" for m, b in zip(_model_seq(first), first["batch_size"], strict=False)],
    )


def _model_seq(frame: pd.DataFrame) -> list[str]:
    """Each row's model, with its sequence length for a text model (``bert-base seq 128``): a bar's label.

    Why: a text model measured at two lengths has two bars per series; by model alone they fell on one
    label, one over the other.
    """
    seqs = frame["seq_len"] if "seq_len" in frame else [0] * len(frame)
    pairs = zip(frame["model"], seqs, strict=True)
    return [f"{m} seq {seq_len_of(s)}" if seq_len_of(s) else str(m) for m, s in pairs]


def _cpu_bars(spc: pd.DataFrame) -> pd.DataFrame:
    """The speedup-over-CPU bars: `speedup_vs_cpu`'s rows labelled by model and sequence length."""
    return spc.assign(model_name=spc["model"], model=_model_seq(spc)) if len(spc) else spc


SECTION = register(Section("core", 0, build, dict(TABLE_SPECS)))
