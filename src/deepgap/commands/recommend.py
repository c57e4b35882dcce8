"""``deepgap recommend``: the best configuration per model under a P99 SLO and a memory cap.

Exit status: 0 when every model has a recommendation, 1 when some model has none (the output then
says "none meets the constraint" and names the closest miss), 2 for bad input. A store with decode rows
also gets the answer for decoders (`deepgap.commands.decode_view.answer_lines`: per device and model the
highest output tokens/s, the lowest TPOT, the most tokens per joule, and the GPU against its host CPU).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict

from deepgap.commands.filter_flags import (
    add_filter_flags,
    add_run_flag,
    add_store_argument,
    keep_named,
    named,
)
from deepgap.core.precision import is_quantized, quantized_names

NAME = "recommend"
HELP = "best (device, engine, precision, batch) per model under --slo-p99 / --max-memory, with the evidence"
ORDER = 6


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    p.add_argument(
        "--slo-p99",
        metavar="DURATION",
        help="latency tail per batch at most this, e.g. 10ms (a p99 where n supports it, else the max of n)",
    )
    p.add_argument(
        "--max-memory", metavar="SIZE", help="memory at most this, e.g. 8GiB (device-wide where stored)"
    )
    p.add_argument("--objective", default="throughput", help="throughput (default) | latency | joules")
    add_filter_flags(p, "model", "precision", "engine", several=True)
    add_run_flag(p)
    p.add_argument(
        "--min-accuracy",
        metavar="PCT",
        help=f"top-1 relative to fp32 at least this, or off, e.g. 99%% (default: 99%% for "
        f"{'/'.join(quantized_names())}, MLPerf's rule)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _line(ev: dict) -> str:
    from deepgap.render.formatting import fmt_ci, fmt_gib, fmt_ips, fmt_ms, fmt_num
    from deepgap.render.units import IMAGE, of_seq_lens

    u = of_seq_lens([ev.get("seq_len")]) if ev.get("seq_len") else IMAGE  # seq/s, not images/s, for text
    tokens = f" ({fmt_ips(ev.get('tokens_per_s'))} tokens/s)" if u.kind == "text" else ""
    parts = [
        f"{fmt_ips(ev['throughput_ips'])} {u.rate}{tokens} {fmt_ci(*ev['throughput_ci_ips'])}",
        f"median {_median(ev, u)}",
        f"tail {fmt_ms(ev['latency_tail_s'])} ms: {ev['latency_tail']}",
        f"memory {fmt_gib(ev['memory_bytes'])} GiB ({ev['memory_metric']})",
    ]
    if ev.get("top1") is not None:
        rel = f", {100 * ev['top1_relative']:.1f}% of fp32" if ev.get("top1_relative") is not None else ""
        parts.append(f"top-1 {100 * ev['top1']:.2f}%{rel}")
    if ev.get("joules_per_image") is not None:
        parts.append(f"{fmt_num(ev['joules_per_image'] * 1e3)} mJ/{u.item}")
    if ev.get("joules_per_token") is not None:
        parts.append(f"{fmt_num(ev['joules_per_token'] * 1e3)} mJ/token")
    if is_quantized(ev.get("precision")):  # a quantized choice shows what it gives up
        parts.append(f"accuracy {ev['accuracy']}")
    parts.append(f"{ev['n_measurements']} measurement(s), run {', '.join(ev['run_ids'])}")
    if ev["warnings"]:
        parts.append("warning: " + ", ".join(ev["warnings"]))
    return "; ".join(parts)


def _median(ev: dict, u) -> str:
    """The median of one forward: a batch's, worded per item where the batch is above 1."""
    from deepgap.core.wording import latency_words

    spec = (".3f", ".4f") if u.kind == "text" else (".3g", ".3g")  # an image row's as `fmt_ms` writes it
    return latency_words(ev["latency_median_s"], int(ev.get("batch_size") or 1), u.item, spec)


