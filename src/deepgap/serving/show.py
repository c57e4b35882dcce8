"""Serving tables in the terminal, printed by ``deepgap show`` below the results table."""

from __future__ import annotations

from typing import Any

from deepgap.serving import tables


def _ms(v: Any) -> str:
    return "" if v is None or v != v else f"{float(v) * 1e3:.3f}"


def _num(v: Any, fmt: str = ",.1f") -> str:
    return "" if v is None or v != v else format(float(v), fmt)


def print_serving(store, console, run_ids: list[str] | None) -> None:
    """Levels, capacities and interference of the selected runs (nothing when there are none)."""
    from rich.table import Table

    if not tables.any_serving(store):
        return
    lv = tables.levels(store, run_ids)
    if len(lv):
        t = Table(
            "run",
            "tenant",
            "kind",
            "batch/delay",
            "offered q/s",
            "served q/s",
            "n",
            "p90 ms",
            "p99 ms",
            "sim p99 ms",
            "batch",
            "queue ms",
            "copies ms",
            "compute ms",
            "SLO",
            title=f"serving: {len(lv)} load levels (sim = the simulator on the same arrivals)",
        )
        for r in lv.to_dict("records"):
            ok = r["status"] == "ok"
            who = r["tenant"] or ""
            if r["purpose"] == "tenant":
                who = f"{who} [{'alone' if r['phase'] == r['tenant'] else r['phase']}]"
            kind = (
                r["scenario"]
                if r["purpose"] in (r["scenario"], "fixed")
                else f"{r['scenario']}/{r['purpose']}"
            )
            copies = (r["h2d_mean_s"] or 0) + (r["d2h_mean_s"] or 0) if ok else None
            t.add_row(
                r["run_id"][-6:],
                who,
                kind,
                r["policy"],
                _num(r["target_qps"]),
                _num(r["achieved_qps"]) if ok else r["status"],
                _num(r["n"], ".0f"),
                _ms(r["latency_p90_s"]),
                _ms(r["latency_p99_s"]),
                _ms(r["predicted_p99_s"]),
                _num(r["mean_batch"], ".2f"),
                _ms(r["queue_mean_s"]),
                _ms(copies),
                _ms(r["compute_mean_s"]),
                ("" if r["verdict"] in (None, "none") else r["verdict"]) if ok else (r["reason"] or "")[:60],
            )
        console.print(t)
    cap = tables.capacity(store, run_ids)
    if len(cap):
        t = Table(
            "run",
            "platform",
            "model",
            "engine",
            "prec",
            "SLO p99 ms",
            "batch/delay",
            "source",
            "capacity q/s",
            "simulated q/s",
            "measured/sim",
            "runs",
            "note",
            title="serving capacity (measured beside simulated)",
        )
        for r in cap.to_dict("records"):
            t.add_row(
                r["run_id"][-6:],
                r["platform"],
                r["model"],
                r["engine"],
                r["precision"],
                _ms(r["slo_s"]),
                r["policy"],
                r["source"],
                _num(r["capacity_qps"]),
                _num(r["predicted_qps"]),
                _num(r["measured_over_predicted"], ".3f"),
                str(int(r["n_probes"] or 0)),
                r["note"] or "",
            )
        console.print(t)
    inter = tables.interference(store, run_ids)
    if len(inter):
        t = Table(
            "run",
            "tenant",
            "phase",
            "offered q/s",
            "served q/s",
            "p99 ms",
            "p99 × alone",
            "served × alone",
            title="tenants: interference (same arrivals in every phase)",
        )
        for r in inter.to_dict("records"):
            t.add_row(
                r["run_id"][-6:],
                r["tenant"],
                r["phase"],
                _num(r["offered_qps"]),
                _num(r["achieved_qps"]),
                _ms(r["latency_p99_s"]),
                _num(r["p99_over_alone"], ".2f"),
                _num(r["qps_over_alone"], ".3f"),
            )
        console.print(t)
