"""The report's serving section: tables and figures of serve runs (nothing when a store has none).

Tables: capacities (measured beside simulated and the engine alone), deepgap's capacity beside LoadGen's
(`deepgap.serving.loadgen.capacities`), load levels, tenants.
Figures: the latency CDF of every load level, the throughput–latency curve (p99 against served rate, measured
solid, simulated dashed, with the SLO and the measured capacity), measured against simulated p99 for every level,
and the tenants' interference matrix. Registered in `deepgap.render.sections` with its tables' column specs (they
travel with each build, not through a global table of the formatter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from deepgap.render.draw import Figure, make_figure, plain_ticks, pyplot, subplots_grid
from deepgap.render.formatting import fmt_ips, fmt_ms, fmt_num, fmt_x
from deepgap.render.sections import Parts, ReportContext, Section, register
from deepgap.serving.loadgen.capacities import loadgen_capacities
from deepgap.serving.records.storage import requests
from deepgap.serving.show import tables
from deepgap.serving.show.llm_tables import COLUMNS, TITLE, engine_cell, llm_levels, without_llm

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store

MAX_PANELS = 6
MAX_LEVELS = 8

TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "serving_capacity": (
        "Serving capacity at the p99 SLO — measured beside the simulator's prediction",
        [
            ("platform", "platform"),
            ("model", "model"),
            ("engine", engine_cell),  # a decoder's admissions, compiled or eager, named
            ("precision", tables.precision_cell),  # a decoder's fp8 KV cache named
            ("format", "memory_format"),
            ("SLO p99 ms", lambda r: fmt_ms(r["slo_s"])),
            ("max batch / delay", "policy"),
            ("source", "source"),
            ("capacity q/s", lambda r: fmt_ips(r["capacity_qps"])),
            (
                "output tokens/s (decoders)",
                lambda r: fmt_ips((r.get("extra") or {}).get("output_tokens_per_s")),
            ),
            ("simulated q/s", lambda r: fmt_ips(r["predicted_qps"])),
            ("measured / simulated", lambda r: fmt_x(r["measured_over_predicted"])),
            ("lowest failing q/s", lambda r: fmt_ips(r["upper_qps"])),
            ("capacity ÷ engine alone", tables.engine_ratio_cell),
            ("runs", "n_probes"),
            ("note", "note"),
            ("run", "run_id"),
        ],
    ),
    "serving_loadgen": (
        "Server capacity: deepgap's beside MLCommons LoadGen's (stepping down from deepgap's rate until "
        "LoadGen calls it VALID), with the null-SUT floor: LoadGen's p99 when nothing is served",
        [
            ("platform", "platform"),
            ("model", "model"),
            ("engine", "engine"),
            ("precision", "precision"),
            ("SLO p99 ms", lambda r: fmt_ms(r["slo_s"])),
            ("max batch / delay", "policy"),
            ("deepgap q/s", lambda r: fmt_ips(r["deepgap_qps"])),
            ("deepgap p99 ms", lambda r: fmt_ms(r["deepgap_p99_s"])),
            ("deepgap verdict", "deepgap_verdict"),
            ("LoadGen at deepgap's rate", "loadgen_result"),
            ("its p99 ms", lambda r: fmt_ms(r["loadgen_p99_s"])),
            (
                "LoadGen capacity q/s",
                lambda r: (
                    fmt_ips(r["loadgen_capacity_qps"])
                    if r["loadgen_capacity_qps"]
                    else f"INVALID down to {fmt_ips(r['lowest_tried_qps'])}"
                ),
            ),
            ("LoadGen / deepgap", lambda r: fmt_x(r["loadgen_over_deepgap"])),
            ("LoadGen p99 ms there", lambda r: fmt_ms(r["loadgen_capacity_p99_s"])),
            ("null-SUT floor p99 ms", lambda r: fmt_ms(r["floor_p99_s"])),
            ("LoadGen − deepgap per sample, p99 ms", lambda r: fmt_ms(r["per_sample_diff_p99_s"])),
            ("LoadGen issue delay p99 ms", lambda r: fmt_ms(r["issue_delay_p99_s"])),
            (
                "min duration s / queries",
                lambda r: f"{fmt_num(r['min_duration_s'], 'g')} / {fmt_num(r['min_queries'], 'g')}",
            ),
            ("early stopping", "early_stopping"),
            ("run", "run_id"),
        ],
    ),
    "serving_levels": (
        "Serving load levels, with the simulator's prediction for the same arrivals; " + tables.SERVED_NOTE,
        [
            ("platform", "platform"),
            ("tenant", "tenant"),
            ("model", "model"),
            ("engine", "engine"),
            ("precision", "precision"),
            ("scenario", "scenario"),
            ("purpose", "purpose"),
            ("max batch / delay", "policy"),
            ("offered q/s", lambda r: fmt_ips(r["target_qps"])),
            ("served q/s", lambda r: tables.served_cell(r, fmt_ips)),
            ("simulated q/s", lambda r: fmt_ips(r["predicted_qps"])),
            ("n", "n"),
            ("p50 ms", lambda r: fmt_ms(r["latency_p50_s"])),
            ("p90 ms", lambda r: fmt_ms(r["latency_p90_s"])),
            ("tail ms (p99 where n ≥ 368, else max of n)", tables.tail_text),
            ("simulated p99 ms (where n ≥ 368)", lambda r: fmt_ms(tables.sim_p99(r))),
            ("mean batch", lambda r: fmt_num(r["mean_batch"])),
            ("queue ms", lambda r: fmt_ms(r["queue_mean_s"])),
            ("h2d ms", lambda r: fmt_ms(r["h2d_mean_s"])),
            ("compute ms", lambda r: fmt_ms(r["compute_mean_s"])),
            ("d2h ms", lambda r: fmt_ms(r["d2h_mean_s"])),
            ("other ms", lambda r: fmt_ms(r["other_mean_s"])),
            ("verdict", "verdict"),
            ("status", "status"),
            ("reason", "reason"),
            ("run", "run_id"),
        ],
    ),
    "serving_text": (
        "Serving text models — a request is a sequence; useful tokens (the requests' own) apart from "
        "padded tokens (what the engine ran); " + tables.SERVED_NOTE,
        [
            ("platform", "platform"),
            ("model", "model"),
            ("precision", "precision"),
            ("purpose", "purpose"),
            ("lengths", "seq_len_dist"),
            ("padding", "padding"),
            ("max batch / delay", "policy"),
            ("offered seq/s", lambda r: fmt_ips(r["target_qps"])),
            ("served seq/s", lambda r: tables.served_cell(r, fmt_ips)),
            ("useful tokens/s", lambda r: fmt_ips(r["useful_tokens_per_s"])),
            ("padded tokens/s", lambda r: fmt_ips(r["padded_tokens_per_s"])),
            ("padding %", lambda r: fmt_num(100 * r["padding_fraction"])),
            ("simulated useful tokens/s", lambda r: fmt_ips(r["predicted_useful_tokens_per_s"])),
            ("tail ms (p99 where n ≥ 368, else max of n)", tables.tail_text),
            ("verdict", "verdict"),
            ("run", "run_id"),
        ],
    ),
    "serving_llm": (TITLE, COLUMNS),
    "serving_interference": (
        "Tenants on one device: p99 and served rate alone and together (same arrivals in every phase); "
        + tables.SERVED_NOTE,
        [
            ("platform", "platform"),
            ("tenant", "tenant"),
            ("phase", "phase"),
            ("offered q/s", lambda r: fmt_ips(r["offered_qps"])),
            ("served q/s", lambda r: tables.served_cell(r, fmt_ips, "offered_qps")),
            ("tail ms (p99 where n ≥ 368, else max of n)", tables.tail_text),
            ("p99 × alone (both n ≥ 368)", lambda r: fmt_x(r["p99_over_alone"])),
            ("served × alone", lambda r: fmt_x(r["qps_over_alone"])),
            ("run", "run_id"),
        ],
    ),
}


def section(
    store_path: str | Store, run_ids: list[str] | None = None
) -> tuple[dict[str, pd.DataFrame], list[Figure]]:
    """Tables and figures of the serve runs in ``store_path`` (empty when there are none).

    ``store_path``: a path, or the report build's open `Store` (`deepgap.store.reading`).
    """
    from deepgap.store import reading

    with reading(store_path) as st:
        if not tables.any_serving(st):
            return {}, []
        every = tables.levels(st, run_ids)
        lv = without_llm(every)  # a decoder's levels: their own table (TTFT, TPOT), not the batch figures
        cap = tables.capacity(st, run_ids)
        inter = tables.interference(st, run_ids)
        lgc = loadgen_capacities(lv, cap)
        figs = [
            latency_cdf(st, lv),
            throughput_latency(lv, cap),
            predicted_vs_measured(lv),
            interference_figure(inter),
        ]
    if "extra" in cap:  # the report's table keeps the stored JSON objects (its CSV writes them as JSON)
        cap = cap.assign(extra=[e.to_json() for e in cap["extra"]])
    out = {
        "serving_capacity": cap,
        "serving_loadgen": lgc,
        "serving_levels": lv.drop(columns=["extra"], errors="ignore"),
        "serving_text": (
            lv[lv["useful_tokens_per_s"].notna()].drop(columns=["extra"])
            if "useful_tokens_per_s" in lv
            else lv
        ),
        "serving_llm": llm_levels(st, frame=every),
        "serving_interference": inter,
    }
    return {k: v for k, v in out.items() if len(v)}, [f for f in figs if f is not None]


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build."""
    found, figs = section(ctx.source, ctx.run_ids)
    return Parts(found, figs)


