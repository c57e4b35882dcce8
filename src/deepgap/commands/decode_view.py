"""Decode results in ``show`` (a table of its own) and ``export`` (columns of their own): shared by both.

Why apart from the forward table: a decode row's numbers are TTFT (ms), TPOT (ms per token), tokens/s
and J/token (`deepgap.analysis.decode`), which no forward column may hold under its images/s heading.
After the table, ``show`` prints how far each configuration is from its memory bound
(`deepgap.analysis.decode_roofline`), the answer for decoders and the GPU against its host CPU
(`answer_lines`, which ``recommend`` prints too).
"""

from __future__ import annotations

import math
from typing import Any

from deepgap.core.records import kv_cache_label, kv_cache_suffix


def _f(v: Any, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _n(v: Any) -> str:
    return "" if v is None or v != v else str(int(v))


def _mib(v: Any) -> str:
    return "" if v is None or v != v else f"{v / 2**20:,.1f}"


def print_decode(store, console, ids: list[str] | None) -> int:
    """Print the decode rows of runs ``ids`` (all runs: None); how many there were."""
    from rich.table import Table

    from deepgap.analysis.decode import decode_table
    from deepgap.roofline.storage import peaks_frame

    frame = store.decode_frame(ids)
    if frame.empty:
        return 0
    tab = decode_table(frame, peaks_frame(store))  # a `deepgap peaks` run's bandwidth where stored
    t = Table(
        "model",
        "engine",
        "prec",
        "bs",
        "in/out",
        "status",
        "TTFT ms (median, n)",
        "TPOT ms/token (median, 95% CI)",
        "TPOT tail ms",
        "decode tokens/s",
        "output tokens/s",
        "J/token",
        "KV · weights MiB",
        "bound tokens/s (share)",
        "vs fp32: tokens agree · logits relL2",
        title=f"decode: {len(tab)} configuration{'' if len(tab) == 1 else 's'} (a token is one per sequence per step)",
    )
    for r in tab.to_dict("records"):
        ok = r["status"] == "ok"
        t.add_row(
            str(r["model"]),
            _engine(r),
            str(r["precision"]),
            str(r["batch_size"]),
            f"{r['input_len']}/{r['output_len']}",
            str(r["status"]),
            f"{_f(r['ttft_median_ms'], '.3f')} (n={_n(r['ttft_n'])})" if ok else str(r["reason"])[:60],
            f"{_f(r['tpot_median_ms'], '.3f')} ({_f(r['tpot_median_ci_low_ms'], '.3f')}–"
            f"{_f(r['tpot_median_ci_high_ms'], '.3f')})"
            if ok
            else "",
            f"{_f(r['tpot_tail_ms'], '.3f')} ({r['tpot_tail_label']})" if ok else "",
            _f(r["decode_tokens_per_s"], ",.1f"),
            _f(r["output_tokens_per_s"], ",.1f"),
            _f(r["joules_per_token"], ".4f") or ("no energy" if ok else ""),
            f"{_mib(r['kv_cache_bytes'])} · {_mib(r['weight_bytes'])}" if ok else "",
            f"{_f(r['bound_tokens_per_s'], ',.0f')} ({_f(r['fraction_of_bound'], '.0%')})"
            if ok and r["bound_source"]
            else "",
            f"{_f(r['token_agreement_vs_fp32'], '.0%')} of {_n(r['tokens_checked'])} · "
            f"{_f(r['logits_rel_l2_vs_fp32'], '.2e')}{' WRONG' if r['logits_flagged'] else ''}"
            if ok
            else "",
        )
    console.print(t)
    sources = sorted({s for s in tab["bound_source"] if isinstance(s, str) and s})
    console.print(
        "decode tokens/s = batch / median TPOT; output tokens/s counts the prefill's time too; J/token is the "
        "pipelined decode windows' energy per decode token; bound = memory-bound decode tokens/s (bytes per "
        f"token over {', '.join(sources) if sources else 'a datasheet bandwidth (none for these devices)'})"
    )
    for line in roofline_lines(tab) + answer_lines(tab):
        console.print(line, markup=False, highlight=False)
    _print_across_sweeps(store, frame, console)
    return len(tab)


def roofline_lines(tab) -> list[str]:
    """How far each successful decode configuration is from its memory bound, both sides named."""
    from deepgap.analysis.decode_roofline import distance_text

    ok = tab[tab["status"] == "ok"]
    if ok.empty:
        return []
    out = ["decode roofline (decode tokens/s ÷ memory-bound tokens/s = bandwidth ÷ bytes per token):"]
    for r in ok.to_dict("records"):
        where = f"{r['device_name']} {r['model']} {r['engine']} {r['precision']} {r['input_len']}/{r['output_len']}"
        out.append(f"  {where}{kv_cache_suffix(r.get('kv_cache'))}: {distance_text(r)}")
    return out


def answer_lines(tab) -> list[str]:
    """The answer for decoders (fastest, lowest TPOT, most tokens/J per device and model), then GPU × CPU."""
    from deepgap.analysis import decode_answer as da

    answers = da.decode_answers(tab)
    if not answers:
        return []
    out = ["answer for decoders (per device, model and input/output tokens; flagged rows never chosen):"]
    for a in answers:
        out.append(f"  {a.platform} · {a.model} · {a.input_len}/{a.output_len} tokens:")
        for goal, r in a.choice.items():
            name = da.GOALS[goal][2]
            if r is None:
                out.append(f"    {name}: none ({a.missing.get(goal)})")
                continue
            out.append(f"    {name}: {da.short(r)}: {da.value_text(r, goal)} ({da.also_text(r)})")
        if a.excluded:
            out.append("    excluded: " + ", ".join(f"{n} {why}" for why, n in a.excluded.items()))
    lines = da.cpu_lines(tab)
    if lines:
        out.append("decode, GPU vs host CPU (each side's configuration named):")
        for ln in lines:
            out += [f"  {ln.platform} vs {ln.cpu_platform} · {ln.model}: {t}" for t in ln.texts]
    return out


def _print_across_sweeps(store, frame, console) -> None:
    """Decode configurations measured in several worker processes: their interval across processes."""
    from rich.table import Table

    from deepgap.analysis.decode import across_sweeps
    from deepgap.render.formatting import fmt_ci, spread_text

    agg = across_sweeps(frame, samples=store.samples)
    if agg.empty:
        return
    t = Table(
        "configuration",
        "decode tokens/s",
        "95% CI (processes, then samples)",
        "between sweeps",
        "TPOT ms/token (median)",
        "TPOT tail ms",
        title="decode measured in several sweeps (worker processes)",
    )
    for r in agg.to_dict("records"):
        t.add_row(
            f"{r['model']} {r['engine']} {r['precision']} bs{r['batch_size']} "
            f"{r['input_len']}/{r['output_len']}{kv_cache_suffix(r.get('kv_cache'))} ×{r['n_measurements']}",
            _f(r["throughput_ips"], ",.1f"),
            fmt_ci(r["throughput_ci_low_ips"], r["throughput_ci_high_ips"]),
            spread_text(r),
            _f(_ms(r["latency_median_s"]), ".3f"),
            f"{_f(_ms(r['latency_tail_s']), '.3f')} ({r['latency_tail_name']})",
        )
    console.print(t)


def _ms(v: Any) -> float:
    return v * 1e3 if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def export_decode(store, run_ids: list[str] | None, forward):
    """``forward`` (export's frame) with the decode rows after it, each kind in its own named columns.

    Unchanged when the runs hold no decode rows nor served levels; else every row says its ``workload``
    ("forward", "decode", "serve-decoder": `deepgap.serving.show.llm_tables.EXPORT`'s columns; "serve" and
    "serve-capacity": an image or text server's levels and capacities, `deepgap.serving.show.export`).
    """
    import pandas as pd

    from deepgap.analysis.decode import decode_table
    from deepgap.roofline.storage import peaks_frame
    from deepgap.serving.show.export import serve_export
    from deepgap.serving.show.llm_tables import llm_export

    frame = store.decode_frame(run_ids)  # peaks are read only where there are decode rows
    tab = decode_table(frame, peaks_frame(store)) if not frame.empty else pd.DataFrame()
    if "kv_cache" in tab and not tab["kv_cache"].astype(bool).any():
        # no fp8 cache: the columns every decode export had before the axis
        tab = tab.drop(columns="kv_cache")
    served = llm_export(store, run_ids)  # served decoders' levels: queries/s, tokens/s, TTFT, TPOT
    levels = serve_export(store, run_ids)  # image and text servers' levels, and every capacity
    if tab.empty and served.empty and levels.empty:
        return forward
    parts = [forward.assign(workload="forward")] if not forward.empty else []
    if not tab.empty:
        tab.insert(0, "workload", "decode")
        parts.append(tab)
    if not served.empty:
        served.insert(0, "workload", "serve-decoder")
        parts.append(served)
    if not levels.empty:
        parts.append(levels)
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def _engine(r: dict) -> str:
    """The engine, with the decode step it ran, the ways its step was launched (PDL, split KV), its prefill.

    An fp8 KV cache (``kv_cache``, `deepgap.core.records.KV_CACHE_LABELS`) is named right after the step,
    so rows with and without it never look alike. PDL: its graph used programmatic dependent launch; split
    KV: its attention was split over the cache (`deepgap.measure.llm_attention`), or walked all of it in one pass
    (``wide``); compiled prefill: the prompt ran compiled (`deepgap.measure.llm_steps.make_prefill`), which its
    TTFT and output tokens/s count. Rows stored before session 42 may say their attention ran in the qkv GEMV's
    last programs, or every layer in one kernel (levers since removed); they keep those labels.
    """
    how = [f"{r['decode_step']} step"] if r["decode_step"] and r["decode_step"] != r["engine"] else []
    kv = kv_cache_label(r.get("kv_cache"))
    if kv:  # an fp8 cache: never read as a row in the decoder's own dtype
        how.append(kv)
    pdl = str(r.get("decode_pdl") or "")
    if pdl.startswith("on"):  # the late trigger said where it ran (`llm_steps._kept`, `quant.gdc`)
        how.append("PDL, trigger after the wait" if "trigger after its wait" in pdl else "PDL")
        if "constants before" in pdl:  # DEEPGAP_PDL_CONSTANTS=ahead (`quant.launch.constants_ahead`)
            how[-1] += ", constants before it"
    if str(r.get("decode_prefill") or "").startswith("compiled"):  # TTFT and output tokens/s depend on it
        how.append("compiled prefill")
    attention = str(r.get("decode_attention") or "")
    if attention.startswith("split"):
        how.append("split KV")
    elif "bound by the cache" in attention:  # DEEPGAP_DECODE_SPLIT_KV=wide (session 55)
        how.append("attention walks the whole cache")
    elif "qkv GEMV" in attention:  # "in the qkv GEMV's last programs[, split C×P]" (before session 42)
        how.append("attention in the qkv GEMV" + (", split" if "split" in attention else ""))
    if "one-kernel step" in attention:  # "split in the one-kernel step" (before session 42)
        how.append("every layer in one kernel")
    return f"{r['engine']} ({', '.join(how)})" if how else str(r["engine"])
