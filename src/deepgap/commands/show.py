"""``deepgap show``: results as a terminal table (latest run by default)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from deepgap.commands.filter_flags import add_run_flag, add_store_argument
from deepgap.store.guard import add_read_flags, use_read_flags

if TYPE_CHECKING:
    from deepgap.store import Store

NAME = "show"
HELP = "print stored results as a table (the latest run unless --run/--all)"
ORDER = 2


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    add_run_flag(p, "the latest run; every run with --all")
    p.add_argument("--all", action="store_true", help="every run in the store")
    p.add_argument("--runs", action="store_true", help="list the runs instead of results")
    p.add_argument("--json", action="store_true", help="results as JSON records")
    add_read_flags(p, redact=False)


def _fmt_ms(v: float | None) -> str:
    return "" if v is None or v != v else f"{v * 1e3:.3f}"


def signals_of(df) -> tuple[list[list[str]], list[list[str]]]:
    """Per row: (what counts against it, what is only noted), by the report's own rule (`analysis.signals`).

    The first: disqualifying flags (``WRONG(relL2=…)``, contaminated telemetry, accuracy loss) and
    warnings (the number can move beyond its CI); the second: notes (power cap, a missed CI target, a
    warm-up that held within its interval), which say nothing against the number. Before, `show` printed
    them all as flags: 54 of 88 rows of a default run, none of which the report counted against a number.
    """
    from deepgap.analysis import prepare

    prep = prepare(df)
    against = [
        [_wrong(f) for f in fl] + list(ws) for fl, ws in zip(prep["flags"], prep["warnings"], strict=True)
    ]
    return against, [list(ns) for ns in prep["notes"]]


def _wrong(flag: str) -> str:
    """A wrong-output flag as `show` has always printed it: ``WRONG(relL2=…)``."""
    return "WRONG" + flag[len("wrong-output") :] if flag.startswith("wrong-output") else flag


def _top1(extra) -> str:
    """Dataset top-1 and its share of fp32's ("76.13 (99.8%)"), or the check inputs' agreement ("agree 100%")."""
    from deepgap.analysis.accuracy import columns, figure
    from deepgap.analysis.flags import degenerate

    if degenerate(extra):  # the output ignores its input: an agreement of ties says nothing
        return "not checked"
    acc = columns(extra)
    if "top1" in acc:
        rel = f" ({100 * acc['top1_relative']:.1f}%)" if "top1_relative" in acc else ""
        return f"{100 * acc['top1']:.2f}{rel}"
    value, kind = figure(extra)
    return f"agree {100 * value:.0f}%" if kind == "agreement" and value is not None else ""


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.store import Store

    use_read_flags(args)
    store = Store(args.store, readonly=True)
    try:  # closed, not left to the process's exit: in-process callers (tests, the API) read on
        return _show(args, store)
    finally:
        store.close()


def _show(args: argparse.Namespace, store: Store) -> int:
    from rich.console import Console

    store.check_runs(args.run)
    console = Console(width=None if Console().is_terminal else 240)  # room for the notes column
    runs = store.runs()
    if args.runs:
        console.print(_runs_table(runs))
        return 0
    ids = None if args.all else (args.run or ([runs[-1]["run_id"]] if runs else []))
    df = store.results_frame(ids)
    from deepgap.render.formatting import without_default_inputs

    if args.json:  # input_mode: where a row has a resident input (empty for the default rows beside it)
        from deepgap.commands.decode_view import export_decode

        out = export_decode(store, ids, without_default_inputs(df.drop(columns=["extra"])))
        print(out.to_json(orient="records", indent=1))
        return 0
    from deepgap.commands.decode_view import print_decode

    if df.empty and print_decode(store, console, ids):  # a decode run: its own table only
        return 0
    from deepgap.serving.show.console import print_serving  # serve runs: load levels, capacity, interference
    from deepgap.serving.show.tables import any_serving

    if df.empty and any_serving(store):  # a serve run: its tables, not an empty one of forward results
        print_serving(store, console, ids)
        return 0
    from deepgap.render.units import IMAGE, of_frame

    units = of_frame(df) if len(df) else IMAGE  # a text model's rows: seq/s, no layout, no top-1
    t, against, notes = _results_table(df, units, f"{args.store}: {len(df)} results")
    console.print(t)
    if len(df):
        n_against, n_notes = (
            sum(map(bool, against)),
            sum(bool(n) and not a for a, n in zip(against, notes, strict=True)),
        )
        console.print(
            f"{n_against} of {len(df)} results flagged or warned (the number is left out, or can move beyond"
            f" its CI); {n_notes} carry notes only (recorded; they cannot move the number beyond its CI)"
        )
    _print_resident(df, console)
    _print_sweeps(store, df, console)
    print_decode(store, console, ids)
    print_serving(store, console, ids)
    return 0


def _results_table(df, units, title: str):
    """The forward results as a rich table (a device column where the rows hold two GPUs), and their signals.

    The rows' flags and notes (`signals_of`) come back too: the summary line under the table counts them.
    """
    from rich.table import Table

    text = units.kind != "image"  # text models: seq and tokens/s columns
    devices = df["device_name"].nunique() if len(df) and "device_name" in df else 0
    t = Table(
        *(("device",) if devices > 1 else ()),  # a merged store's rows of two GPUs, told apart
        "model",
        "engine",
        "prec",
        "bs",
        "fmt",
        "thr",
        "sweep",
        "status",
        "median ms (95% CI)"
        + (" per batch" if text else ""),  # the batch's latency (bs column), not an item's
        "tail ms",  # a p99 only where n supports one, else "max of n" (analysis.tails)
        units.short,
        f"{units.short} pipelined",
        *(("seq", "tokens/s") if text else ()),
        "n",
        "cv",
        units.header("top-1 % (vs fp32)"),
        "flags · warnings",  # what counts against the number (it can move beyond its CI, or is left out)
        "notes",  # recorded, but they cannot move the number beyond its CI (analysis.signals)
        title=title,
    )
    # a note's name and fix ("pass --weights"), and an engine's input ("packed:uniform:8:64"), are never cut
    for col in [t.columns[1 + (devices > 1)], *t.columns[-2:]]:
        col.overflow = "fold"
    t.columns[-1].min_width = 28
    if devices > 1:
        t.columns[2].min_width = 21  # "quant · int8-resident" on one line beside the device column
    against, notes = signals_of(df) if len(df) else ([], [])
    for i, row in enumerate(df.to_dict("records")):
        device = (str(row.get("device_name") or row.get("device")),) if devices > 1 else ()
        t.add_row(*device, *_result_cells(row, text, against[i], notes[i]))
    return t, against, notes


def _runs_table(runs: list[dict]):
    """``show --runs``: one line per run of the store."""
    import time

    from rich.table import Table

    t = Table("run", "status", "created", "device", "command")
    for r in runs:
        t.add_row(
            r["run_id"],
            r["status"],
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_at"])),
            str(r["env"].get("device_name", "")),
            r["command"],
        )
    return t


def _result_cells(row: dict, text: bool, against: list[str], notes: list[str]) -> list[str]:
    """One result's cells: its configuration, status, numbers (blank unless ok), flags and notes."""
    from deepgap.render.formatting import input_cell
    from deepgap.render.units import format_cell

    ok = row["status"] == "ok"
    med = (
        (
            f"{_fmt_ms(row['latency_median_s'])} ({_fmt_ms(row['latency_median_ci_low_s'])}–"
            f"{_fmt_ms(row['latency_median_ci_high_s'])})"
        )
        if ok
        else ""  # why there is no number: the notes cell, whole (it was cut at 60 characters here)
    )
    thr = "" if row["threads"] is None or row["threads"] != row["threads"] else str(int(row["threads"]))
    return [
        row["model"],
        input_cell(row["engine"], row),  # "quant · int8-resident": a resident input, never the default
        row["precision"],
        str(row["batch_size"]),
        str(format_cell(row)),
        thr,
        str(row.get("sweep", "")),
        row["status"],
        med,
        _tail_cell(row) if ok else "",
        f"{row['throughput_ips']:,.1f}" if ok else "",
        f"{row['throughput_pipelined_ips']:,.1f}" if ok else "",
        *(_tokens_cells(row, ok) if text else ()),
        str(int(row["n_samples"])) if ok else "",
        f"{row['cv_repeats']:.3f}"
        if ok and row["cv_repeats"] == row["cv_repeats"] and row["cv_repeats"] is not None
        else "",
        _top1(row.get("extra")),
        " ".join(against),
        " ".join(notes if ok else [str(row.get("reason") or ""), *notes]),
    ]


