"""``deepgap plan``: how many devices of each measured kind carry a load within a p99 SLO, and their power."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from deepgap.core.errors import UsageError

NAME = "plan"
HELP = "devices (and watts) per measured device kind to serve QPS within a p99 SLO, from one or more stores"
ORDER = 7


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    from deepgap.commands.capacity import add_simulation_arguments

    p.add_argument("stores", nargs="+", help="store files (e.g. one per machine: T4, L4, H100 …)")
    p.add_argument("--qps", required=True, help="total load to carry, queries/s")
    p.add_argument("--slo-p99", required=True, help="p99 latency bound, e.g. 15ms")
    p.add_argument("--model", required=True, help="the model to serve")
    p.add_argument("--objective", default="devices", help="devices (fewest devices) | watts (least power)")
    p.add_argument("--engine", help="only this engine")
    p.add_argument("--precision", help="only this precision")
    p.add_argument(
        "--platforms", help="only these device kinds (comma-separated names or unique parts, e.g. H200,H100)"
    )
    add_simulation_arguments(p)


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.commands.capacity import load_settings, max_batch_of, select_curves
    from deepgap.serving.capacity.planner import plan, predict, store_card_spreads, widen_by_cards
    from deepgap.serving.sim.arrivals import parse_rate_qps

    qps = parse_rate_qps(args.qps)
    if args.objective not in ("devices", "watts"):
        raise UsageError(f"unknown --objective {args.objective!r}", "use devices or watts")
    load = load_settings(args)
    mb = max_batch_of(args)
    curves = select_curves(list(args.stores), args, args.padding)
    if args.platforms:
        from deepgap.analysis.platforms import resolve_platform

        names = sorted({str(c.key["platform"]) for c in curves})
        keep = {resolve_platform(q, names) for q in args.platforms.split(",") if q.strip()}
        curves = [c for c in curves if str(c.key["platform"]) in keep]
    rows = plan([predict(c, load, mb) for c in curves], qps, args.objective)
    widen_by_cards(rows, store_card_spreads(list(args.stores)), qps)  # two or more cards of a type: a range
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(
        "rank",
        "device kind",
        "configuration",
        "policy",
        "capacity q/s per device",
        "devices",
        "W per device",
        "total kW",
        "× devices",
        "× watts",
        "top-1 %",
        "note",
        title=f"{args.model}: {qps:,.0f} queries/s at p99 ≤ {load.slo_s * 1e3:g} ms (objective: {args.objective})",
    )
    for i, r in enumerate(rows, 1):
        t.add_row(
            str(i),
            r.platform,
            r.configuration,
            r.policy,
            f"{r.capacity_qps:,.1f}",
            "–" if r.devices is None else str(r.devices),
            "–" if r.power_w_per_device is None else f"{r.power_w_per_device:.0f}",
            "–" if r.total_power_w is None else f"{r.total_power_w / 1e3:,.2f}",
            "–" if r.relative_devices is None else f"{r.relative_devices:.2f}",
            "–" if r.relative_power is None else f"{r.relative_power:.2f}",
            "–" if r.top1 is None else f"{100 * r.top1:.2f}",
            r.note,
        )
    console = Console(width=200)
    console.print(t)
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
                f"{a['capacity_qps']:,.1f} q/s, {dev}: {a['why']}"
            )
    return 0
