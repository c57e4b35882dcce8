"""Serving tables in the terminal, printed by ``deepgap show`` below the results table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepgap.serving.show import tables
from deepgap.serving.show.llm_tables import COLUMNS as LLM
from deepgap.serving.show.llm_tables import engine_cell, llm_levels, without_llm

Column = tuple[str, Callable[[dict[str, Any]], str]]  # header, the cell of one row


def _ms(v: Any) -> str:
    return "" if v is None or v != v else f"{float(v) * 1e3:.3f}"


def _num(v: Any, fmt: str = ",.1f") -> str:
    return "" if v is None or v != v else format(float(v), fmt)


def print_serving(store, console, run_ids: list[str] | None) -> None:
    """Levels, capacities and interference of the selected runs (nothing when there are none)."""
    if not tables.any_serving(store):
        return
    for frame, title, columns in (
        (
            without_llm(tables.levels(store, run_ids)),
            "serving: {n} load level{s} (sim = the simulator on the same arrivals; a tail is a p99 only where "
            "n ≥ 368, else the max of n{served})",
            LEVELS,
        ),
        (
            tables.text_levels(store, run_ids),
            "serving text models: {n} level{s} (a request is a sequence; tokens counted apart from padding"
            "{served})",
            TEXT,
        ),
        (
            llm_levels(store, run_ids),
            "serving decoders: {n} level{s} (a tail is a p99 only where n ≥ 368{served})",
            LLM,
        ),
        (tables.capacity(store, run_ids), "serving capacity (measured beside simulated)", CAPACITY),
        (
            tables.interference(store, run_ids),
            "tenants: interference (same arrivals in every phase{served})",
            INTERFERENCE,
        ),
    ):
        if len(frame):
            # what "served" is, where a level had an offered rate to set it against (not an offline run's)
            offered = [c for c in ("target_qps", "offered_qps") if c in frame and frame[c].notna().any()]
            served = f"; {tables.SERVED_NOTE}" if offered else ""
            title = title.format(n=len(frame), s="" if len(frame) == 1 else "s", served=served)
            console.print(_table(frame, title, columns))
    for run_id in tables.stopped_runs(store, run_ids):
        console.print(
            f"serve run {run_id[-6:]} was stopped before it finished: its levels are those measured before the "
            "stop (a capacity search among them did not end)",
            markup=False,
        )


def _table(frame: Any, title: str, columns: list[Column]) -> Any:
    from rich.table import Table

    t = Table(*(header for header, _ in columns), title=title)
    for r in frame.to_dict("records"):
        t.add_row(*(cell(r) for _, cell in columns))
    return t


def _ok(r: dict[str, Any]) -> bool:
    return r["status"] == "ok"


def _who(r: dict[str, Any]) -> str:
    who = r["tenant"] or ""
    return (
        f"{who} [{'alone' if r['phase'] == r['tenant'] else r['phase']}]" if r["purpose"] == "tenant" else who
    )


def _kind(r: dict[str, Any]) -> str:
    return r["scenario"] if r["purpose"] in (r["scenario"], "fixed") else f"{r['scenario']}/{r['purpose']}"


def _slo(r: dict[str, Any]) -> str:
    if not _ok(r):
        return (r["reason"] or "")[:60]
    return "" if r["verdict"] in (None, "none") else r["verdict"]


LEVELS: list[Column] = [
    ("run", lambda r: r["run_id"][-6:]),
    ("tenant", _who),
    ("kind", _kind),
    ("batch/delay", lambda r: r["policy"]),
    ("offered q/s", lambda r: _num(r["target_qps"])),
    ("served q/s", lambda r: tables.served_cell(r, _num) if _ok(r) else r["status"]),
    ("n", lambda r: _num(r["n"], ".0f")),
    ("p90 ms", lambda r: _ms(r["latency_p90_s"])),
    ("tail ms", tables.tail_text),  # a p99 where n ≥ 368, else the max of n, named
    ("sim p99 ms", lambda r: _ms(tables.sim_p99(r))),
    ("batch", lambda r: _num(r["mean_batch"], ".2f")),
    ("queue ms", lambda r: _ms(r["queue_mean_s"])),
    ("copies ms", lambda r: _ms((r["h2d_mean_s"] or 0) + (r["d2h_mean_s"] or 0) if _ok(r) else None)),
    ("compute ms", lambda r: _ms(r["compute_mean_s"])),
    ("SLO", _slo),
]
TEXT: list[Column] = [
    ("run", lambda r: r["run_id"][-6:]),
    ("model", lambda r: r["model"]),
    ("kind", _kind),
    ("lengths", lambda r: r["seq_len_dist"] or ""),
    ("padding", lambda r: r["padding"] or ""),
    ("offered seq/s", lambda r: _num(r["target_qps"])),
    ("served seq/s", lambda r: tables.served_cell(r, _num)),
    ("useful tokens/s", lambda r: _num(r["useful_tokens_per_s"], ",.0f")),
    ("padded tokens/s", lambda r: _num(r["padded_tokens_per_s"], ",.0f")),
    (
        "padding %",
        lambda r: _num(
            100 * r["padding_fraction"] if r["padding_fraction"] == r["padding_fraction"] else None
        ),
    ),
    ("sim useful tokens/s", lambda r: _num(r["predicted_useful_tokens_per_s"], ",.0f")),
    ("tail ms", tables.tail_text),
    ("SLO", _slo),
]
CAPACITY: list[Column] = [
    ("run", lambda r: r["run_id"][-6:]),
    ("platform", lambda r: r["platform"]),
    ("model", lambda r: r["model"]),
    ("engine", engine_cell),  # a decoder's admissions, compiled or eager, named
    ("prec", tables.precision_cell),  # a decoder's fp8 cache named
    ("SLO p99 ms", lambda r: _ms(r["slo_s"])),
    ("batch/delay", lambda r: r["policy"]),
    ("source", lambda r: r["source"]),
    ("capacity q/s", lambda r: _num(r["capacity_qps"])),
    ("output tokens/s", lambda r: _num(getattr(r["extra"], "output_tokens_per_s", None))),  # a decoder's
    ("simulated q/s", lambda r: _num(r["predicted_qps"])),
    ("measured/sim", lambda r: _num(r["measured_over_predicted"], ".3f")),
    ("÷ engine alone", tables.engine_ratio_cell),
    ("runs", lambda r: str(int(r["n_probes"] or 0))),
    ("note", lambda r: r["note"] or ""),
]
INTERFERENCE: list[Column] = [
    ("run", lambda r: r["run_id"][-6:]),
    ("tenant", lambda r: r["tenant"]),
    ("phase", lambda r: r["phase"]),
    ("offered q/s", lambda r: _num(r["offered_qps"])),
    ("served q/s", lambda r: tables.served_cell(r, _num, "offered_qps")),
    ("tail ms", tables.tail_text),
    ("p99 × alone", lambda r: _num(r["p99_over_alone"], ".2f")),
    ("served × alone", lambda r: _num(r["qps_over_alone"], ".3f")),
]