def _print_resident(df, console) -> None:
    """What a resident-input row is, and MLPerf's number with its conditions where the GPU has one."""
    if df.empty or "input_mode" not in df or not df["input_mode"].astype(bool).any():
        return
    from deepgap.analysis.mlperf import anchor_lines, mode_note
    from deepgap.core.records import input_kind

    ok = df[df["input_mode"].astype(bool) & (df["status"] == "ok")]
    for kind, mode in {input_kind(m): m for m in df["input_mode"] if m}.items():
        console.print(f"{kind} rows: {mode_note(mode)}")
    resident = ok[[input_kind(m) == "int8-resident" for m in ok["input_mode"]]]
    for platform, model in sorted(
        {
            (str(p), str(m))
            for p, m in zip(
                resident["device_name"].where(resident["device_name"].astype(bool), resident["device"]),
                resident["model"],
                strict=True,
            )
        }
    ):
        for line in anchor_lines(platform, model):
            console.print(f"  {model} on {platform}: {line}")


def _tail_cell(row: dict) -> str:
    """A measurement's tail, named: '1.234 (max of n=20)', or '0.987 (p99 of n=400)' (analysis.tails)."""
    from deepgap.analysis.tails import of_measurement

    tail = of_measurement(row)
    return f"{_fmt_ms(tail.seconds)} ({tail.name()})" if tail.kind else ""


