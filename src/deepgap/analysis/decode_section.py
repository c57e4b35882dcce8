"""The report's decode section: each decode configuration's TTFT, TPOT, tokens/s, J/token and roofline share.

Registered in `deepgap.render.sections` like the card-to-card section. It reads the decode rows itself
(`deepgap.store.Store.decode_frame`: the report's ``results`` are forward rows only) and shows
`deepgap.analysis.decode.decode_table`'s columns, units in every header. A store without decode rows
gives nothing. The answer and the decode roofline figure are not built yet (docs/llm.md).
"""

from __future__ import annotations

from typing import Any

from deepgap.analysis.decode import decode_table
from deepgap.render.formatting import num_cell
from deepgap.render.sections import Parts, ReportContext, Section, register
from deepgap.store import reading


def _ms_ci(r: dict[str, Any]) -> str:
    lo, hi, med = r.get("tpot_median_ci_low_ms"), r.get("tpot_median_ci_high_ms"), r.get("tpot_median_ms")
    if med is None or med != med:
        return "–"
    ci = f" [{lo:.3f}, {hi:.3f}]" if lo == lo and hi == hi and lo is not None and hi is not None else ""
    return f"{med:.3f}{ci}"


def _tail(r: dict[str, Any]) -> str:
    v = r.get("tpot_tail_ms")
    return "–" if v is None or v != v else f"{v:.3f} ({r.get('tpot_tail_label')})"


def _share(r: dict[str, Any]) -> str:
    v = r.get("fraction_of_bound")
    return "–" if v is None or v != v else f"{100 * v:.0f}%"


def _agree(r: dict[str, Any]) -> str:
    a = r.get("token_agreement_vs_fp32")
    if a is None or a != a:
        return "–"
    wrong = " WRONG" if r.get("logits_flagged") is True else ""
    return f"{100 * a:.0f}% of {r.get('tokens_checked')}; relL2 {r.get('logits_rel_l2_vs_fp32'):.2e}{wrong}"


TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "decode": (
        "Decode (LLM): time to first token, time per output token and tokens/s per configuration "
        "(a token is one per sequence per decode step; decode tokens/s = batch / median TPOT)",
        [
            ("device", "device_name"),
            ("model", "model"),
            ("engine", "engine"),
            ("precision", "precision"),
            ("batch", "batch_size"),
            ("input / output tokens", lambda r: f"{r.get('input_len')} / {r.get('output_len')}"),
            ("sweep", "sweep"),
            ("status", "status"),
            ("TTFT ms (median)", num_cell("ttft_median_ms", ".3f")),
            ("TPOT ms/token (median [95% CI])", _ms_ci),
            ("TPOT tail ms", _tail),
            ("decode tokens/s", num_cell("decode_tokens_per_s", ",.1f")),
            ("output tokens/s", num_cell("output_tokens_per_s", ",.1f")),
            ("J/token", num_cell("joules_per_token", ".4f")),
            ("KV cache MiB", num_cell("kv_cache_bytes", ",.1f", 2**-20)),
            ("memory-bound tokens/s", num_cell("bound_tokens_per_s", ",.0f")),
            ("share of the bound", _share),
            ("vs fp32: greedy tokens equal; logits", _agree),
        ],
    ),
}


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build (nothing without a decode row)."""
    with reading(ctx.source) as st:
        tab = decode_table(st.decode_frame(ctx.run_ids))
    if tab.empty:
        return Parts()
    return Parts({"decode": tab})


SECTION = register(Section("decode", 26, build, TABLE_SPECS))
