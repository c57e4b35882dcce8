"""``deepgap plan``: how many devices of each measured kind carry a load within a p99 SLO, and their power.

With ``--target-tok-s`` it plans a decoder instead: the devices of each kind that give the target output
tokens/s with every sequence's TPOT and TTFT within ``--tpot-slo`` and ``--ttft-slo`` (MLPerf's 100 ms and
2 s by default), from the stored decode rows (`deepgap.analysis.decode_plan`). A text encoder (bert-*) is
planned in sequences/s and tokens/s at one sequence length (`deepgap.serving.capacity.text_plan`): its
target is ``--qps`` (sequences/s) or ``--target-tok-s`` (tokens/s), its length ``--seq-len``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from deepgap.commands.filter_flags import add_filter_flags
from deepgap.core.errors import UsageError
from deepgap.render.formatting import fmt_capacity

if TYPE_CHECKING:
    from deepgap.serving.capacity.planner import Curve, PlanRow
    from deepgap.serving.capacity.search import LoadSettings
    from deepgap.serving.capacity.text_plan import TextPlan

NAME = "plan"
HELP = (
    "devices (and watts) per measured device kind to serve QPS within a p99 SLO, or a decoder's tokens/s "
    "within a TPOT/TTFT SLO (--target-tok-s), from one or more stores"
)
ORDER = 7


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    from deepgap.commands.capacity import add_simulation_arguments

    p.add_argument("stores", nargs="+", help="store files (e.g. one per machine: T4, L4, H100 …)")
    p.add_argument(
        "--qps",
        help="total load to carry, queries/s (a text encoder's: sequences/s; required, or --target-tok-s)",
    )
    p.add_argument("--slo-p99", help="p99 latency bound, e.g. 15ms (with --qps; required)")
    p.add_argument("--model", required=True, help="the model to serve")
    p.add_argument(
        "--target-tok-s",
        metavar="RATE",
        help="a decoder: total output tokens/s to give, e.g. 8000 (from the stores' decode rows; "
        "instead of --qps and --slo-p99); a text encoder (bert-*): total tokens/s, with --slo-p99 "
        "(instead of --qps)",
    )
    p.add_argument(
        "--seq-len",
        help="a text encoder: the sequence length to plan at (needed when the stores hold several)",
    )
    for end, what in (("input", "prompt"), ("output", "generated")):
        p.add_argument(
            f"--{end}-len",
            metavar="TOKENS",
            help=f"a decoder: the {what} tokens per sequence to plan at (needed when the stores hold several)",
        )
    p.add_argument("--tpot-slo", metavar="DURATION", help="with --target-tok-s: TPOT bound (default 100ms)")
    p.add_argument("--ttft-slo", metavar="DURATION", help="with --target-tok-s: TTFT bound (default 2s)")
    p.add_argument("--objective", default="devices", help="devices (fewest devices) | watts (least power)")
    add_filter_flags(p, "engine", "precision")
    p.add_argument(
        "--platforms", help="only these device kinds (comma-separated names or unique parts, e.g. H200,H100)"
    )
    add_simulation_arguments(p)


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.commands.capacity import load_settings, max_batch_of, select_curves
    from deepgap.serving.capacity.planner import plan, predict, store_card_spreads, widen_by_cards
    from deepgap.serving.capacity.text_plan import UNIT, is_encoder, text_plan

    text = is_encoder(args.model)  # a text encoder: seq/s and tokens/s (`serving.capacity.text_plan`)
    if args.target_tok_s is not None and not text:
        from deepgap.commands.plan_decoder import plan_decoder

        return plan_decoder(args)
    for flag, value in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        if value is not None:
            raise UsageError(f"{flag} applies to a decoder's plan (--target-tok-s)", f"drop {flag}")
    qps = _checked_qps(args, text)
    load = load_settings(args)
    mb = max_batch_of(args)
    curves = _of_platforms(select_curves(list(args.stores), args, args.padding), args.platforms)
    tp = text_plan(curves, args.model, args.qps, args.target_tok_s, args.seq_len) if text else None
    if tp is not None:
        curves, qps = tp.curves, tp.seq_per_s
    unit = UNIT if tp is not None else "q/s"
    rows = plan([predict(c, load, mb) for c in curves], qps, args.objective, unit)
    widen_by_cards(rows, store_card_spreads(list(args.stores)), qps)  # two or more cards of a type: a range
    if args.json:
        print(
            json.dumps([{**asdict(r), **(tp.fields(r.capacity_qps) if tp else {})} for r in rows], indent=1)
        )
        return 0
    _print_plan(args, rows, tp, load, qps, unit)
    return 0


def _checked_qps(args: argparse.Namespace, text: bool) -> float:
    """The target queries/s (0 for a text encoder, whose target `text_plan` reads); a `UsageError` first."""
    from deepgap.serving.sim.arrivals import parse_rate_qps

    if args.seq_len is not None and not text:
        raise UsageError(f"--seq-len applies to text models, and {args.model} is not one", "drop --seq-len")
    needed = (("--qps", args.qps),) if not text else ()  # a text encoder's target: `text_plan`
    for flag, value in (*needed, ("--slo-p99", args.slo_p99)):
        if value is None:
            raise UsageError(
                f"plan needs {flag}",
                "pass --qps and --slo-p99 (or --target-tok-s for a decoder's decode rows)",
            )
    qps = 0.0 if text else parse_rate_qps(args.qps)
    if args.objective not in ("devices", "watts"):
        raise UsageError(f"unknown --objective {args.objective!r}", "use devices or watts")
    return qps


def _of_platforms(curves: list[Curve], platforms: str | None) -> list[Curve]:
    """The curves of the device kinds ``--platforms`` names (names or unique parts); all without it."""
    if not platforms:
        return curves
    from deepgap.analysis.platforms import resolve_platform

    names = sorted({str(c.key["platform"]) for c in curves})
    keep = {resolve_platform(q, names) for q in platforms.split(",") if q.strip()}
    return [c for c in curves if str(c.key["platform"]) in keep]


def _print_plan(
    args: argparse.Namespace,
    rows: list[PlanRow],
    tp: TextPlan | None,
    load: LoadSettings,
    qps: float,
    unit: str,
) -> None:
    """The plan as a table, then what its capacities and tails rest on and each row's alternatives."""
    from rich.console import Console
    from rich.table import Table

    t = Table(
        "rank",
        "device kind",
        "configuration",
        "policy",
        f"capacity {unit} per device",
        *(("tokens/s per device",) if tp else ()),
        "devices",
        "W per device",
        "total kW",
        "devices ÷ #1",
        "watts ÷ #1",
        *(() if tp else ("top-1 %",)),  # a dataset's top-1: none for a text model
        "note",
        title=tp.title(args.model, load.slo_s, args.objective)
        if tp
        else f"{args.model}: {qps:,.0f} queries/s at p99 ≤ {load.slo_s * 1e3:g} ms (objective: {args.objective})",
    )
    for i, r in enumerate(rows, 1):
        t.add_row(
            str(i),
            r.platform,
            r.configuration,
            r.policy,
            fmt_capacity(r.capacity_qps),
            *((f"{r.capacity_qps * tp.seq_len:,.0f}" if r.capacity_qps > 0 else "–",) if tp else ()),
            "–" if r.devices is None else str(r.devices),
            "–" if r.power_w_per_device is None else f"{r.power_w_per_device:.0f}",
            "–" if r.total_power_w is None else f"{r.total_power_w / 1e3:,.2f}",
            "–" if r.relative_devices is None else f"{r.relative_devices:.2f}",
            "–" if r.relative_power is None else f"{r.relative_power:.2f}",
            *(() if tp else ("–" if r.top1 is None else f"{100 * r.top1:.2f}",)),
            r.note,
        )
    console = Console(width=200)
    console.print(t)
    if tp:
        console.print(tp.note())
    if rows:  # which capacity the device counts rest on (LoadGen's, where measured, is in the report)
        console.print(
            f"capacity per device: {rows[0].capacity_used}; a serve run with --loadgen shows "
            "LoadGen's beside it in the report's serving section"
        )
    console.print(
        f"tail: the simulated p99 of each load level (≥ {load.min_queries:,} requests planned per level, "
        "up to 4× more where the verdict was inconclusive; a level that can no longer pass stops early, "
        "and is a fail where the requests it served put the p99 conclusively over the SLO), its service "
        "times drawn from the stored calls"
    )
    for r in rows:  # what limits each answer, and every other configuration considered
        console.print(f"\n{r.platform}: {r.configuration}: {r.why}")
        for a in r.alternatives:
            dev = "–" if a["devices"] is None else f"{a['devices']} devices"
            console.print(
                f"  also considered: {a['configuration']} ({a['policy']}): "
                f"{fmt_capacity(a['capacity_qps'])} {unit}, {dev}: {a['why']}"
            )
