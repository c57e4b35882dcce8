"""``deepgap compare A B`` / ``compare A --paper``: speedups with CIs and the configuration behind each.

A side is a store file (all its runs) or a run id in ``--store``. Every ratio is printed beside
both sides' configurations, per matched configuration and at each side's best batch; ``--paper``
puts your peaks beside the seed study's T4, L4 and Xeon rows (shipped with deepgap).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from deepgap.api import DEFAULT_STORE
from deepgap.errors import UsageError

NAME = "compare"
HELP = "speedup of A over B (stores or run ids) with bootstrap CIs; --paper: beside the paper's Table I"
ORDER = 5


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("sides", nargs="*", metavar="A B", help="two stores or run ids (one with --paper)")
    p.add_argument(
        "--store", default=DEFAULT_STORE, help=f"store that run ids refer to (default {DEFAULT_STORE})"
    )
    p.add_argument("--paper", action="store_true", help="compare A with the DEEP-GAP paper's Table I")
    p.add_argument("--model", help="only these models (comma-separated)")
    p.add_argument("--precision", help="only these precisions (comma-separated)")
    p.add_argument("--best-only", action="store_true", help="only the best-batch comparison")
    p.add_argument("-o", "--output", metavar="CSV", help="also write the comparison as CSV")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


@dataclass
class Side:
    """One side of a comparison: a store and (optionally) some of its runs."""

    store_path: str
    run_ids: list[str] | None
    label: str


def resolve_side(arg: str, default_store: str) -> Side:
    """A store path → all its runs; otherwise a run id in ``default_store``."""
    from deepgap.store import Store

    if os.path.exists(arg):
        Store(arg, readonly=True).close()  # a StoreError when it is not a deepgap store
        return Side(arg, None, arg)
    if not os.path.exists(default_store):
        raise UsageError(
            f"{arg!r} is neither a store file nor a run id (store {default_store} does not exist)",
            "pass store paths, or run ids with --store PATH",
        )
    s = Store(default_store, readonly=True)
    try:
        if arg not in {r["run_id"] for r in s.runs()}:
            raise UsageError(
                f"{arg!r} is neither a store file nor a run id in {default_store}",
                "list runs with `deepgap show --runs`",
            )
    finally:
        s.close()
    return Side(default_store, [arg], f"run {arg}")


def _filter(agg, args: argparse.Namespace):
    for col, text in (("model", args.model), ("precision", args.precision)):
        if text and not agg.empty:
            agg = agg[agg[col].isin([t.strip() for t in text.split(",") if t.strip()])]
    return agg


def _records(df) -> list[dict[str, Any]]:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v.item() if hasattr(v, "item") and not isinstance(v, (list, dict, str)) else v

    return [{k: clean(v) for k, v in r.items()} for r in df.to_dict("records")]


def _load(side: Side, args: argparse.Namespace):
    from deepgap.analysis import aggregate, prepare
    from deepgap.report import pooled_samples_fn
    from deepgap.store import Store

    store = Store(side.store_path, readonly=True)
    agg = _filter(aggregate(prepare(store.results_frame(side.run_ids))), args)
    platforms = ", ".join(sorted(agg["platform"].unique())) if len(agg) else "no results"
    side.label = f"{side.label} ({platforms})"
    return store, agg, pooled_samples_fn(store)


def _write_csv(frames: dict[str, Any], path: str) -> None:
    import pandas as pd

    from deepgap.commands.export import write_frame
    from deepgap.report_format import csv_frame

    parts = [csv_frame(f).assign(level=level) for level, f in frames.items() if len(f)]
    write_frame(pd.concat(parts) if parts else pd.DataFrame(), path, "csv")


def _flags(r: dict[str, Any]) -> str:
    return " ".join([*(r.get("flags") or []), *(r.get("warnings") or [])])


def _print_pairs(label_a: str, label_b: str, matched, best) -> None:
    from rich.console import Console
    from rich.table import Table

    from deepgap.report_format import fmt_ci, fmt_ips, fmt_x

    console = Console(width=None if Console().is_terminal else 220)
    console.print(
        f"A = {label_a}\nB = {label_b}\nspeedup = throughput A / throughput B (batch / median latency), "
        "95% bootstrap CI of the ratio over pooled per-iteration latencies"
    )
    if len(best):
        t = Table(
            "model",
            "engine",
            "prec",
            "A configuration",
            "A img/s",
            "B configuration",
            "B img/s",
            "A/B",
            "95% CI",
            "flags",
            title="each side at its best batch",
        )
        for r in best.to_dict("records"):
            t.add_row(
                r["model"],
                r["engine"],
                r["precision"],
                _conf(r, "_a"),
                fmt_ips(r["throughput_ips_a"]),
                _conf(r, "_b"),
                fmt_ips(r["throughput_ips_b"]),
                fmt_x(r["speedup"]),
                fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"], fmt_x),
                _flags(r),
            )
        console.print(t)
        top = (
            best[~best["flagged"]].sort_values("speedup").tail(1)
            if (~best["flagged"]).any()
            else best.iloc[0:0]
        )
        for r in top.to_dict("records"):
            console.print(
                f"largest unflagged best-batch speedup: {fmt_x(r['speedup'])} "
                f"{fmt_ci(r['speedup_ci_low'], r['speedup_ci_high'], fmt_x)} — A: {r['configuration_a']}; "
                f"B: {r['configuration_b']}"
            )
    if len(matched):
        t = Table(
            "model",
            "engine",
            "prec",
            "bs",
            "fmt",
            "thr",
            "A img/s",
            "B img/s",
            "A/B",
            "95% CI",
            "flags",
            title="matched configurations (same batch, threads, format)",
        )
        for r in matched.to_dict("records"):
            t.add_row(
                r["model"],
                r["engine"],
                r["precision"],
                str(r["batch_size"]),
                r["memory_format"],
                str(r["threads"] or "default"),
                fmt_ips(r["throughput_ips_a"]),
                fmt_ips(r["throughput_ips_b"]),
                fmt_x(r["speedup"]),
                fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"], fmt_x),
                _flags(r),
            )
        console.print(t)
    if not len(best) and not len(matched):
        console.print("no model, engine and precision in common between A and B: nothing to compare")


def _conf(r: dict, side: str) -> str:
    """A side's configuration; a quantized one (int8, fp8) with its accuracy against fp32 beneath."""
    text = str(r[f"configuration{side}"])
    if r.get("precision") in ("int8", "fp8") and r.get(f"accuracy{side}"):
        text += f"\n{r[f'accuracy{side}']}"
    return text


