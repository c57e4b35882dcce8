"""``deepgap compare A B`` / ``compare A --paper``: speedups with CIs and the configuration behind each.

A side is a store file (all its runs) or a run id in ``--store``; ``--platforms A,B`` splits sides by
device name, so one merged store (``deepgap merge h100.sqlite h200.sqlite``) compares its two GPUs. Every
ratio is printed beside both sides' configurations, per matched configuration and at each side's best
batch, with the ratio the roofline predicts from each platform's ceilings (`roofline.predict`) and a
``departs`` mark where the measured CI excludes it (and its range); ``--paper`` puts your peaks beside
the paper's T4, L4 and Xeon rows (shipped with deepgap), saying which of your precisions meets each
paper column, and, where the store holds a CPU (the host-CPU part of a GPU run), your GPU/CPU ratio beside
the paper's T4/L4 over Xeon (`analysis.host_cpu.paper_cpu_ratios`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from deepgap.api import DEFAULT_STORE
from deepgap.commands.filter_flags import add_filter_flags, keep_named, named
from deepgap.core.errors import UsageError
from deepgap.report.compare_console import print_decode_pairs, print_pairs, print_paper, resident_lines

NAME = "compare"
HELP = "speedup of A over B (stores or run ids) with bootstrap CIs; --paper: beside the paper's Table I"
ORDER = 5
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("sides", "store"), ("output",)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("sides", nargs="*", metavar="A B", help="two stores or run ids (one with --paper)")
    p.add_argument(
        "--store", default=DEFAULT_STORE, help=f"store that run ids refer to (default {DEFAULT_STORE})"
    )
    p.add_argument("--paper", action="store_true", help="compare A with the DEEP-GAP paper's Table I")
    p.add_argument(
        "--platforms",
        metavar="A,B",
        help='two device names (or unique parts), e.g. "NVIDIA H200,NVIDIA H100 80GB HBM3": A and B are '
        "those platforms' rows of one store (or of the two sides)",
    )
    add_filter_flags(p, "model", "precision", several=True)
    p.add_argument("--best-only", action="store_true", help="only the best-batch comparison")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="also write the comparison: CSV, or .parquet/.json by the suffix",
    )
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


def _filter(agg, args: argparse.Namespace, label: str):
    """``agg`` of the models and precisions asked for; a `UsageError` if the side has none of them.

    (A filter that matched nothing printed "nothing to compare" and exited 1, as a comparison of two
    sides with nothing in common does: the fuzz past validation found it, issue 46.)
    """
    for col, text in (("model", args.model), ("precision", args.precision)):
        if text and not agg.empty:
            kept = keep_named(agg, args, (col,))  # names compared in Python (`filter_flags.keep_named`)
            if kept.empty or not named(text):
                have = ", ".join(sorted(map(str, agg[col].unique())))
                raise UsageError(
                    f"--{col} {text!r}: {label} has no results of it (it has {have})",
                    f"pass --{col} with one of those",
                )
            agg = kept
    return agg


def _records(df) -> list[dict[str, Any]]:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v.item() if hasattr(v, "item") and not isinstance(v, (list, dict, str)) else v

    return [{k: clean(v) for k, v in r.items()} for r in df.to_dict("records")]


def _emit(args: argparse.Namespace, frames: dict[str, Any], head: dict[str, Any]) -> bool:
    """``--output``: ``frames`` as CSV; ``--json``: ``head`` and them as records. True: print the tables."""
    if args.output:
        _write_csv(frames, args.output)
    if args.json:
        print(json.dumps({**head, **{k: _records(v) for k, v in frames.items()}}, indent=1, default=str))
    return not args.json


def _load(side: Side, args: argparse.Namespace):
    from deepgap.analysis import aggregate, prepare
    from deepgap.report.page import pooled_samples_fn
    from deepgap.roofline.storage import peaks_frame
    from deepgap.store import Store

    store = Store(side.store_path, readonly=True)
    try:
        agg = _filter(
            aggregate(prepare(store.results_frame(side.run_ids)), samples=store.samples), args, side.label
        )
    except BaseException:
        store.close()
        raise
    platforms = ", ".join(sorted(agg["platform"].unique())) if len(agg) else "no results"
    side.label = f"{side.label} ({platforms})"
    return store, agg, pooled_samples_fn(store), peaks_frame(store)


def _on_platform(side: Side, agg, dec, query: str):
    """(forward, decode) rows of the platform ``query`` names among both; the side's label says which."""
    from deepgap.analysis.platforms import platform_names, resolve_platform

    name = resolve_platform(query, sorted(set(platform_names(agg)) | set(platform_names(dec))))
    side.label = f"{side.label.split(' (')[0]} (platform {name})"
    return tuple(f[f["platform"] == name] if len(f) else f for f in (agg, dec))