def _tokens_cells(row: dict, ok: bool) -> tuple[str, str]:
    """(sequence length, tokens/s) of a text model's row; blank for an image model's (analysis.tokens)."""
    from deepgap.analysis.tokens import per_token, seq_len_of, tokens_of

    seq = seq_len_of(row.get("seq_len"))
    if not seq:
        return "", ""
    real = tokens_of(row)  # a mixed-length batch (--inputs packed/padded): its sequences are up to seq long
    size = str(seq) if real == seq else f"≤{seq}\nmean {real:.0f}"
    return size, f"{per_token(row)['tokens_per_s']:,.1f}" if ok else ""


def _print_sweeps(store, df, console) -> None:
    """Configurations measured in two or more processes: their two-level CI and between-sweep spread."""
    from rich.table import Table

    from deepgap.analysis import aggregate, config_label, prepare
    from deepgap.analysis.signals import SWEEPS
    from deepgap.render.formatting import fmt_ci, fmt_ips, spread_text
    from deepgap.render.units import of_frame

    if df.empty or not (df["status"] == "ok").any():
        return
    agg = aggregate(prepare(df), samples=store.samples)
    multi = agg[agg["n_measurements"] >= 2] if len(agg) else agg
    if not len(multi):
        return
    t = Table(
        "configuration",
        of_frame(multi).short,
        "95% CI (processes, then samples)",
        "between sweeps",
        "sweeps disagree?",
        title="measured in several sweeps (worker processes)",
    )
    n_warn = n_note = 0
    for r in multi.to_dict("records"):
        warned = [w for w in r["warnings"] if w.startswith(SWEEPS)]
        noted = [n for n in r.get("notes") or [] if n.startswith(SWEEPS)]
        n_warn, n_note = n_warn + bool(warned), n_note + bool(noted)
        t.add_row(
            config_label(r),
            fmt_ips(r["throughput_ips"]),
            fmt_ci(r["throughput_ci_low_ips"], r["throughput_ci_high_ips"]),
            spread_text(r),
            # named as such (analysis.signals): a warning where the interval leaves a sweep out, else a note
            " ".join([*(f"warning: {w}" for w in warned), *(f"note: {n}" for n in noted)]),
        )
    console.print(t)
    console.print(
        f"{len(multi) - n_warn - n_note} of {len(multi)} configurations' sweeps agree within their own "
        f"95% CIs; {n_warn + n_note} disagree: {n_warn} beyond the configuration's interval (a warning),"
        f" {n_note} covered by it (a note)"
    )
