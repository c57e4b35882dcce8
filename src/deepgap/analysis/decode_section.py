"""The report's decode section: each decode configuration's TTFT, TPOT, tokens/s, J/token and its roofline.

Registered in `deepgap.render.sections` like the card-to-card section. It reads the decode rows itself
(`deepgap.store.Store.decode_frame`: the report's ``results`` are forward rows only) and the store's measured
ceilings (`deepgap.roofline.storage.peaks_frame`), and shows `deepgap.analysis.decode.decode_table`'s
columns, units in every header: the decode table, the decode roofline (table and figure,
`deepgap.roofline.decode_figure`) and the GPU against its host CPU (`deepgap.analysis.decode_answer`). The
answer's decode rows are `answer_rows` (the report's answer table, `deepgap.report.page`). A store without
decode rows gives nothing.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.analysis import decode_answer as da
from deepgap.analysis.decode import decode_table
from deepgap.analysis.decode_roofline import distance_text
from deepgap.core.records import kv_cache_suffix
from deepgap.render.draw import pending_figure
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


def _agree(r: dict[str, Any], worded: bool = False) -> str:
    """Greedy tokens equal to fp32's and the logits' relL2; ``worded``: each named.

    Worded for a cell whose column is headed otherwise (the answer's speaks of top-1 or output agreement).
    """
    a = r.get("token_agreement_vs_fp32")
    if a is None or a != a:
        return "–"
    wrong = " WRONG" if r.get("logits_flagged") is True else ""
    tokens, logits = ("greedy tokens equal to fp32's: ", "logits ") if worded else ("", "")
    rel = r.get("logits_rel_l2_vs_fp32")
    return f"{tokens}{100 * a:.0f}% of {r.get('tokens_checked')}; {logits}relL2 {rel:.2e}{wrong}"


def _engine(r: dict[str, Any]) -> str:
    """The engine, with ``fp8 KV cache`` beside it where the row's cache has a format of its own.

    Why in the engine's cell: two rows differing only by their cache must never look alike, and a column of
    its own would be empty on every store measured without the axis.
    """
    return f"{r.get('engine')}{kv_cache_suffix(r.get('kv_cache'), ' · ')}"


TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "decode": (
        "Decode (LLM): time to first token, time per output token and tokens/s per configuration "
        "(a token is one per sequence per decode step; decode tokens/s = batch / median TPOT)",
        [
            ("device", "device_name"),
            ("model", "model"),
            ("engine", _engine),
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
    "decode_roofline": (
        "Decode roofline: bytes and FLOPs per decode token (weights at their precision + the KV cache at the "
        "run's mean context) against the device's bandwidth and compute peak (measured by deepgap peaks where "
        "stored, else the datasheet's); how far decode is from its memory bound",
        [
            ("device", "device_name"),
            ("model", "model"),
            ("engine", _engine),
            ("precision", "precision"),
            ("input / output tokens", lambda r: f"{r.get('input_len')} / {r.get('output_len')}"),
            ("weights MB per step", num_cell("weight_bytes_per_step", ",.1f", 1e-6)),
            ("KV MB per step", num_cell("kv_bytes_per_step", ",.2f", 1e-6)),
            ("GFLOP per token", num_cell("flops_per_token", ",.3f", 1e-9)),
            ("FLOP/byte", num_cell("intensity_flop_per_byte", ",.2f")),
            ("decode vs its bounds", distance_text),  # memory; compute too where that binds
            ("limiter", "bound_limiter"),
        ],
    ),
    "decode_vs_host_cpu": (
        "Decode: each GPU's best against its host CPU's (fp32 eager decode of the decoders up to 2B "
        "parameters; GPU and CPU configurations named on each side)",
        [("device", "platform"), ("model", "model"), ("host CPU", "cpu_platform"), ("GPU vs CPU", "text")],
    ),
}


def _roofline_figure(tab: pd.DataFrame, interactive: bool):
    """The decode roofline's PNG, and on an interactive page its plotly version (every point hoverable)."""
    from deepgap.roofline.decode_figure import decode_roofline_figure
    from deepgap.roofline.interactive import decode_roofline_spec

    fig = pending_figure(
        "fig_decode_roofline",
        "Decode roofline",
        "Each decode configuration at its FLOPs per byte and achieved TFLOP/s (decode tokens/s × FLOPs per "
        "token) under its device's ceilings (datasheet dashed, deepgap peaks solid); each point's batch and "
        "share of the memory bound (decode tokens/s ÷ bandwidth-bound tokens/s) are its label, or on hover.",
        lambda: decode_roofline_figure(tab),
    )
    if interactive:
        fig.attach_plotly(lambda: decode_roofline_spec(tab, distance_text))
    return fig


def cpu_table(tab: pd.DataFrame) -> pd.DataFrame:
    """`decode_answer.cpu_lines` as a table: one row per GPU, model and comparison."""
    rows = [
        {"platform": ln.platform, "model": ln.model, "cpu_platform": ln.cpu_platform, "text": t}
        for ln in da.cpu_lines(tab)
        for t in ln.texts
    ]
    return pd.DataFrame(rows)


ANSWER_GOALS = {"throughput": "decode throughput", "tpot": "decode TPOT", "joules": "decode per joule"}


def answer_rows(tab: pd.DataFrame) -> pd.DataFrame:
    """The report answer's decode rows (its columns: platform, model, goal, configuration, value …).

    A GPU's "decode × host CPU" row follows its model's first answer, under the same heading.
    """
    rows = []
    cpu = {(ln.platform, ln.model): ln for ln in da.cpu_lines(tab)}
    for a in da.decode_answers(tab):
        base = {"platform": a.platform, "model": a.model, "resolution": a.input_len}
        base["axis"] = f"decode {a.input_len}/{a.output_len}"
        for goal, r in a.choice.items():
            excl = ", ".join(f"{n} {why}" for why, n in a.excluded.items())
            extra = {"configuration": "", "value": "–", "also": a.missing.get(goal, "")}
            if r is not None:
                extra = {
                    "configuration": da.short(r),
                    "value": da.value_text(r, goal),
                    "also": da.also_text(r),
                }
            rows.append(
                {
                    **base,
                    **extra,
                    "goal": ANSWER_GOALS[goal],
                    "ci": "–",
                    "accuracy": _agree(r, worded=True) if r is not None else "",
                    "flags": f"excluded: {excl}" if excl else "",
                    "n": f"{a.considered} candidate(s)",
                    "answered": r is not None,
                }
            )
        ln = cpu.pop((a.platform, a.model), None)
        if ln is None:
            continue
        rows.append(
            {
                **base,
                "goal": "decode × host CPU",
                "configuration": "",
                "value": "",
                "ci": "–",
                "also": " · ".join(ln.texts),
                "accuracy": "",
                "flags": "",
                "n": f"vs {ln.cpu_platform}",
                "answered": True,
            }
        )
    return pd.DataFrame(rows)


def read_table(source, run_ids: list[str] | None) -> pd.DataFrame:
    """The decode table of a store (a path or an open `Store`), held against its measured ceilings."""
    from deepgap.roofline.storage import peaks_frame

    with reading(source) as st:
        frame = st.decode_frame(run_ids)
        return decode_table(frame, peaks_frame(st, None) if len(frame) else None)


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build (nothing without a decode row)."""
    tab = read_table(ctx.source, ctx.run_ids)
    if tab.empty:
        return Parts()
    tables = {"decode": tab, "decode_roofline": tab[tab["status"] == "ok"]}
    cpu = cpu_table(tab)
    if len(cpu):
        tables["decode_vs_host_cpu"] = cpu
    return Parts(tables, [_roofline_figure(tab, ctx.interactive)])


SECTION = register(Section("decode", 26, build, TABLE_SPECS))