def _predict(matched, best, agg_a, agg_b, peaks: list):
    """The roofline's predicted ratio beside each measured one (`roofline.predict.add_predictions`)."""
    import pandas as pd

    from deepgap.analysis.platforms import platform_names, roofs_for
    from deepgap.roofline.predict import add_predictions

    frames = [f for f in peaks if len(f)]
    roofs = roofs_for(
        sorted(set(platform_names(agg_a)) | set(platform_names(agg_b))),
        pd.concat(frames, ignore_index=True) if frames else None,
    )
    return add_predictions(matched, roofs), add_predictions(best, roofs)


def _write_csv(frames: dict[str, Any], path: str) -> None:
    """The comparison's rows in the format ``-o``'s suffix names (`export.output_format`: CSV by default).

    Why the suffix: ``-o cmp.parquet`` wrote CSV text under a parquet name, as export's ``-o`` did.
    """
    import pandas as pd

    from deepgap.commands.export import output_format, write_frame
    from deepgap.render.formatting import csv_frame

    parts = [csv_frame(f).assign(level=level) for level, f in frames.items() if len(f)]
    out = pd.concat(parts) if parts else pd.DataFrame()
    fmt = output_format(path, None)
    if fmt == "parquet":  # parquet wants one type a column: a text column's numbers become text, gaps stay
        for c in [c for c in out.columns if out[c].dtype == "object"]:
            out[c] = out[c].map(lambda v: None if v is None or v != v else str(v))
    write_frame(out, path, fmt)


def _sides(args: argparse.Namespace) -> list[Side]:
    """The sides the arguments name (one store twice for --platforms with a single side)."""
    if args.paper:
        want, what = (0, 1), "one store or run id with --paper"
    elif args.platforms:
        want, what = (0, 1, 2), "one store (or two sides) with --platforms"
    else:
        want, what = (2,), "two sides (A B)"
    if len(args.sides) not in want:
        raise UsageError(
            f"compare takes {what}, got {len(args.sides)}",
            "e.g. deepgap compare a.sqlite b.sqlite, deepgap compare all.sqlite --platforms H200,H100, "
            "or deepgap compare a.sqlite --paper",
        )
    sides = [resolve_side(a, args.store) for a in (args.sides or [args.store])]
    if args.platforms and not args.paper and len(sides) == 1:
        sides.append(Side(sides[0].store_path, sides[0].run_ids, sides[0].label))
    return sides


