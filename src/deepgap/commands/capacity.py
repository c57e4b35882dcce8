"""``deepgap capacity``: server capacity at an SLO predicted from a store's batch curves (no traffic sent)."""

from __future__ import annotations

import argparse
import json

from deepgap.commands.filter_flags import add_filter_flags, add_run_flag, add_store_argument
from deepgap.core.errors import UsageError
from deepgap.render.formatting import fmt_capacity

NAME = "capacity"
HELP = "predict server capacity at a p99 SLO from stored batch sweeps (simulated dynamic batching)"
ORDER = 6


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    p.add_argument("--slo-p99", required=True, help="p99 latency bound, e.g. 15ms")
    add_run_flag(p)
    add_filter_flags(p, "model", "engine", "precision")
    add_simulation_arguments(p)


def add_simulation_arguments(p: argparse.ArgumentParser) -> None:
    """The simulated server's flags, here and in ``deepgap plan`` (`load_settings` reads them), and --json."""
    p.add_argument("--max-batch", help="largest batch the server may form")
    p.add_argument(
        "--padding",
        default="bucket",
        help="bucket: batches pad to measured sizes (default) | exact: interpolate between them",
    )
    p.add_argument("--confidence", default="0.99", help="confidence of the p99 verdict (default 0.99)")
    p.add_argument("--min-duration", default="2s", help="simulated seconds per load level (default 2s)")
    p.add_argument("--seed", default="0", help="seed of the simulated arrivals")
    p.add_argument("--json", action="store_true", help="JSON records instead of a table")


def load_settings(args: argparse.Namespace):
    """SLO and simulation settings from the flags."""
    from deepgap.serving.capacity.search import LoadSettings
    from deepgap.serving.sim.arrivals import parse_duration_s

    slo = parse_duration_s(args.slo_p99, "slo-p99")
    try:
        conf = float(args.confidence)
        seed = int(args.seed)
    except ValueError:
        raise UsageError(
            "--confidence must be a number and --seed an integer", "e.g. --confidence 0.99"
        ) from None
    if not 0 < conf < 1:
        raise UsageError(f"--confidence must be in (0, 1), got {conf}", "pass e.g. --confidence 0.99")
    if not 0 <= seed < 2**32:  # numpy's seeds: a negative one was a ValueError traceback
        raise UsageError(f"--seed must be from 0 to 2^32-1, got {args.seed}", "pass e.g. --seed 0")
    # at most a day (`parse_duration_s`): simulated time still costs real time, and 1e20 s never ended
    min_duration = parse_duration_s(args.min_duration, "min-duration")
    return LoadSettings(
        slo_s=slo,
        confidence=conf,
        min_duration_s=min_duration,
        max_queries=100_000,
        seed=seed,
    )


def max_batch_of(args: argparse.Namespace) -> int | None:
    """--max-batch as a positive integer, or None."""
    if args.max_batch is None:
        return None
    try:
        v = int(args.max_batch)
    except ValueError:
        v = 0
    if v < 1:
        raise UsageError(
            f"--max-batch must be a positive integer, got {args.max_batch!r}", "pass e.g. --max-batch 32"
        )
    return v


def select_curves(stores: list[str], args: argparse.Namespace, padding: str) -> list:
    """Curves of ``stores`` matching the filters (a UsageError when none does)."""
    from deepgap.serving.capacity.planner import curves_from_store
    from deepgap.store import Store

    if padding not in ("bucket", "exact"):
        raise UsageError(f"unknown --padding {padding!r}", "use bucket or exact")
    curves = []
    for path in stores:
        st = Store(path, readonly=True)
        try:
            curves += curves_from_store(st, getattr(args, "run", None), padding)
        finally:
            st.close()
    stored = bool(curves)
    for field in ("model", "engine", "precision"):
        want = getattr(args, field, None)
        if want:
            curves = [c for c in curves if c.key[field] == want]
    if not curves:
        _no_curve(stores, args, stored)
    return curves


