"""Console tables of ``deepgap compare``: the pairs with their CIs and roofline predictions, the paper.

Kept apart from `deepgap.commands.compare` (arguments, loading, JSON/CSV) so each stays short; these
functions only format frames that `deepgap.analysis.compare` and `deepgap.roofline.predict` computed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from deepgap.core.precision import is_quantized
from deepgap.core.records import kv_cache_label
from deepgap.render.units import IMAGE, Units


def _flags(r: dict[str, Any]) -> str:
    return " ".join([*(r.get("flags") or []), *(r.get("warnings") or [])])


def _roof(r: dict[str, Any]) -> str:
    """``1.43× memory departs``: the roofline's predicted ratio, the bound (A/B if they differ), the mark."""
    from deepgap.render.formatting import fmt_x

    pred = r.get("predicted_ratio")
    if pred is None or not isinstance(pred, float) or not math.isfinite(pred):
        return "–"
    mark = {True: " departs", False: ""}.get(r.get("departs"), " (no CI)")
    per_op = r.get("predicted_ratio_per_op")
    finer = f" (per op {fmt_x(per_op)})" if isinstance(per_op, float) and math.isfinite(per_op) else ""
    return f"{fmt_x(pred)} {r.get('bound', '')}{mark}{finer}"


def _print_sources(console, frames) -> None:
    """Which ceilings each precision's predictions used (measured or datasheet), or why there are none."""
    seen: dict[str, set[str]] = {}
    for f in frames:
        if len(f) and "roofline_source" in f:
            for prec, src in zip(f["precision"], f["roofline_source"], strict=True):
                seen.setdefault(str(prec), set()).add(str(src))
    if seen:
        console.print(
            "roofline = ratio predicted from each platform's ceilings at the configuration's eager-traffic "
            "intensity (memory-bound: bandwidth ratio; compute-bound: compute ratio); departs = its range "
            "(measured ceilings' spread over their repeats) lies outside the measured 95% CI; per op = the "
            "roofline applied op by op, times summed. Ceilings: "
            + "; ".join(f"{p}: {', '.join(sorted(s))}" for p, s in sorted(seen.items()))
        )