SECTION = register(Section("serving", 10, build, TABLE_SPECS))


def _groups(lv: pd.DataFrame, tenants: bool = True) -> list[tuple[str, pd.DataFrame]]:
    ok = lv[
        (lv["status"] == "ok")
        & (lv["scenario"] == "server")
        & (tenants | (lv["purpose"] != "tenant"))
        & (lv["purpose"] != "loadgen-null")
    ]  # the null SUT served nothing: the LoadGen table shows it
    out = []
    for (run, tenant, policy), g in ok.groupby(["run_id", "tenant", "policy"], sort=False):
        name = f"{g['model'].iloc[0]} {g['engine'].iloc[0]} {g['precision'].iloc[0]} · {policy}"
        if tenant:
            name = f"{tenant} · {policy}"
        out.append((f"{name}\n{g['platform'].iloc[0]} · run …{run[-6:]}", g))
    return out[:MAX_PANELS]


def latency_cdf(store, lv: pd.DataFrame) -> Figure:
    """Per server run and policy, the latency CDF of each load level (rate), the SLO as a line."""
    fig_id, title = "fig_serving_latency_cdf", "Latency distribution per load level"
    cap = (
        "Empirical CDF of request latency (arrival → result on the host) at each offered rate; "
        "the dashed line is the SLO. Tenants: one curve per co-location phase."
    )
    groups = _groups(lv)
    if not groups:
        return Figure(fig_id, title, cap, unavailable="unavailable: no server-scenario level in these runs")
    plt = pyplot()
    fig, axes = subplots_grid(len(groups), w=4.6, h=3.3)
    for ax, (name, g) in zip(axes, groups, strict=False):
        g = g.sort_values(["target_qps", "serve_id"])
        pick = g.iloc[np.unique(np.linspace(0, len(g) - 1, min(len(g), MAX_LEVELS)).round().astype(int))]
        cmap = plt.get_cmap("viridis")
        for k, r in enumerate(pick.to_dict("records")):
            lat = np.sort(requests(store, r["serve_id"])["latency_s"].to_numpy()) * 1e3
            if not lat.size:
                continue
            label = f"{r['target_qps']:,.0f} q/s" + (f" [{r['phase']}]" if r["purpose"] == "tenant" else "")
            ax.plot(
                lat,
                np.arange(1, lat.size + 1) / lat.size,
                color=cmap(k / max(1, len(pick) - 1)),
                lw=1.2,
                label=label,
            )
        slo = g["slo_s"].dropna()
        if len(slo):
            ax.axvline(float(slo.iloc[0]) * 1e3, color="#d62728", ls="--", lw=1)
        ax.set_xscale("log")
        plain_ticks(ax)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    return make_figure(fig_id, title, cap, fig)


