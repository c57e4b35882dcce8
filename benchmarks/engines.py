"""Per engine and precision: ResNet-50's best images/s (and its batch) and lowest batch-1 latency.

Either measures a sweep now (``--engines``, ``--precisions``, ``--batch-sizes`` on ``--device``) into
``--store``, or, with ``--from-store``, only reads a store that already holds one (e.g. the committed
``results/h100`` engines sweep). Rows whose output failed the correctness check against fp32 are
marked and never counted as a winner.

    python benchmarks/engines.py [--device auto] [--model resnet50] [--batch-sizes 1,32,256]
    python benchmarks/engines.py --from-store results/h100/engines.sqlite
"""

from __future__ import annotations

import argparse
import os
import sys

GPU_ENGINES = "eager,cudagraph,compile,compile-freeze"
CPU_ENGINES = "eager,compile,onnxruntime"


def measure(args: argparse.Namespace) -> str:
    """Run the sweep through deepgap's API; returns the store path."""
    from deepgap import api
    from deepgap.drive.config import SweepSpec, validate

    device = api.resolve_device(args.device)
    cuda = device.startswith("cuda")
    spec = validate(
        SweepSpec(
            models=(args.model,),
            engines=tuple((args.engines or (GPU_ENGINES if cuda else CPU_ENGINES)).split(",")),
            precisions=tuple((args.precisions or ("fp32,tf32,fp16,bf16" if cuda else "fp32")).split(",")),
            batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")),
            memory_formats=tuple(args.memory_formats.split(",")),
            device=device,
            warmup=10,
            iterations=args.iterations,
            repeats=3,
            resolution=args.resolution,
        )
    )
    api.run(spec, store=args.store, on_event=lambda e: None, command=" ".join(sys.argv))
    return args.store


def note(reasons, n_good: int, n_flagged: int) -> str:
    """Why a row has no number, or that flagged measurements (e.g. from before a fix) were left out."""
    why = ", ".join(sorted({str(r) for r in reasons}))[:70]
    if why:
        return why
    if n_flagged:
        return f"{n_flagged} flagged measurement(s) excluded" if n_good else "output flagged vs fp32"
    return ""


def table(store_path: str, model: str) -> list[dict]:
    """One row per (engine, memory format, precision) of ``model`` in the store."""
    from deepgap.store import Store

    s = Store(store_path, readonly=True)
    try:
        df = s.results_frame()
    finally:
        s.close()
    df = df[df["model"] == model]
    rows = []
    for (eng, fmt, prec, dev), g in df.groupby(["engine", "memory_format", "precision", "device_name"]):
        ok = g[g["status"] == "ok"]
        bad = ok[[bool(e.correctness and e.correctness.flagged) for e in ok["extra"]]]
        good = ok.drop(bad.index)
        row = {
            "device": dev,
            "engine": eng,
            "format": fmt,
            "precision": prec,
            "best_ips": None,
            "best_batch": None,
            "bs1_ms": None,
            "bs1_ci_ms": None,
            "note": note(g.loc[g["status"] != "ok", "reason"], len(good), len(bad)),
        }
        if len(good):
            best = good.loc[good["throughput_ips"].idxmax()]
            row.update(best_ips=float(best["throughput_ips"]), best_batch=int(best["batch_size"]))
            one = good[good["batch_size"] == 1]
            if len(one):
                r1 = one.loc[one["latency_median_s"].idxmin()]
                row.update(
                    bs1_ms=r1["latency_median_s"] * 1e3,
                    bs1_ci_ms=(r1["latency_median_ci_low_s"] * 1e3, r1["latency_median_ci_high_s"] * 1e3),
                )
        rows.append(row)
    return sorted(rows, key=lambda r: -(r["best_ips"] or 0))


def render(rows: list[dict]) -> str:
    """A markdown table (best first)."""
    out = [
        "| device | engine | format | precision | best img/s | at batch | batch-1 median ms (95% CI) | note |",
        "|---|---|---|---|---:|---:|---|---|",
    ]
    for r in rows:
        ips = f"{r['best_ips']:,.0f}" if r["best_ips"] else "—"
        bs1 = f"{r['bs1_ms']:.3f} ({r['bs1_ci_ms'][0]:.3f}–{r['bs1_ci_ms'][1]:.3f})" if r["bs1_ms"] else "—"
        out.append(
            f"| {r['device']} | {r['engine']} | {r['format']} | {r['precision']} | {ips} | "
            f"{r['best_batch'] or '—'} | {bs1} | {r['note']} |"
        )
    return "\n".join(out)


def main() -> int:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-store", help="only read this store; measure nothing")
    ap.add_argument("--store", default=os.path.join(os.environ.get("OUT", "."), "engines.sqlite"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--engines", help=f"default {GPU_ENGINES} on a GPU, {CPU_ENGINES} on a CPU")
    ap.add_argument("--precisions", help="default fp32,tf32,fp16,bf16 on a GPU, fp32 on a CPU")
    ap.add_argument("--memory-formats", default="nchw,channels_last")
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--resolution", type=int, default=224)
    args = ap.parse_args()
    store = args.from_store or measure(args)
    rows = table(store, args.model)
    if not rows:
        print(f"no {args.model} results in {store}", file=sys.stderr)
        return 1
    print(f"{args.model}: best images/s and batch-1 latency per engine and precision ({store})")
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
