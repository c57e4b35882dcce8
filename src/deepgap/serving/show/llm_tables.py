"""A served decoder's levels as a table: queries/s, output tokens/s, TTFT and TPOT with their tails' names.

Shared by ``deepgap show`` (`deepgap.serving.show.console`) and the report (`report_section`). A tail is
printed with what it is: ``41.20 (p99 of n=1000)`` or ``9.56 (max of n=60)`` (a p99 needs n ≥ 368).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from deepgap.serving.records.details import LlmLevel
from deepgap.serving.show.tables import SERVED_NOTE, precision_cell, served_cell

if TYPE_CHECKING:
    from deepgap.store import Store

LLM_COLUMNS = tuple(f for f in LlmLevel.declared())


def llm_levels(
    store: Store, run_ids: list[str] | None = None, frame: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The decoder levels (``serve_runs`` rows with `LlmLevel` details), one column per figure; empty if none."""
    from deepgap.serving.show.tables import levels

    df = levels(store, run_ids) if frame is None else frame
    if df.empty or "extra" not in df:
        return pd.DataFrame()
    keep = [getattr(e, "llm", None) is not None for e in df["extra"]]
    df = df[keep].copy()
    if df.empty:
        return df
    for col in LLM_COLUMNS:
        df[col] = [getattr(e.llm, col) for e in df["extra"]]
    # the set-up's words (`llm_setup`'s engine_info): "" where a store lacks them
    for col, key in SETUP.items():
        df[col] = [(e.engine_info.get(key) if e.engine_info else None) or "" for e in df["extra"]]
    return df.drop(columns=["extra"])


# what a level's set-up said of its step and its admissions, and the position every slot held while its
# decode step was calibrated (`LlmLoad.decode_position`; "" before session 49): column → engine_info key
SETUP = {"decode_step": "decode_step", "admissions": "prefill", "calibrated_at": "decode_calibrated_at"}


def engine_cell(r: dict[str, Any]) -> str:
    """The engine, and whether its admissions prefilled compiled or eager (`llm_engines.packed_prefill`).

    Why: the same engine serves with either (``DEEPGAP_DECODE_PREFILL``), and at 8B the two capacities part
    by half (session 45); a level whose set-up left no words (a store before them) shows the engine alone.
    """
    how = r.get("admissions") or ""
    if not isinstance(how, str) or not how:
        return str(r["engine"])
    return f"{r['engine']} · {'compiled' if 'compiled (' in how else 'eager'} admissions"


def without_llm(df: pd.DataFrame) -> pd.DataFrame:
    """The levels that are no decoder's (their latency columns are a batch's; a decoder's are its own table)."""
    if df.empty or "extra" not in df:
        return df
    return df[[getattr(e, "llm", None) is None for e in df["extra"]]]


def tail_cell(r: dict[str, Any], name: str) -> str:
    """``41.20 ms (p99 of n=1000)`` or ``9.56 ms (max of n=60)`` for ``name`` (ttft or tpot)."""
    v, kind, n = r.get(f"{name}_tail_s"), r.get(f"{name}_tail_kind"), r.get(f"{name}_n")
    if v is None or v != v:
        return ""
    return f"{float(v) * 1e3:.2f} ({kind} of n={int(n)})"


def _ms(v: Any) -> str:
    return "" if v is None or v != v else f"{float(v) * 1e3:.2f}"


def _num(v: Any) -> str:
    return "" if v is None or v != v else f"{float(v):,.1f}"


def _tokens(r: dict[str, Any]) -> str:
    """Output tokens/s; a level a stop cut short says so (the rate of an overloaded server, not a capacity)."""
    left = [f"{int(v)} {what}" for v, what in ((r.get("n_unfinished"), "running"), (r.get("n_queued"), "queued"))
            if v is not None and v == v and v > 0]  # fmt: skip
    return _num(r["output_tokens_per_s"]) + (f" (stopped: {', '.join(left)})" if left else "")