def print_x_cpu(x_cpu) -> None:
    """Your GPU over your host CPU beside the paper's GPU over its Xeon (or why there is no such row)."""
    from rich.console import Console
    from rich.table import Table

    from deepgap.render.formatting import fmt_ci, fmt_x

    console = Console(width=None if Console().is_terminal else 220)
    if not len(x_cpu):
        console.print(
            "× CPU beside the paper's: unavailable: no CPU result in A (a GPU run measures "
            "its host CPU unless --no-cpu-baseline)"
        )
        return
    t = Table(
        "your platform",
        "model",
        "prec",
        "your configuration",
        "your CPU (fp32)",
        "yours × CPU fp32",
        "95% CI",
        "yours × CPU (answer's pairing)",
        "pairing",
        "paper platform",
        "paper × CPU",
        "yours / paper",
        title="GPU over CPU beside the paper's (its × CPU is over its Xeon's fp32; so is yours first)",
    )
    for r in x_cpu.to_dict("records"):
        ci = fmt_ci(r["yours_x_cpu_fp32_ci_low"], r["yours_x_cpu_fp32_ci_high"], fmt_x)
        same = r["yours_x_cpu_same"]
        same = fmt_x(same) if same == same else r["cpu_same_configuration"]
        t.add_row(
            r["platform"],
            r["model"],
            r["precision"],
            r["configuration"],
            r["cpu_configuration"],
            fmt_x(r["yours_x_cpu_fp32"]),
            ci,
            same,
            str(r.get("pairing", "")),
            r["paper_platform"],
            fmt_x(r["paper_x_cpu"]),
            fmt_x(r["yours_over_paper"]),
        )
    console.print(t)


def main(args: argparse.Namespace) -> int:  # noqa: D103
    platforms = None
    if args.platforms:
        from deepgap.analysis.platforms import parse_platforms

        platforms = parse_platforms(args.platforms)
    sides = _sides(args)
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError(
                f"cannot write {args.output}: {folder} is missing or not writable", "pass a writable -o"
            )
    if args.paper:
        from deepgap.analysis.compare import compare_paper, precision_mappings
        from deepgap.analysis.host_cpu import paper_cpu_ratios
        from deepgap.analysis.reference import paper_peaks

        store, agg, _, _ = _load(sides[0], args)
        store.close()
        if platforms:  # --paper with --platforms: only those platforms' rows
            from deepgap.analysis.platforms import platform_names, resolve_platform

            names = [resolve_platform(p, platform_names(agg)) for p in platforms]
            agg = agg[agg["platform"].isin(names)]
        table = compare_paper(agg, paper_peaks())
        x_cpu = paper_cpu_ratios(agg, paper_peaks())
        head = {"a": sides[0].label, "precision_mapping": _records(precision_mappings(table))}
        if _emit(args, {"paper": table, "x_cpu": x_cpu}, head):
            print_paper(sides[0].label, table, paper_peaks())
            print_x_cpu(x_cpu)
        return 0 if len(table) or len(x_cpu) else 1
    from deepgap.analysis.compare import compare, provenance
    from deepgap.analysis.decode_compare import compare_decode

    same = sides[0].store_path == sides[1].store_path and sides[0].run_ids == sides[1].run_ids
    sa, agg_a, fa, pa = _load(sides[0], args)
    sb, agg_b, fb, pb = (sa, agg_a, fa, pa) if same else _load(sides[1], args)
    try:
        (agg_a, dec_a), (agg_b, dec_b) = _frames(sa, sb, sides, args, platforms, agg_a, agg_b)
        matched, best = compare(agg_a, agg_b, fa, fb, like_kinds=not platforms)
        dmatched, dbest = compare_decode(dec_a, dec_b, fa, fb, like_kinds=not platforms)
        notes = provenance(_runs_of(sa, agg_a, dec_a), _runs_of(sb, agg_b, dec_b))
    finally:
        sa.close()
        if not same:
            sb.close()
    matched, best = _predict(matched, best, agg_a, agg_b, [pa] if same else [pa, pb])
    from deepgap.render.formatting import without_default_inputs

    # input_mode only where a row has a resident input: a default-only comparison prints as before
    matched, best = without_default_inputs(matched), without_default_inputs(best)
    anchors = resident_lines([("A", agg_a), ("B", agg_b)])  # MLPerf's number, with its conditions
    if args.best_only:
        matched = matched.iloc[0:0]
    head = {"a": sides[0].label, "b": sides[1].label, "provenance": notes}
    if anchors:
        head["resident_inputs"] = anchors
    decode = {"decode_best": dbest, "decode_matched": dmatched} if len(dbest) or len(dmatched) else {}
    if _emit(args, {"best_batch": best, "matched": matched, **decode}, head):
        _print(sides, notes, matched, best, decode, [agg_a, agg_b])
        for line in anchors:
            print(line)
    return 0 if len(best) or len(matched) or decode else 1