def _finite(obj):
    """NaN/inf → None, recursively (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.analysis.recommend import check_objective, parse_bytes, parse_duration_s

    objective = check_objective(args.objective)
    slo = parse_duration_s(args.slo_p99) if args.slo_p99 is not None else None
    mem = parse_bytes(args.max_memory) if args.max_memory is not None else None
    from deepgap.analysis.accuracy import parse_min_accuracy, reflag
    from deepgap.analysis.tails import P99_MIN_N

    min_acc = parse_min_accuracy(args.min_accuracy) if args.min_accuracy is not None else None
    from deepgap.analysis import aggregate, prepare
    from deepgap.analysis.decode_answer import decode_answers
    from deepgap.analysis.decode_section import read_table
    from deepgap.analysis.recommend import OBJECTIVES, recommend
    from deepgap.core.errors import UsageError
    from deepgap.store import Store

    store = Store(args.store, readonly=True)
    try:
        known = {r["run_id"] for r in store.runs()}
        for rid in args.run or []:
            if rid not in known:
                raise UsageError(f"no run {rid!r} in {args.store}", "list runs with `deepgap show --runs`")
        agg = aggregate(reflag(prepare(store.results_frame(args.run)), min_acc), samples=store.samples)
        dec = _select_decode(read_table(store, args.run), args)
    finally:
        store.close()
    agg = _select(agg, args)
    recs = recommend(agg, objective, slo, mem)
    answers = decode_answers(dec)
    ok = (
        bool(recs or answers)
        and all(r.choice for r in recs)
        and all(a.choice.get("throughput") for a in answers)
    )
    if args.json:
        out = [asdict(r) for r in recs] + [_decode_json(a) for a in answers]
        print(json.dumps(_finite(out), indent=1, default=str))
        return 0 if ok else 1
    if answers and (slo or mem):
        print(
            "note: --slo-p99 and --max-memory apply to forward rows; a decoder's TPOT and TTFT SLO is "
            "deepgap plan --target-tok-s N --tpot-slo 100ms --ttft-slo 2s"
        )
    if not recs and not answers and _serve_only(args):  # a serve store: its answer is a capacity
        return 1
    if not recs and answers:  # a decode store: the decoders' answer only
        from deepgap.commands.decode_view import answer_lines

        print("\n".join(answer_lines(dec)))
        return 0 if ok else 1
    cons = [
        f"tail ≤ {slo * 1e3:g} ms (a p99 where ≥ {P99_MIN_N} samples support it, else the max of n)"
        if slo
        else "",
        f"memory ≤ {mem / 2**30:.3g} GiB" if mem else "",
        _accuracy_bar(min_acc),
    ]
    from deepgap.render.units import of_frame

    units = of_frame(agg)  # "highest seq/s", "fewest joules per sequence" for text models
    goal = units.header(OBJECTIVES[objective])
    cons = [units.header(c) for c in cons]  # a text model's bar is its output agreement, not top-1
    print(f"objective: {goal}; constraints: {', '.join(c for c in cons if c) or 'none'}")
    if not recs:
        print("none: the selection holds no successful measurement")
        return 1
    from deepgap.measure.models.inputs import is_text

    for r in recs:
        size = f"seq {r.resolution}" if is_text(r.model) else f"{r.resolution}px"  # a text model's length
        print(f"\n{r.model} ({size}): ", end="")
        _print_one(r)
    if answers:
        from deepgap.commands.decode_view import answer_lines

        print("\n" + "\n".join(answer_lines(dec)))
    return 0 if ok else 1


def _serve_only(args: argparse.Namespace) -> bool:
    """Whether the store holds serve runs though no forward or decode row: then say where their answer is."""
    from deepgap.serving.show.tables import any_serving
    from deepgap.store import Store

    store = Store(args.store, readonly=True)
    try:
        if not any_serving(store):
            return False
    finally:
        store.close()
    print(
        f"none: {args.store} holds serve runs, no forward or decode measurement to rank; their levels and "
        f"capacities: deepgap show {args.store}; devices for a load at an SLO: deepgap plan {args.store} "
        "--model M --qps N --slo-p99 15ms"
    )
    return True


def _select_decode(tab, args: argparse.Namespace):
    """The decode rows of the models, precisions and engines asked for (the forward rows' filters)."""
    return keep_named(tab, args, ("model", "precision", "engine"))


def _decode_json(a) -> dict:
    """One decode answer as JSON: each goal's configuration and figures, or why there is none."""
    from deepgap.analysis.decode_answer import GOALS, short

    keep = (
        "output_tokens_per_s",
        "decode_tokens_per_s",
        "tpot_median_ms",
        "tpot_tail_ms",
        "joules_per_token",
    )
    return {
        "workload": "decode",
        "platform": a.platform,
        "model": a.model,
        "input_len": a.input_len,
        "output_len": a.output_len,
        "choice": {
            g: ({"configuration": short(r), **{k: r.get(k) for k in keep}} if r is not None else None)
            for g, r in a.choice.items()
        },
        "objectives": {g: GOALS[g][2] for g in a.choice},
        "missing": a.missing,
        "excluded": a.excluded,
    }


def _select(agg, args: argparse.Namespace):
    """The rows of the models, precisions and engines asked for; a name not in the store is bad input."""
    from deepgap.core.errors import UsageError

    for col, text in (("model", args.model), ("precision", args.precision), ("engine", args.engine)):
        if text and len(agg):
            wanted = named(text)
            if not wanted:
                raise UsageError(f"--{col} {text!r} names nothing", f"pass e.g. --{col} {agg[col].iloc[0]}")
            unknown = [t for t in wanted if t not in set(agg[col])]
            if unknown:  # a typo is bad input, not "nothing meets the constraints" (exit 1)
                raise UsageError(
                    f"--{col} {unknown[0]!r} is not in {args.store}",
                    f"pass one of: {', '.join(sorted(set(map(str, agg[col]))))}",
                )
            agg = agg[agg[col].isin(wanted)]
    return agg


def _accuracy_bar(min_acc: float | None) -> str:
    """The accuracy constraint as printed: off, the --min-accuracy bar, or the default for quantized runs."""
    if min_acc == 0:
        return "no accuracy bar (--min-accuracy off); outputs within each precision's relL2/cosine bounds"
    bar = (
        f"top-1 ≥ {100 * min_acc:g}% of fp32"
        if min_acc
        else f"top-1 ≥ 99% of fp32 for {'/'.join(quantized_names())}"
    )
    return (
        f"{bar} (from --dataset, or from a top-1 agreement with trained weights whose 95% interval "
        "excludes it); outputs within each precision's relL2/cosine bounds"
    )


def _print_one(r) -> None:
    """One model's recommendation: the choice and its runner-up, or why none and the closest miss."""
    if r.choice:
        print(f"{r.choice['configuration']}\n  evidence: {_line(r.choice)}")
        if r.runner_up:
            print(f"  runner-up: {r.runner_up['configuration']}: {_line(r.runner_up)}")
    else:
        print(r.reason)
        if r.closest_miss:
            print(
                f"  closest miss: {r.closest_miss['configuration']}: {'; '.join(r.misses)}\n"
                f"  its evidence: {_line(r.closest_miss)}"
            )
    excl = ", ".join(f"{n} {why}" for why, n in r.excluded.items())
    print(f"  {r.considered} candidate(s) checked" + (f"; excluded: {excl}" if excl else ""))
