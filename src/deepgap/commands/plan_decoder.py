"""``deepgap plan --target-tok-s`` for a decoder: its devices per kind from the stores' decode rows.

The arithmetic is `deepgap.analysis.decode_plan`'s; this module reads the flags and prints. Every flag
that narrows a plan (``--engine``, ``--precision``, ``--platforms``, ``--max-batch``, ``--input-len``,
``--output-len``) narrows this one too, and ``--objective watts`` picks by power: none is read and then
ignored.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from deepgap.commands.filter_flags import named
from deepgap.core.errors import UsageError


def _scope(args: argparse.Namespace, platforms: list[str]):
    """The rows the flags allow (`DecodeScope`), each number checked here."""
    from deepgap.analysis.decode_plan import DecodeScope
    from deepgap.analysis.platforms import resolve_platform
    from deepgap.drive.config import parse_number

    def count(value: str | None, flag: str) -> int | None:
        if value is None:
            return None
        n = parse_number(value, int, flag.lstrip("-"))
        if n < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}", f"pass e.g. {flag} 128")
        return n

    return DecodeScope(
        engines=tuple(named(args.engine)),
        precisions=tuple(named(args.precision)),
        platforms=tuple(resolve_platform(q, platforms) for q in named(args.platforms)),
        max_batch=count(args.max_batch, "--max-batch"),
        input_len=count(args.input_len, "--input-len"),
        output_len=count(args.output_len, "--output-len"),
    )


def plan_decoder(args: argparse.Namespace) -> int:
    """Read the stores' decode rows, plan (`analysis.decode_plan.plan_decode`), print a list or JSON."""
    import pandas as pd

    from deepgap.analysis.decode_answer import platform
    from deepgap.analysis.decode_plan import MLPERF_TPOT_S, MLPERF_TTFT_S, plan_decode
    from deepgap.analysis.decode_section import read_table
    from deepgap.analysis.recommend import parse_duration_s
    from deepgap.drive.config import parse_number
    from deepgap.store import Store

    if args.qps is not None or args.slo_p99 is not None:
        raise UsageError(
            "--target-tok-s plans a decoder's tokens/s; --qps and --slo-p99 plan queries/s",
            "pass one of them: --target-tok-s with --tpot-slo/--ttft-slo, or --qps with --slo-p99",
        )
    if args.seq_len is not None:
        raise UsageError(
            f"--seq-len applies to text encoders, and {args.model} is a decoder",
            "pass --input-len and --output-len instead",
        )
    target = parse_number(args.target_tok_s, float, "target-tok-s")
    tpot = parse_duration_s(args.tpot_slo, "--tpot-slo") if args.tpot_slo else MLPERF_TPOT_S
    ttft = parse_duration_s(args.ttft_slo, "--ttft-slo") if args.ttft_slo else MLPERF_TTFT_S
    tabs = []
    for path in args.stores:
        store = Store(path, readonly=True)
        try:
            tabs.append(read_table(store, None))
        finally:
            store.close()
    tab = pd.concat(tabs, ignore_index=True)
    names = sorted({platform(r) for r in tab.to_dict("records")}) if not tab.empty else []
    rows = plan_decode(tab, args.model, target, tpot, ttft, _scope(args, names), args.objective)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    _print(args.model, target, tpot, ttft, rows)
    return 0


def _print(model: str, target: float, tpot: float, ttft: float, rows) -> None:
    lengths = f" at {rows[0].input_len} in / {rows[0].output_len} out" if rows else ""
    print(
        f"{model}{lengths}: {target:,.0f} output tokens/s with TPOT ≤ {tpot * 1e3:g} ms and TTFT ≤ "
        f"{ttft * 1e3:g} ms (per device: a stored batch generated start to end, its prefill included; TPOT: "
        "its tail, TTFT: its median)"
    )
    for i, r in enumerate(rows, 1):
        if r.devices is None:
            print(f"{i}. {r.platform}: {r.why}")
        else:
            watts = (
                f", {r.watts_per_device:,.0f} W per device ({r.total_watts():,.0f} W in all)"
                if r.watts_per_device
                else ", power unavailable"
            )
            print(
                f"{i}. {r.platform}: {r.devices} device(s) of {r.configuration} at "
                f"{r.tokens_per_s_per_device:,.1f} output tokens/s each{watts}; TPOT {r.tpot_tail_ms:.3g} ms "
                f"({r.tpot_tail_label}), TTFT {r.ttft_median_ms:.4g} ms (median): {r.why}"
            )
        for alt in r.alternatives:
            print(f"   considered: {alt}")