def _print(sides: list[Side], notes: list[str], matched, best, decode: dict, aggs: list) -> None:
    """The console's comparison: provenance warnings, the forward tables, then the decode tables."""
    from deepgap.render.units import of_seq_lens

    for n in notes:
        print(f"warning: {n}")
    seqs = [v for agg in aggs if "seq_len" in agg for v in agg["seq_len"]]
    if len(best) or len(matched) or not decode:  # a decoder-only comparison: its own tables only
        # a text model's rows: seq/s and their sequence length (render.units)
        print_pairs(sides[0].label, sides[1].label, matched, best, of_seq_lens(seqs))
    else:
        print(f"A = {sides[0].label}\nB = {sides[1].label}")
    if decode:
        print_decode_pairs(decode["decode_matched"], decode["decode_best"])


def _frames(sa, sb, sides: list[Side], args: argparse.Namespace, platforms, agg_a, agg_b):
    """Each side's (forward, decode) configurations, on the platform ``--platforms`` names for it.

    A platform is resolved against the side's forward and decode rows together, so a store of decode rows
    alone takes ``--platforms`` too; without it, a side with two platforms of one kind is bad input.
    """
    from deepgap.commands.compare_decode import decode_side, label

    dec_a = decode_side(sa, sides[0].run_ids, args)
    dec_b = decode_side(sb, sides[1].run_ids, args)
    if not platforms:  # like device kinds only; several platforms of one kind: name them
        _one_platform_per_kind(sides, agg_a, agg_b)
        _one_platform_per_kind(sides, dec_a, dec_b)
        sides[0].label, sides[1].label = (
            label(sides[0].label, agg_a, dec_a),
            label(sides[1].label, agg_b, dec_b),
        )
        return (agg_a, dec_a), (agg_b, dec_b)
    out = [
        _on_platform(side, g, d, q)
        for side, g, d, q in zip(sides, (agg_a, agg_b), (dec_a, dec_b), platforms, strict=True)
    ]
    if sides[0].label == sides[1].label:
        raise UsageError(f"--platforms names one platform twice ({sides[0].label})", "name two platforms")
    return out[0], out[1]


def _one_platform_per_kind(sides: list[Side], agg_a, agg_b) -> None:
    """A `UsageError` where a side holds two platforms of one device kind: which pair is meant is unsaid.

    Without ``--platforms``, A's GPU is set against B's GPU and A's CPU against B's CPU; a side with two
    GPUs (a merged store) would pair every one with every other, so the user names the two.
    """
    for side, agg in zip(sides, (agg_a, agg_b), strict=True):
        if not len(agg):
            continue
        for kind, names in agg.groupby("device")["platform"].unique().items():
            if len(names) > 1:
                named = sorted(map(str, names))
                raise UsageError(
                    f"{side.label} holds {len(names)} {kind} platforms ({'; '.join(named)}): which pair to "
                    "compare is unsaid",
                    f'pass --platforms A,B, e.g. --platforms "{named[0]},{named[1]}"',
                )


def _runs_of(store, *aggs) -> list[dict[str, Any]]:
    """The stored runs behind an aggregated side, forward and decode (their environment says which code measured)."""
    ids = {str(r) for agg in aggs if len(agg) and "run_ids" in agg for ids in agg["run_ids"] for r in ids}
    return [r for r in store.runs() if str(r["run_id"]) in ids]