def _pair_table(title: str, frame, middle: list[tuple[str, Callable[[dict], str]]]):
    """One table of pairs: the configuration's names, ``middle``'s columns, then the ratio, CI and roofline."""
    from rich.table import Table

    from deepgap.render.formatting import fmt_ci, fmt_x, input_cell

    columns = [
        ("model", lambda r: r["model"]),
        ("engine", lambda r: input_cell(r["engine"], r)),  # "quant · int8-resident": never read as default
        ("prec", lambda r: r["precision"]),
        *middle,
        ("A/B", lambda r: fmt_x(r["speedup"])),
        ("95% CI", lambda r: fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"], fmt_x)),
        ("roofline", _roof),
        ("flags", _flags),
    ]
    t = Table(*(header for header, _ in columns), title=title)
    for r in frame.to_dict("records"):
        t.add_row(*(cell(r) for _, cell in columns))
    return t


def print_pairs(label_a: str, label_b: str, matched, best, units: Units = IMAGE) -> None:
    """Best-batch and matched tables: both configurations, the ratio, its CI, the roofline's prediction.

    ``units``: the compared rows' (`deepgap.render.units.of_frame` of both sides): a text model's
    throughput is seq/s, its size a sequence length and it has no memory format.
    """
    from rich.console import Console

    from deepgap.render.formatting import fmt_ci, fmt_ips, fmt_x

    console = Console(width=None if Console().is_terminal else 220)
    console.print(
        f"A = {label_a}\nB = {label_b}\nspeedup = throughput A / throughput B (batch / median latency), "
        "95% bootstrap CI of the ratio over pooled per-iteration latencies"
    )
    if len(best):
        console.print(best_table(best, units))
        top = (
            best[~best["flagged"]].sort_values("speedup").tail(1)
            if (~best["flagged"]).any()
            else best.iloc[0:0]
        )
        for r in top.to_dict("records"):
            console.print(
                f"largest unflagged best-batch speedup "
                f"({'like with like' if str(r.get('pairing', '')).startswith('like') else 'best vs best'}): "
                f"{fmt_x(r['speedup'])} "
                f"{fmt_ci(r['speedup_ci_low'], r['speedup_ci_high'], fmt_x)} — A: {r['configuration_a']}; "
                f"B: {r['configuration_b']}"
            )
    if len(matched):
        console.print(
            _pair_table(
                "matched configurations (same batch, threads, "
                + ("format)" if units.kind == "image" else f"{units.size}, format)"),
                matched,
                [
                    ("bs", lambda r: str(r["batch_size"])),
                    *_size_columns(units),
                    ("thr", lambda r: str(r["threads"] or "default")),
                    (f"A {units.short}", lambda r: fmt_ips(r["throughput_ips_a"])),
                    (f"B {units.short}", lambda r: fmt_ips(r["throughput_ips_b"])),
                ],
            )
        )
    _print_sources(console, [best, matched])
    if not len(best) and not len(matched):
        console.print("no model, engine and precision in common between A and B: nothing to compare")


def best_table(best, units: Units = IMAGE):
    """The best-batch pairs: each side's configuration (its name only), its accuracy apart, its rate."""
    from deepgap.render.formatting import fmt_ips

    return _pair_table(
        "each side at its best batch (best vs best where the batches differ: both shown)",
        best,
        [
            ("A configuration", lambda r: str(r["configuration_a"])),
            *_accuracy_column(best, "A accuracy (8-bit rows)", "_a"),
            (f"A {units.short}", lambda r: fmt_ips(r["throughput_ips_a"])),
            ("B configuration", lambda r: str(r["configuration_b"])),
            *_accuracy_column(best, "B accuracy (8-bit rows)", "_b"),
            (f"B {units.short}", lambda r: fmt_ips(r["throughput_ips_b"])),
        ],
    )


def _size_columns(units: Units) -> list[tuple[str, Callable[[dict], str]]]:
    """The matched table's format column; a view with text rows: their sequence length, and no "nchw".

    Why: two lengths of one text model at one batch are two rows; without the length they read as one
    configuration printed twice.
    """
    if units.kind == "image":
        return [("fmt", lambda r: r["memory_format"])]
    cols = [(units.size, lambda r: str(r["resolution"]))]
    return cols + ([("fmt", lambda r: r["memory_format"])] if units.kind == "mixed" else [])


def print_paper(label: str, table, paper) -> None:
    """The precision mapping, then your peaks beside the paper's rows (the paper's rows if none match)."""
    from rich.console import Console
    from rich.table import Table

    from deepgap.analysis.reference import PAPER_SOURCE

    console = Console(width=None if Console().is_terminal else 220)
    console.print(f"A = {label}\npaper = {PAPER_SOURCE} (published peaks; no samples, so the CI is A's only)")
    if not len(table):
        console.print(
            f"no model and precision in common with the paper ({', '.join(sorted(paper['model'].unique()))}"
            f"; {', '.join(sorted(paper['precision'].unique()))}): its rows are"
        )
        t = Table(*paper.columns)
        for r in paper.to_dict("records"):  # a missing cell is a dash (astype(str) can keep NaN a float)
            t.add_row(*("–" if v is None or v != v else str(v) for v in r.values()))
        console.print(t)
        return
    from deepgap.analysis.compare import precision_mappings

    m = Table(
        "platform",
        "model",
        "paper column",
        "your precision",
        "why",
        title="precision set against each paper column",
    )
    for r in precision_mappings(table).to_dict("records"):
        m.add_row(
            r["platform"],
            r["model"],
            f"{r['paper_platform']} {r['paper_precision']}",
            r["precision"],
            r["precision_mapping"],
        )
    console.print(m)
    console.print(paper_table(table))


def paper_table(table):
    """Your peaks beside the paper's rows: your configuration (its name only), its accuracy apart, the ratio."""
    from rich.table import Table

    from deepgap.render.formatting import fmt_ci, fmt_ips, fmt_x

    accuracy = _accuracy_column(table, "your accuracy (8-bit rows)", "")
    t = Table(
        "model",
        "prec",
        "paper prec",
        "your configuration",
        *(head for head, _ in accuracy),
        "your img/s",
        "paper platform",
        "paper engine",
        "paper bs",
        "paper img/s",
        "pairing",  # GPU vs GPU, CPU vs CPU, or unlike kinds said so (analysis.compare.paper_pairing)
        "yours/paper",
        "95% CI",
        "flags",
    )
    for r in table.to_dict("records"):
        t.add_row(
            r["model"],
            r["precision"],
            r["paper_precision"],
            str(r["configuration"]),
            *(cell(r) for _, cell in accuracy),
            fmt_ips(r["throughput_ips"]),
            r["paper_platform"],
            r["paper_engine"],
            str(r["paper_batch"]),
            fmt_ips(r["paper_images_per_s"]),
            str(r.get("pairing", "")),
            fmt_x(r["ratio_vs_paper"]),
            fmt_ci(r["ratio_ci_low"], r["ratio_ci_high"], fmt_x),
            _flags(r),
        )
    return t


def resident_lines(sides: list[tuple[str, Any]]) -> list[str]:
    """Per side, its best resident-input row of each platform and model beside MLPerf's number (if any).

    Why here: a resident-input ratio between two stores is like with like, but a reader will set the
    number against MLPerf's; the anchor is printed with its conditions, and only for the GPU it is of.
    """
    from deepgap.analysis.frame import config_label
    from deepgap.analysis.mlperf import mode_anchor_lines, mode_note, resident_best
    from deepgap.core.records import input_kind
    from deepgap.render.formatting import fmt_ips
    from deepgap.render.units import of_seq_lens

    by_kind: dict[str, list[str]] = {}  # each input kind's note, then its rows: A's, then B's
    for name, agg in sides:
        if agg is None or not len(agg) or "input_mode" not in agg or not agg["input_mode"].astype(bool).any():
            continue
        for (platform, model), sub in agg.groupby(["platform", "model"], sort=True):
            for r in resident_best(sub):
                lines = by_kind.setdefault(
                    input_kind(r["input_mode"]), [f"rows of another input ({mode_note(r['input_mode'])}):"]
                )
                short = of_seq_lens([r.get("seq_len")]).short
                lines.append(f"{name}: {config_label(r)}: {fmt_ips(r['throughput_ips'])} {short}")
                lines += [f"  {line}" for line in mode_anchor_lines(str(platform), str(model), r)]
    return [line for lines in by_kind.values() for line in lines]


def _accuracy_column(frame, header: str, side: str) -> list[tuple[str, Callable[[dict], str]]]:
    """A side's accuracy against fp32 as a column of its own, where ``frame`` holds a quantized (int8, fp8) row.

    Why apart: the configuration column names the configuration only (model, engine, precision, batch …);
    the accuracy text once sat inside a quantized row's configuration cell, read as part of its name.
    """
    col = f"accuracy{side}"
    if not len(frame) or col not in frame or not any(is_quantized(p) for p in frame["precision"]):
        return []
    return [(header, lambda r: str(r.get(col) or "") if is_quantized(r.get("precision")) else "")]


def print_decode_pairs(matched, best) -> None:
    """Decoders: decode tokens/s A ÷ B per input/output pair, at each side's best batch and batch by batch."""
    from rich.console import Console

    from deepgap.render.formatting import fmt_ips

    console = Console(width=None if Console().is_terminal else 220)
    console.print(
        "decode: speedup = decode tokens/s A / B (batch / median TPOT), 95% bootstrap CI of the ratio over "
        "pooled per-step TPOTs; each input/output pair apart"
    )
    tok = [
        ("A decode tok/s", lambda r: fmt_ips(r["throughput_ips_a"])),
        ("B decode tok/s", lambda r: fmt_ips(r["throughput_ips_b"])),
    ]
    lengths = ("in/out", lambda r: f"{int(r['input_len'])}/{int(r['output_len'])}")
    if any(kv_cache_label(r.get("kv_cache")) for f in (matched, best) for r in f.to_dict("records")):
        lengths = ("in/out · KV cache", _lengths_kv)  # an fp8 cache's rows beside the own dtype's: each named
    if len(best):
        confs = [
            ("A configuration", lambda r: r["configuration_a"]),
            ("B configuration", lambda r: r["configuration_b"]),
        ]
        console.print(
            _pair_table(
                "decode, each side at its best batch", best, [lengths, confs[0], tok[0], confs[1], tok[1]]
            )
        )
    if len(matched):
        bs = ("bs", lambda r: str(r["batch_size"]))
        console.print(
            _pair_table(
                "decode, matched configurations (same batch and lengths)", matched, [bs, lengths, *tok]
            )
        )


def _lengths_kv(r: dict) -> str:
    """``128/128 · fp8 KV cache`` (a cache of its own format) or ``128/128 · own dtype`` (the decoder's)."""
    kv = kv_cache_label(r.get("kv_cache")) or "own dtype"
    return f"{int(r['input_len'])}/{int(r['output_len'])} · {kv}"