def throughput_latency(lv: pd.DataFrame, cap: pd.DataFrame) -> Figure:
    """p99 against served rate per policy: measured (solid) and simulated (dashed), SLO and capacity marked."""
    fig_id, title = "fig_serving_throughput_latency", "Throughput–latency curve"
    caption = (
        "Latency tail against the offered rate for every load level: measured (solid; its p99 where the level "
        "has at least 368 requests, else their maximum; hollow where a capacity probe stopped once it could "
        "no longer pass) and the simulator's p99 on the same arrivals (dashed; only beside a measured p99, at "
        "levels of at least 368 requests). Red "
        "dashed line: the SLO; green line: the measured capacity. Served rates are in the levels table."
    )
    groups = _groups(lv, tenants=False)
    if not groups:
        return Figure(
            fig_id, title, caption, unavailable="unavailable: no single-model server run in these runs"
        )
    fig, axes = subplots_grid(len(groups), w=4.6, h=3.3)
    for ax, (name, g) in zip(axes, groups, strict=False):
        g = g.sort_values("target_qps")
        stopped = g["stopped"].fillna("") != ""
        tail = g["latency_tail_s"] * 1e3  # p99 where n supports one, else the max of n (`tables.add_tails`)
        ax.plot(g["target_qps"], tail, "-", color="#1f77b4", lw=1.2, label="measured")
        ax.plot(g["target_qps"][~stopped], tail[~stopped], "o", color="#1f77b4", ms=3)
        ax.plot(
            g["target_qps"][stopped],
            tail[stopped],
            "o",
            mfc="none",
            color="#1f77b4",
            ms=4,
            label="stopped early (cannot pass)",
        )
        sim = g[g["p99_supported"].fillna(False).astype(bool)]  # a simulated p99 only beside a measured one
        if len(sim):
            ax.plot(sim["target_qps"], sim["predicted_p99_s"] * 1e3, "s--", color="#ff7f0e", ms=3, lw=1,
                    label="simulated")  # fmt: skip
        slo = g["slo_s"].dropna()
        if len(slo):
            ax.axhline(float(slo.iloc[0]) * 1e3, color="#d62728", ls="--", lw=1)
        if len(cap):
            m = cap[
                (cap["run_id"] == g["run_id"].iloc[0])
                & (cap["source"] == "measured")
                & (cap["policy"] == g["policy"].iloc[0])
                & (cap["capacity_qps"] > 0)
            ]
            if len(m):
                ax.axvline(float(m["capacity_qps"].iloc[0]), color="#2ca02c", lw=1, label="measured capacity")
        ax.set_yscale("log")
        plain_ticks(ax, axis="y")
        ax.set_xlabel("offered queries/s")
        ax.set_ylabel("tail latency (ms): p99, or max of n")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=6)
    return make_figure(fig_id, title, caption, fig)


