"""Which chained 1×1 convolutions run as one fused kernel (`quant.pair`): found in the network, timed, kept if faster.

Why timed per network: on one H200 (session 28, results/h200/session28) the fused pair of layer1 at batch 1024
took 644 µs against the two layers' best tiles' 1,020 µs (fp8), but at batch 1 it took about twice as long
as the two (12 µs against 6): a layer of 3,136 rows leaves most SMs idle there. So each eligible pair is checked
against the exact reference and timed in every tile `pair.pair_configs` offers, and kept only where it beats
the sum of the two layers' own tuned times (`tuning.time_layer`'s ``q_s``) by `MARGIN`.

``DEEPGAP_QUANT_PAIRS=off`` offers none (the network as before); pairs are offered on Hopper-class GPUs (the
kernel's TMA descriptors) and are not in the tuning cache: each process times them again (a few ms each).
"""

from __future__ import annotations

from typing import Any

from deepgap.core import switches
from deepgap.measure.quant import pair
from deepgap.measure.quant.network import QuantNet

MARGIN = 0.02  # a pair is kept when it takes at most 98% of the two layers' time
ENV = "DEEPGAP_QUANT_PAIRS"


def pairs_offered() -> bool:
    """Whether fused pairs are offered: ``DEEPGAP_QUANT_PAIRS`` 'on' (the default) or 'off' (`core.switches`).

    'off' times the engine as before session 28, each layer its own kernel; a bad value is a `UsageError`.
    """
    return switches.read(ENV) == "on"


def eligible(net: QuantNet) -> list[tuple[str, str]]:
    """(first, second) convolutions that `pair.run` can fuse, in network order.

    Both quantized, 1×1, stride 1; ``second`` reads ``first``'s output as it is stored (no conversion between)
    and has no residual; each convolution in one pair at most; a tile of `pair.pair_configs` fits the shapes.
    """
    out: list[tuple[str, str]] = []
    used: set[str] = set()
    for name, a in net.convs.items():
        if name in used or a.mode != "q" or not a.node.pointwise or a.out_fmt not in ("int8", "fp8"):
            continue
        for other, b in net.convs.items():
            n = b.node
            if (
                other not in used
                and other != name
                and n.inp == a.node.out
                and b.mode == "q"
                and n.pointwise
                and n.residual is None
                and b.in_fmt == a.out_fmt
                and pair.pair_configs(a.node.cin, a.node.cout, n.cout, a.out_fmt)
            ):
                out.append((name, other))
                used |= {name, other}
                break
    return out


def choose_pairs(net: QuantNet, batch: int, timings: list, reps: int = 10) -> list[dict[str, Any]]:
    """Time each eligible pair against its two layers' tuned times; record the winners in ``net.pairs``.

    Returns one dict per eligible pair (engine_info's ``pairs``): the two names, their separate seconds,
    each tile's seconds or why it failed its check, and the tile kept (None: the two run separately).
    """
    by_name = {t.name: t for t in timings}
    rows = []
    for first, second in eligible(net):
        t1, t2 = by_name.get(first), by_name.get(second)
        if t1 is None or t2 is None or t1.q_s is None or t2.q_s is None:
            continue
        separate = t1.q_s + t2.q_s
        seconds, best = _time_pair(net, first, second, batch, reps)
        kept = best is not None and best[0] <= separate * (1 - MARGIN)
        if kept:
            net.pairs[first] = (second, best[1])
        rows.append(
            {
                "first": first,
                "second": second,
                "separate_s": separate,
                "seconds": seconds,
                "kept": best[1].label if kept else None,
                "pair_s": best[0] if kept else None,
            }
        )
    return rows


def label_layers(timings: list, rows: list[dict[str, Any]]) -> None:
    """Name each kept pair in its two layers' tile text, where the per-layer table shows it.

    A paired layer's time stays its time alone (its own tuned tile): the table's rows are each kernel against
    its roof. The tile text says that the network runs it fused, in which tile, and the pair's time for both.
    """
    by_name = {t.name: t for t in timings}
    for row in rows:
        if row["kept"] is None:
            continue
        first, second = by_name[row["first"]], by_name[row["second"]]
        ms = row["pair_s"] * 1e3
        first.config = (
            f"{first.config} (alone); runs fused with {row['second']}: {row['kept']}, {ms:.3f} ms both"
        )
        second.config = f"{second.config} (alone); runs fused in {row['first']}'s pair"


def _time_pair(net: QuantNet, first: str, second: str, batch: int, reps: int):
    """({tile label: seconds or why it failed}, (seconds, tile) of the fastest or None) of one pair at ``batch``.

    Each tile is checked on `tuning.CHECK_BATCH` images against the exact reference first, then for the same
    bits from two runs of the whole batch (`tuning.checked_time`'s ``same``), then timed on it (CUDA-graph
    median, as every layer is).
    """
    from deepgap.measure.quant.tuning import CHECK_BATCH, _agree, checked_time, rand_act

    a, b = net.convs[first], net.convs[second]
    h, w, _ = net.shapes[a.node.out]
    dev = a.w_q.device
    x = rand_act(batch * h * w, a.node.cin, a.in_fmt, dev)
    res = rand_act(batch * h * w, a.node.cout, a.res_fmt, dev) if a.node.residual else None
    rows = min(CHECK_BATCH, batch) * h * w
    xs, rs = x[:rows], None if res is None else res[:rows]
    t_ref, u_ref = pair.reference(a, b, xs, rs)
    seconds: dict[str, float | str] = {}
    best: tuple[float, Any] | None = None
    for cfg in pair.pair_configs(a.node.cin, a.node.cout, b.node.cout, a.out_fmt):

        def check(cfg=cfg) -> str | None:
            t, u = pair.run(a, b, xs, rs, cfg)
            return _agree(t, t_ref, a.out_fmt) or _agree(u, u_ref, b.out_fmt)

        got = checked_time(check, lambda cfg=cfg: pair.run(a, b, x, res, cfg), reps, dev, same=True)
        seconds[cfg.label] = got
        if not isinstance(got, str) and (best is None or got < best[0]):
            best = (got, cfg)
    return seconds, best