def _no_curve(stores: list[str], args: argparse.Namespace, stored: bool) -> None:
    """The `UsageError` for a selection without a curve: a decoder's points to its own commands.

    The stores' decode rows are read here only, on the way to the error: a decoder's rows are no batch
    curve of queries, so its capacity and devices are measured otherwise.
    """
    from deepgap.store import Store

    decoders: set[str] = set()
    for path in stores:
        st = Store(path, readonly=True)
        try:
            dec = st.decode_frame(getattr(args, "run", None))
            decoders |= set(map(str, dec["model"])) if len(dec) else set()
        finally:
            st.close()
    asked = getattr(args, "model", None)
    if decoders and (asked in decoders if asked else not stored):  # a decoder named, or nothing but decoders
        m = sorted(decoders)[0]
        raise UsageError(
            f"{', '.join(stores)} holds decode rows ({', '.join(sorted(decoders))}), not batch curves of queries",
            f"a decoder's devices for a target: deepgap plan STORE --model {m} --target-tok-s N; its served "
            f"capacity: deepgap serve --model {m} --scenario server --find-capacity",
        )
    raise UsageError(
        f"no successful batch curve in {', '.join(stores)} matches",
        "run `deepgap run` or `deepgap serve` first, or relax --model/--engine/--precision",
    )


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.serving.capacity.planner import explain, predict

    load = load_settings(args)
    mb = max_batch_of(args)
    curves = select_curves([args.store], args, args.padding)
    measured = _measured(args.store)
    rows = []
    for c in curves:
        p = predict(c, load, mb)
        m = measured.get(
            (
                c.key["platform"],
                c.key["model"],
                c.key["engine"],
                c.key["precision"],
                c.key["memory_format"],
                round(load.slo_s, 9),
            )
        )
        rows.append(
            {
                "platform": c.key["platform"],
                "configuration": c.label(),
                "policy": p.best.policy.label(),
                "capacity_qps": p.best.capacity_qps,
                "saturation_qps": c.service.saturation_qps(p.best.policy.max_batch),
                "p99_at_capacity_s": p.best.at_capacity.summary.latency_p99_s if p.best.at_capacity else None,
                "measured_capacity_qps": m,
                "slo_s": load.slo_s,
                "note": p.best.note,
                "why": explain(p),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(
        "platform",
        "configuration",
        "best policy",
        "capacity q/s",
        "saturation q/s",
        "p99 ms at capacity",
        "measured q/s",
        "why",
        title=f"predicted capacity at p99 ≤ {load.slo_s * 1e3:g} ms ({args.padding} padding)",
    )
    for r in rows:
        t.add_row(
            r["platform"],
            r["configuration"],
            r["policy"],
            fmt_capacity(r["capacity_qps"]),
            f"{r['saturation_qps']:,.1f}",
            "" if r["p99_at_capacity_s"] is None else f"{r['p99_at_capacity_s'] * 1e3:.3f}",
            "" if r["measured_capacity_qps"] is None else f"{r['measured_capacity_qps']:,.1f}",
            r["why"],
        )
    Console(width=200).print(t)
    return 0


def _measured(path: str) -> dict[tuple, float]:
    """Best measured capacity per configuration and SLO, from serve runs in the store."""
    from deepgap.serving.records.storage import capacity_frame
    from deepgap.store import Store

    st = Store(path, readonly=True)
    try:
        cf = capacity_frame(st)
    finally:
        st.close()
    out: dict[tuple, float] = {}
    if len(cf):
        for r in cf[cf["source"] == "measured"].to_dict("records"):
            k = (
                r["device_name"] or r["device"],
                r["model"],
                r["engine"],
                r["precision"],
                r["memory_format"],
                round(r["slo_s"], 9),
            )
            out[k] = max(out.get(k, 0.0), r["capacity_qps"])
    return out