def predicted_vs_measured(lv: pd.DataFrame) -> Figure:
    """Simulated against measured p99 for every level (the diagonal is perfect prediction)."""
    fig_id, title = "fig_serving_predicted_vs_measured", "Simulator against measurement"
    caption = (
        "Each point is one load level: the p99 the simulator predicts for the same arrivals (fed the "
        "calibrated service curve) against the p99 measured, for the levels of at least 368 requests (fewer "
        "support no p99). Points above the diagonal: the real server was slower than predicted."
    )
    # a p99 on both axes needs n ≥ 368 requests (`tables.add_tails`): a level with fewer is left out
    ok = lv[
        (lv["status"] == "ok")
        & lv["predicted_p99_s"].notna()
        & lv["latency_p99_s"].notna()
        & lv["p99_supported"]
    ]
    if ok.empty:
        n = int(((lv["status"] == "ok") & lv["predicted_p99_s"].notna() & ~lv["p99_supported"]).sum())
        why = (
            f"no level of at least 368 requests ({n} predicted level(s) had fewer: too few for a p99 to set "
        )
        why = why + "against the simulator's)" if n else "no level with a prediction in these runs"
        return Figure(fig_id, title, caption, unavailable=f"unavailable: {why}")
    fig, (ax,) = subplots_grid(1, w=4.6, h=4.0)
    for scen, g in ok.groupby("scenario"):
        ax.scatter(g["predicted_p99_s"] * 1e3, g["latency_p99_s"] * 1e3, s=10, label=scen)
    lo = float(min(ok["predicted_p99_s"].min(), ok["latency_p99_s"].min())) * 1e3
    hi = float(max(ok["predicted_p99_s"].max(), ok["latency_p99_s"].max())) * 1e3
    ax.plot([lo, hi], [lo, hi], color="#7f7f7f", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_ticks(ax)
    plain_ticks(ax, axis="y")
    ax.set_xlabel("simulated p99 (ms)")
    ax.set_ylabel("measured p99 (ms)")
    ax.legend(fontsize=7)
    return make_figure(fig_id, title, caption, fig)


def interference_figure(inter: pd.DataFrame) -> Figure:
    """Heatmap: p99 of each tenant (rows) in each phase (columns), relative to the tenant alone."""
    fig_id, title = "fig_serving_interference", "Interference matrix"
    caption = "p99 latency of each tenant in each co-location phase divided by its p99 alone (1.00 = no interference)."
    if inter.empty:
        return Figure(fig_id, title, caption, unavailable="unavailable: no multi-tenant run in these runs")
    runs = sorted(set(inter["run_id"])) if "run_id" in inter else []
    if len(runs) > 1:  # one matrix per figure: the latest run (run ids begin with their time)
        inter = inter[inter["run_id"] == runs[-1]]
        caption += f" Latest of {len(runs)} multi-tenant runs: {runs[-1]} (the table above lists every run)."
    m = tables.interference_matrix(inter)
    fig, (ax,) = subplots_grid(1, w=max(4.0, 1.3 * m.shape[1] + 2), h=max(2.5, 0.5 * m.shape[0] + 1.5))
    from matplotlib.colors import LogNorm

    v = m.to_numpy(dtype=float)
    # log colours: an oversubscribed phase (hundreds ×) must not wash out the 1.2× and 3× cells
    norm = LogNorm(vmin=1.0, vmax=max(2.0, float(np.nanmax(v))))
    im = ax.imshow(np.clip(v, 1.0, None), cmap="Reds", norm=norm, aspect="auto")
    ax.set_xticks(range(m.shape[1]), [c.replace("+", "+\n") for c in m.columns], fontsize=7)
    ax.set_yticks(range(m.shape[0]), list(m.index), fontsize=7)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            if v[i, j] == v[i, j]:
                dark = norm(max(v[i, j], 1.0)) > 0.6
                ax.text(
                    j,
                    i,
                    f"{v[i, j]:.2f}×",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
    fig.colorbar(im, ax=ax, fraction=0.05)
    return make_figure(fig_id, title, caption, fig)