def _print_paper(label: str, table, paper) -> None:
    from rich.console import Console
    from rich.table import Table

    from deepgap.analysis.reference import PAPER_SOURCE
    from deepgap.report_format import fmt_ci, fmt_ips, fmt_x

    console = Console(width=None if Console().is_terminal else 220)
    console.print(f"A = {label}\npaper = {PAPER_SOURCE} (published peaks; no samples, so the CI is A's only)")
    if not len(table):
        console.print(
            f"no model and precision in common with the paper ({', '.join(sorted(paper['model'].unique()))}"
            f"; {', '.join(sorted(paper['precision'].unique()))}): its rows are"
        )
        t = Table(*paper.columns)
        for r in paper.astype(str).to_dict("records"):
            t.add_row(*r.values())
        console.print(t)
        return
    t = Table(
        "model",
        "prec",
        "your configuration",
        "your img/s",
        "paper platform",
        "paper engine",
        "paper bs",
        "paper img/s",
        "yours/paper",
        "95% CI",
        "flags",
    )
    for r in table.to_dict("records"):
        t.add_row(
            r["model"],
            r["precision"],
            _conf(r, ""),
            fmt_ips(r["throughput_ips"]),
            r["paper_platform"],
            r["paper_engine"],
            str(r["paper_batch"]),
            fmt_ips(r["paper_images_per_s"]),
            fmt_x(r["ratio_vs_paper"]),
            fmt_ci(r["ratio_ci_low"], r["ratio_ci_high"], fmt_x),
            _flags(r),
        )
    console.print(t)


def main(args: argparse.Namespace) -> int:  # noqa: D103
    want = (0, 1) if args.paper else (2,)
    if len(args.sides) not in want:
        raise UsageError(
            f"compare takes {'one store or run id with --paper' if args.paper else 'two sides (A B)'}, "
            f"got {len(args.sides)}",
            "e.g. deepgap compare a.sqlite b.sqlite, or deepgap compare a.sqlite --paper",
        )
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError(
                f"cannot write {args.output}: {folder} is missing or not writable", "pass a writable -o"
            )
    sides = [resolve_side(a, args.store) for a in (args.sides or [args.store])]
    if args.paper:
        from deepgap.analysis.compare import compare_paper
        from deepgap.analysis.reference import paper_peaks

        store, agg, _ = _load(sides[0], args)
        store.close()
        table = compare_paper(agg, paper_peaks())
        if args.output:
            _write_csv({"paper": table}, args.output)
        if args.json:
            print(json.dumps({"a": sides[0].label, "paper": _records(table)}, indent=1, default=str))
        else:
            _print_paper(sides[0].label, table, paper_peaks())
        return 0 if len(table) else 1
    from deepgap.analysis.compare import compare

    (sa, agg_a, fa), (sb, agg_b, fb) = _load(sides[0], args), _load(sides[1], args)
    try:
        matched, best = compare(agg_a, agg_b, fa, fb)
    finally:
        sa.close()
        sb.close()
    if args.best_only:
        matched = matched.iloc[0:0]
    if args.output:
        _write_csv({"best_batch": best, "matched": matched}, args.output)
    if args.json:
        print(
            json.dumps(
                {
                    "a": sides[0].label,
                    "b": sides[1].label,
                    "best_batch": _records(best),
                    "matched": _records(matched),
                },
                indent=1,
                default=str,
            )
        )
    else:
        _print_pairs(sides[0].label, sides[1].label, matched, best)
    return 0 if len(best) or len(matched) else 1
