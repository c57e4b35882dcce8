"""``deepgap layers``: the quant engine's per-layer table — time share, TOPS against the roof, bound, tile.

Why a command of its own: the question it answers ("which layer stops the engine?") is the engine
developer's, not the deployer's, and its table has one row per layer, not per configuration.
The rows come from `deepgap.analysis.quant_layers`; ceilings are the store's measured ones
(``deepgap peaks``), another store's with ``--peaks``, or else the spec sheet's.
"""

from __future__ import annotations

import argparse
import json
import math

from deepgap.commands.filter_flags import add_filter_flags, add_store_argument
from deepgap.core.errors import UsageError
from deepgap.store.guard import add_read_flags, use_read_flags

NAME = "layers"
HELP = "the quant engine's layers: time share, TOPS vs their roofline, bound, tile (next bottleneck first)"
ORDER = 8
SORTS = ("headroom", "time", "order")


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    p.add_argument("--peaks", metavar="STORE", help="take measured ceilings from this store (deepgap peaks)")
    add_filter_flags(p, "model")
    p.add_argument("--precision", help="only this precision (int8 or fp8)")
    p.add_argument("--batch-size", type=int, help="only this batch size")
    p.add_argument(
        "--sort",
        choices=SORTS,
        default="headroom",
        help="headroom (time above the layer's roofline floor; default), time, or network order",
    )
    p.add_argument("--top", type=int, default=0, help="show only the first N layers of each configuration")
    p.add_argument("--json", action="store_true", help="print JSON (every layer, every configuration)")
    add_read_flags(p)


def load(store_path: str, peaks_path: str | None = None):
    """(layers frame, summary frame) of a store; ceilings from ``peaks_path`` or the store itself."""
    from deepgap.analysis import quant_layers

    peaks = None
    if peaks_path:
        from deepgap.roofline.storage import peaks_frame
        from deepgap.store import Store

        other = Store(peaks_path, readonly=True)
        try:
            peaks = peaks_frame(other)
        finally:
            other.close()
        if len(peaks) == 0:
            raise UsageError(
                f"--peaks store {peaks_path!r} holds no measured ceilings",
                "measure them with `deepgap peaks --store PATH` or leave --peaks out",
            )
    return quant_layers.load(store_path, peaks_df=peaks)


def _filter(frame, args):
    if args.model:
        frame = frame[frame["model"] == args.model]
    if args.precision:
        frame = frame[frame["precision"] == args.precision]
    if args.batch_size:
        frame = frame[frame["batch_size"] == args.batch_size]
    return frame


def main(args: argparse.Namespace) -> int:  # noqa: D103
    use_read_flags(args)
    if args.top < 0:
        raise UsageError(f"--top {args.top} is negative", "give a count ≥ 1, or 0 for every layer")
    frame, summ = load(args.store, args.peaks)
    if len(frame) == 0:
        raise UsageError(
            f"{args.store!r} holds no quant measurement with a per-layer table",
            "measure one: deepgap run --engines quant --precisions int8 --store PATH",
        )
    frame, summ = _filter(frame, args), _filter(summ, args)
    if len(frame) == 0:
        raise UsageError(
            "no quant configuration matches --model/--precision/--batch-size",
            f"run `deepgap layers {args.store}` to see which are stored",
        )
    if args.json:
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
        out = {
            "summary": [{k: clean(v) for k, v in r.items()} for r in summ.to_dict("records")],
            "layers": [{k: clean(v) for k, v in r.items()} for r in frame.to_dict("records")],
        }
        print(json.dumps(out, default=str))
        return 0
    _print(frame, summ, args)
    return 0


def _print(frame, summ, args) -> None:
    from rich.console import Console
    from rich.table import Table

    from deepgap.analysis.quant_layers import CONFIG_KEYS

    console = Console(width=None if Console().is_terminal else 200)
    order_by = {"headroom": "headroom_s", "time": "time_s", "order": None}[args.sort]
    summ = summ.set_index(CONFIG_KEYS)
    for config, g in frame.groupby(CONFIG_KEYS, sort=True):
        s = {**summ.loc[config].to_dict(), **dict(zip(CONFIG_KEYS, config, strict=True))}
        if order_by:
            g = g.sort_values(order_by, ascending=False)
        if args.top:
            g = g.head(args.top)
        title = (
            f"{s['model']} quant {s['precision']} batch {s['batch_size']} on {s['device_name']}: "
            f"network {s['network_ms']:.3f} ms = rows {s['layers_ms']:.3f} (their floor "
            f"{_num(s['floor_ms'], 3) if s['floor_ms'] == s['floor_ms'] else 'unknown: no GEMM shapes stored'})"
            + (f" − {s['pairs_saved_ms']:.3f} saved by fused pairs" if s.get("pairs_saved_ms") else "")
            + f" + {s['outside_layers_ms']:.3f} outside them; "
            f"rows {s['tops']:.0f} TOPS, "
            + (
                f"{100 * s['memory_bound_share']:.0f}% of the time memory-bound"
                if s["memory_bound_share"] == s["memory_bound_share"]
                else "bound unknown"
            )
            + "; ceilings: "
            f"{', '.join(sorted(set(g['ceiling']) - {''})) or 'none'}"
        )
        t = Table(title=title, title_justify="left")
        for col in (
            "layer",
            "GEMM M×N×K",
            "tile",
            "µs",
            "share",
            "TOPS",
            "ops/B",
            "roof TOPS",
            "% of roof",
            "headroom µs",
            "bound",
        ):
            t.add_column(col, justify="left" if col in ("layer", "GEMM M×N×K", "tile", "bound") else "right")
        for _, r in g.iterrows():
            t.add_row(
                r["name"] + ("" if r["mode"] == "q" else " (fp16)"),
                r["gemm"],
                r["tile"],
                f"{r['time_s'] * 1e6:.1f}",
                f"{100 * r['share']:.1f}%",
                f"{r['tops']:.0f}",
                _num(r["intensity"]),
                _num(r["attainable_tops"]),
                _pct(r["roof_fraction"]),
                _num(r["headroom_s"] * 1e6, 1),
                r["bound"] or "-",
            )
        console.print(t)


def _num(v: float, digits: int = 0) -> str:
    return "-" if v != v else f"{v:.{digits}f}"


def _pct(v: float) -> str:
    return "-" if v != v else f"{100 * v:.0f}%"