def _verdict(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return (r.get("reason") or "")[:60]
    return f"{r['verdict']} (TTFT {r['ttft_verdict']}, TPOT {r['tpot_verdict']})"


# (header, cell of one row): the console's and the report's columns
COLUMNS: list[tuple[str, Any]] = [
    ("run", lambda r: r["run_id"][-6:]),
    ("model", lambda r: r["model"]),
    ("engine", engine_cell),
    ("prec", precision_cell),  # with "· fp8 KV cache" where the cache held fp8 codes
    ("kind", lambda r: r["purpose"]),
    ("slots", lambda r: str(r["slots"])),
    ("lengths", lambda r: f"in {r['input_len_dist']}, out {r['output_len_dist']}"),
    ("offered q/s", lambda r: _num(r["target_qps"])),
    ("served q/s", lambda r: served_cell(r, _num)),
    ("output tokens/s", _tokens),
    ("sim output tokens/s", lambda r: _num(r["predicted_output_tokens_per_s"])),
    ("TTFT p50 ms", lambda r: _ms(r["ttft_p50_s"])),
    ("TTFT tail ms", lambda r: tail_cell(r, "ttft")),
    ("TPOT p50 ms", lambda r: _ms(r["tpot_p50_s"])),
    ("TPOT tail ms", lambda r: tail_cell(r, "tpot")),
    ("bounds ms", lambda r: f"TTFT {_ms(r['slo_ttft_s'])}, TPOT {_ms(r['slo_tpot_s'])}"),
    ("verdict", _verdict),
]
TITLE = (
    "Serving decoders — continuous batching; a query is a request of its own prompt and output lengths; "
    "a tail is a p99 only where n ≥ 368, else the max of n; " + SERVED_NOTE
)


# `deepgap export`'s columns of a served decoder's level, named with their units
EXPORT = {
    "run_id": "run_id",
    "model": "model",
    "engine": "engine",
    "precision": "precision",
    "device": "device",
    "purpose": "serve_purpose",
    "slots": "slots",
    "input_len_dist": "input_len_dist",
    "output_len_dist": "output_len_dist",
    "cache_len": "cache_len",
    "target_qps": "offered_queries_per_s",
    "achieved_qps": "served_queries_per_s",
    "output_tokens_per_s": "output_tokens_per_s",
    "input_tokens_per_s": "input_tokens_per_s",
    "output_tokens": "output_tokens",
    "window_s": "tokens_window_s",
    "n_unfinished": "unfinished_at_stop",
    "n_queued": "queued_at_stop",
    "ttft_p50_s": "ttft_median_s",
    "ttft_tail_s": "ttft_tail_s",
    "ttft_tail_kind": "ttft_tail_kind",
    "ttft_n": "ttft_n",
    "tpot_p50_s": "tpot_median_s",
    "tpot_tail_s": "tpot_tail_s",
    "tpot_tail_kind": "tpot_tail_kind",
    "tpot_n": "tpot_n",
    "slo_ttft_s": "slo_ttft_s",
    "slo_tpot_s": "slo_tpot_s",
    "verdict": "serve_verdict",
    "ttft_verdict": "ttft_verdict",
    "tpot_verdict": "tpot_verdict",
    "mean_active": "mean_running_sequences",
    "predicted_output_tokens_per_s": "predicted_output_tokens_per_s",
    "predicted_ttft_tail_s": "predicted_ttft_tail_s",
    "predicted_tpot_tail_s": "predicted_tpot_tail_s",
    "decode_step": "serve_decode_step",  # the set-up's words, as `engine_cell` reads them
    "admissions": "serve_prefill",
    "calibrated_at": "decode_calibrated_position",  # the slots' position while the step was timed
}


def llm_export(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """The served decoder levels as `deepgap export` writes them: `EXPORT`'s columns (empty if none).

    And ``kv_cache`` after the precision where a level's cache held fp8 codes (``--kv-cache fp8``).
    """
    df = llm_levels(store, run_ids)
    if df.empty:
        return df
    out = df[list(EXPORT)].rename(columns=EXPORT)
    if "kv_cache" in df:  # a served fp8 cache ("fp8", else ""): beside the precision, where one was
        out.insert(int(out.columns.get_loc("precision")) + 1, "kv_cache", df["kv_cache"].to_numpy())
    return out
