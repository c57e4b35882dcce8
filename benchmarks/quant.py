"""ResNet-50 on one GPU: the best FP16 engine vs deepgap's quant engine (int8, fp8).

The headline rows — eager fp16, ``compile-freeze`` fp16 (Inductor freezing + reduce-overhead), quant
int8 and quant fp8, all channels_last, at every batch size (256 first: the goal is int8 ≥ 1.4× the
best FP16 engine there) — are measured by deepgap's own run path (`deepgap.run`: worker process,
correctness against fp32, adaptive timing, 95% CIs, p99, energy) into a store (``--store``, default
``<out>/quant.sqlite``), so `deepgap show/report/recommend/compare` read them like any sweep. This
process then adds what a sweep does not: achieved TOPS against ceilings measured here (8192³ fp16
matmul, ``torch._int_mm``, ``torch._scaled_mm``; a device-to-device copy for bandwidth), the ablations
of docs/quant.md (torch path, Triton without per-layer choice, without CUDA graph) timed
in-process with CUDA events, and the per-layer table. quant.json is a side output holding all of it,
the headline rows copied from the store with their result ids. Every ablation is wrapped: a failure
prints its error and the rest still runs; a time budget skips ablations rather than overrun.

    python benchmarks/quant.py [--model resnet50] [--batch-sizes 256,32,1] [--store S] [--out DIR]

Writes the store and quant.json under --out (default $OUT, else ./quant-out); prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
import traceback
from functools import partial

T0 = time.perf_counter()
DEVICE = "cuda"  # --device cpu: a smoke run of this script's logic (torch path, tiny model), not a benchmark


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def time_fn(fn, iters: int, warmup: int) -> list[float]:
    """Per-iteration CUDA-event latencies in seconds (each iteration synchronized)."""
    import torch

    if DEVICE == "cpu":
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e-3)
    return out


def ceilings() -> dict:
    """Measured rates: 8192³ fp16 / int8 / fp8 GEMMs and a 1 GiB device-to-device copy."""
    import torch

    n = 8192
    res: dict = {}
    flop = 2 * n**3

    def run(name, fn, work, unit):
        try:
            med = statistics.median(time_fn(fn, 20, 5))
            res[name] = {"value": work / med / 1e12 if unit != "GB/s" else work / med / 1e9, "unit": unit}
        except Exception as exc:  # noqa: BLE001
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        torch.cuda.empty_cache()

    a = torch.randn(n, n, device="cuda").half()
    b = torch.randn(n, n, device="cuda").half()
    run("fp16_mm_tflops", lambda: a @ b, flop, "TFLOPS")
    ai = torch.randint(-100, 100, (n, n), device="cuda", dtype=torch.int8)
    # column-major B, as for fp8 below: cuBLASLt's int8 tensor-core path wants the "TN" layout; a
    # row-major B measured 130 TOPS on the H100 (2026-11-23) instead of the ~960 the issue quotes
    bi = torch.randint(-100, 100, (n, n), device="cuda", dtype=torch.int8).t()
    run("int8_int_mm_tops", lambda: torch._int_mm(ai, bi), flop, "TOPS")
    af = a.to(torch.float8_e4m3fn)
    bf = b.to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda")
    run(
        "fp8_scaled_mm_tflops",
        lambda: torch._scaled_mm(af, bf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        flop,
        "TFLOPS",
    )
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    run("copy_gbps", lambda: dst.copy_(src), 2 * src.numel(), "GB/s")
    return res


def reference(model, res_px: int, seed: int = 0, k: int = 8):
    """The worker's correctness images (seeded) and their fp32 logits (GPU, TF32 off)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(k, 3, res_px, res_px, generator=g)
    m = copy.deepcopy(model).to(DEVICE)
    with torch.inference_mode():
        y = m(x.to(DEVICE)).float().cpu()
    del m
    return x, y


def inputs(bs: int, ref_x, res_px: int):
    import torch

    g = torch.Generator().manual_seed(1234 + bs)
    x = torch.randn(bs, 3, res_px, res_px, generator=g)
    k = min(bs, ref_x.shape[0])
    x[:k] = ref_x[:k]
    return x, k


def run_variant(
    results: list,
    label: str,
    bs: int,
    make,
    ref_y,
    k: int,
    precision: str,
    macs: float,
    ceiling: float | None,
    iters: int,
) -> dict:
    """Prepare, check and time one variant; never raises."""
    import torch

    from deepgap.measure import correctness

    row: dict = {"variant": label, "batch_size": bs, "precision": precision}
    t = time.perf_counter()
    try:
        fn, extra = make()
        row["setup_s"] = round(time.perf_counter() - t, 2)
        row.update(extra)
        out = fn()[:k].float().cpu()
        row["correctness"] = correctness.compare(out, ref_y[:k], precision).to_dict()
        samples = time_fn(fn, iters, warmup=10)
        med = statistics.median(samples)
        row.update(
            status="ok",
            median_ms=med * 1e3,
            images_per_s=bs / med,
            p10_ms=sorted(samples)[len(samples) // 10] * 1e3,
            n_iterations=len(samples),
        )
        row["achieved_tops"] = 2 * macs * bs / med / 1e12
        if ceiling:
            row["fraction_of_ceiling"] = row["achieved_tops"] / ceiling
        rel, ips = row["correctness"]["rel_l2"], row["images_per_s"]
        log(f"{label:32s} bs{bs:<4d} {ips:10.0f} img/s  rel_l2 {rel:.4f}  setup {row['setup_s']:.1f}s")
    except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
        row.update(
            status="error",
            error=f"{type(exc).__name__}: {exc}"[:1000],
            traceback=traceback.format_exc()[-3000:],
        )
        log(f"{label} bs{bs}: FAILED {row['error'][:300]}")
    finally:
        if DEVICE == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            torch.cuda.empty_cache()
    results.append(row)
    return row


HEADLINE = {"eager": "eager fp16", "compile-freeze": "compile fp16"}  # engine → variant; quant: "quant <p>"


def measure_into_store(args, sizes: list[int], precisions: list[str]) -> tuple[str, list[dict], dict]:
    """The headline variants through `deepgap.run` into ``args.store``; (run id, rows, per-layer tables).

    Runs before this process touches the GPU, so the worker has the device to itself.
    """
    import deepgap
    from deepgap.analysis import prepare
    from deepgap.drive.config import SweepSpec
    from deepgap.store import Store

    engines = ("eager",) + (() if args.no_compile else ("compile-freeze",)) + ("quant",)
    spec = SweepSpec(
        models=(args.model,),
        engines=engines,
        precisions=("fp16", *precisions),
        batch_sizes=tuple(sizes),
        memory_formats=("channels_last",),
        device=DEVICE,
        resolution=args.resolution,
        warmup=10,
        iterations=args.iterations,
        repeats=3,
        target_ci=0.01,
        max_time_s=args.max_time,
        sweeps=args.sweeps,
    )
    log(f"deepgap.run → {args.store}: {', '.join(engines)} × fp16,{','.join(precisions)} × batch {sizes}")
    res = deepgap.run(spec, store=args.store, command="python " + " ".join(sys.argv), log=log)
    store = Store(args.store, readonly=True)
    try:
        df = prepare(store.results_frame([res.run_id]))
    finally:
        store.close()
    rows, layers = [], {}
    for r in df.to_dict("records"):
        prec, bs = r["precision"], int(r["batch_size"])
        row = {
            "variant": HEADLINE.get(r["engine"], f"quant {prec}"),
            "engine": r["engine"],
            "batch_size": bs,
            "precision": prec,
            "sweep": int(r["sweep"]),
            "status": r["status"],
            "run_id": res.run_id,
            "result_id": int(r["result_id"]),
            "source": f"store {args.store}",
        }
        if r["status"] != "ok":
            rows.append({**row, "reason": r["reason"]})
            log(f"{row['variant']:32s} bs{bs:<4d} {r['status']}: {str(r['reason'])[:200]}")
            continue
        extra = r["extra"]  # deepgap.core.result_details.ResultDetails
        num = lambda v: None if v is None or v != v else float(v)  # noqa: E731 - NaN → None for JSON
        row.update(
            images_per_s=r["throughput_ips"],
            images_per_s_ci95=[num(r["throughput_ci_low_ips"]), num(r["throughput_ci_high_ips"])],
            images_per_s_pipelined=num(r["throughput_pipelined_ips"]),
            median_ms=r["latency_median_s"] * 1e3,
            p99_ms=num(r["latency_p99_s"] * 1e3),
            n_iterations=int(r["n_samples"]),
            ci_met=num(r.get("ci_met")),
            setup_s=num(extra.setup_s),
            correctness=extra.correctness.to_json() if extra.correctness else {},
            joules_per_image=num(r["joules_per_image"]),
            ips_per_watt=num(r["ips_per_watt"]),
            mean_power_w=num(r["mean_power_w"]),
        )
        rows.append(row)
        if r["engine"] == "quant":
            layers[f"{prec} bs{bs}"] = (extra.engine_info.layers if extra.engine_info else None) or []
        rel = row["correctness"].get("rel_l2", float("nan"))
        log(
            f"{row['variant']:32s} bs{bs:<4d} {row['images_per_s']:10.0f} img/s  rel_l2 {rel:.4f}  "
            f"p99 {row['p99_ms']:.3f} ms"
        )
    return res.run_id, rows, layers


def make_quant(model, prec, bs, resolution, name, x, holder):
    """Prepare the quant engine's network (kept in ``holder['r']`` for the ablations)."""
    import torch

    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    opts = QuantOptions(log=lambda s: log(f"  quant {prec} bs{bs}: {s}"))
    if DEVICE == "cpu":
        opts.force_backend, opts.autotune, opts.timing_reps, opts.calib_images = "torch", False, 1, 4
    r = prepare_quant(model, prec, bs, resolution, name, device=DEVICE, opts=opts)
    holder["r"] = r
    xd = x.to(DEVICE).half().contiguous(memory_format=torch.channels_last)
    return (lambda: r.run(xd)), {"engine": "deepgap quant", "info": r.info}


ABLATIONS = [  # short label, description, arguments of quant.prepare.variant (no modes: all quantized)
    (
        "1 torch path, eager",
        "stage 1: im2col + _int_mm/_scaled_mm, torch epilogue, all quantized, eager",
        dict(backend="torch", cuda_graph=False),
    ),
    ("2 Triton fused, eager", "stage 2: fused Triton kernels, all quantized, eager", dict(cuda_graph=False)),
    (
        "2+4 Triton fused, graph",
        "stages 2+4: fused Triton kernels, all quantized, CUDA graph",
        dict(cuda_graph=True),
    ),
    (
        "3 per-layer choice, eager",
        "stage 3: per-layer int8/fp16 choice, eager (no CUDA graph)",
        dict(modes="chosen", cuda_graph=False),
    ),
]


def ablate(r, x, prec, bs, ablations, ceiling, common, only: tuple[str, ...] = ()) -> None:
    """Time the same calibrated network with optimisations removed (docs/quant.md's ladder)."""
    import torch

    from deepgap.measure.quant.prepare import variant

    xd = x.to(DEVICE).half().contiguous(memory_format=torch.channels_last)
    chosen = {t["name"]: t["mode"] for t in r.info["layers"]}

    def make(kw):
        kw = {**kw, "modes": chosen} if kw.get("modes") == "chosen" else kw
        run, inf = variant(r, **kw)
        return (lambda: run(xd)), {"engine": "deepgap quant (ablation)", "info": inf}

    for label, description, kw in ABLATIONS:
        if only and label not in only:
            continue
        opts = {**common, "iters": 20}
        name = f"{prec} abl {label}"
        row = run_variant(ablations, name, bs, partial(make, kw), precision=prec, ceiling=ceiling, **opts)
        row["ablation"] = description


def main() -> int:  # noqa: D103, PLR0915
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-sizes", default="256,32,1")
    ap.add_argument("--precisions", default="int8,fp8")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--resolution", type=int, default=224)
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip optional variants past this")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or "quant-out")
    ap.add_argument("--store", help="store the headline rows go to (default <out>/quant.sqlite)")
    ap.add_argument("--sweeps", type=int, default=1, help="passes over the headline grid (default 1)")
    ap.add_argument("--max-time", type=float, default=5.0, help="adaptive s per headline configuration")
    ap.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke-test the script only"
    )
    args = ap.parse_args()
    import torch

    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(
            "unavailable: this benchmark needs a CUDA GPU (--device cpu smoke-tests the script)",
            file=sys.stderr,
        )
        return 2
    import triton

    from deepgap.measure.models.build import build_model

    os.makedirs(args.out, exist_ok=True)
    args.store = args.store or os.path.join(args.out, "quant.sqlite")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    precs = [p for p in args.precisions.split(",") if p]
    run_id, results, layer_tables = measure_into_store(args, sizes, precs)
    from deepgap.measure.quant.fold import conv_macs, resnet_graph

    env = {
        "device": "cpu (smoke test, not a benchmark)",
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    if DEVICE == "cuda":
        torch.backends.cudnn.benchmark = True  # as deepgap's worker does by default
        dev = torch.cuda.get_device_properties(0)
        env.update(device=dev.name, cc=f"{dev.major}.{dev.minor}", sms=dev.multi_processor_count)
    log(f"{env}")
    ceil = ceilings() if DEVICE == "cuda" else {}
    log(f"ceilings {json.dumps(ceil)}")
    model = build_model(args.model, args.resolution, None, 0)
    graph = resnet_graph(model)
    macs_map = conv_macs(graph, args.resolution)
    macs = float(sum(macs_map.values()))
    ref_x, ref_y = reference(model, args.resolution)
    cval = {k: v.get("value") for k, v in ceil.items()}
    ceil_for = {
        "fp16": cval.get("fp16_mm_tflops"),
        "int8": cval.get("int8_int_mm_tops"),
        "fp8": cval.get("fp8_scaled_mm_tflops"),
    }
    for row in results:  # the store's headline rows against this device's ceilings
        if row["status"] == "ok":
            row["achieved_tops"] = 2 * macs * row["batch_size"] / (row["median_ms"] * 1e-3) / 1e12
            if ceil_for.get(row["precision"]):
                row["fraction_of_ceiling"] = row["achieved_tops"] / ceil_for[row["precision"]]
    ablations: list[dict] = []
    for bs in sorted({max(sizes), min(sizes)}, reverse=True):  # ablations, in this process
        x, k = inputs(bs, ref_x, args.resolution)
        iters = max(args.iterations, 50) if bs == 1 else args.iterations
        common = dict(ref_y=ref_y, k=k, macs=macs, iters=iters)
        for prec in precs:
            if time.perf_counter() - T0 > args.budget_s:
                log(f"ablations {prec} bs{bs}: skipped (time budget)")
                continue
            holder: dict = {}
            make = partial(make_quant, model, prec, bs, args.resolution, args.model, x, holder)
            row = run_variant(
                ablations,
                f"quant {prec} (in-process)",
                bs,
                make,
                precision=prec,
                ceiling=ceil_for[prec],
                **common,
            )
            row["ablation"] = "reference: the prepared network, timed in this process like the ladder below"
            r = holder.pop("r", None)
            if r is None:
                continue
            # the largest batch gets the whole ladder; the smallest, what the CUDA graph buys
            only = () if bs == max(sizes) else ("3 per-layer choice, eager",)
            ablate(r, x, prec, bs, ablations, ceil_for[prec], common, only=only)
            del r
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    summary = summarize(results, layer_tables)
    doc = {
        "env": env,
        "ceilings": ceil,
        "model": args.model,
        "resolution": args.resolution,
        "macs_per_image": macs,
        "store": args.store,
        "run_id": run_id,
        "results": results,  # copied from the store (deepgap.run): CIs, p99, energy, correctness
        "ablations": ablations,
        "layers": layer_tables,
        "summary": summary,
        "wall_s": time.perf_counter() - T0,
    }
    path = os.path.join(args.out, "quant.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print_table(doc)
    log(f"wrote {path}")
    return 0


def summarize(results, layer_tables) -> dict:
    """Best FP16 per batch, speed-ups, and the per-layer sums (all-q / all-fp16 / chosen)."""
    out: dict = {"speedup_vs_best_fp16": {}, "layer_sums_ms": {}}
    by_bs: dict = {}
    for r in results:
        if r.get("status") == "ok":
            by_bs.setdefault(r["batch_size"], []).append(r)
    for bs, rows in by_bs.items():
        fp16 = [r for r in rows if r["precision"] == "fp16"]
        if not fp16:
            continue
        best = max(fp16, key=lambda r: r["images_per_s"])
        for r in rows:
            if r["precision"] != "fp16":
                out["speedup_vs_best_fp16"][f"{r['variant']} bs{bs}"] = {
                    "ratio": r["images_per_s"] / best["images_per_s"],
                    "best_fp16": best["variant"],
                }
    for key, layers in layer_tables.items():
        q = sum(t["q_s"] for t in layers if t.get("q_s") is not None)
        h = sum(t["fp16_s"] for t in layers if t.get("fp16_s") is not None)
        ch = sum((t["q_s"] if t["mode"] == "q" else t["fp16_s"]) or 0.0 for t in layers)
        out["layer_sums_ms"][key] = {
            "all_quantized": q * 1e3,
            "all_fp16": h * 1e3,
            "chosen": ch * 1e3,
            "n_quantized": sum(t["mode"] == "q" for t in layers),
            "n_layers": len(layers),
        }
    return out


def print_table(doc) -> None:
    print(
        "\n=== deepgap quant benchmark:",
        doc["model"],
        "on",
        doc["env"]["device"],
        "torch",
        doc["env"]["torch"],
        "triton",
        doc["env"]["triton"],
    )
    print(
        "ceilings:",
        ", ".join(
            f"{k} {v['value']:.0f}" if "value" in v else f"{k} ERR" for k, v in doc["ceilings"].items()
        ),
    )
    head = (
        f"{'bs':>4} {'variant':34s} {'img/s':>9} {'ms':>8} {'TOPS':>6} {'%ceil':>6} {'relL2':>7} {'cos':>7}"
    )
    print(head + f" {'top1':>5} flag")
    for r in doc["results"] + doc["ablations"]:
        if r.get("status") != "ok":
            why = (r.get("error") or r.get("reason", ""))[:90]
            print(f"{r['batch_size']:>4} {r['variant'][:34]:34s} {r.get('status')}: {why}")
            continue
        c = r["correctness"]
        print(
            f"{r['batch_size']:>4} {r['variant'][:34]:34s} {r['images_per_s']:9.0f} {r['median_ms']:8.3f} "
            f"{r['achieved_tops']:6.0f} {100 * r.get('fraction_of_ceiling', 0):5.1f}% {c['rel_l2']:7.4f} "
            f"{c['cosine']:7.4f} {c['top1_agreement']:5.2f} {'FLAG' if c['flagged'] else ''}"
        )
    for key, v in doc["summary"]["speedup_vs_best_fp16"].items():
        print(f"speed-up {key}: {v['ratio']:.2f}x vs {v['best_fp16']}")
    goal = doc["summary"]["speedup_vs_best_fp16"].get("quant int8 bs256")
    if goal:
        verdict = "met" if goal["ratio"] >= 1.4 else "NOT met"
        ratio = f"{goal['ratio']:.2f}× vs {goal['best_fp16']}"
        print(f"GOAL int8 ≥ 1.4× best fp16 at batch 256: {ratio} → {verdict}")
    for key, v in doc["summary"]["layer_sums_ms"].items():
        print(
            f"per-layer sums {key}: all-q {v['all_quantized']:.2f} ms, all-fp16 {v['all_fp16']:.2f} ms, "
            f"chosen {v['chosen']:.2f} ms ({v['n_quantized']}/{v['n_layers']} quantized)"
        )
    largest = max((int(key.rsplit("bs", 1)[1]) for key in doc["layers"]), default=None)
    for key, layers in doc["layers"].items():
        if int(key.rsplit("bs", 1)[1]) != largest:
            continue
        print(
            f"top layers {key} (µs): name, GMAC per batch, quantized, fp16, choice, tile, TOPS of the choice"
        )
        top = sorted(layers, key=lambda t: -((t["q_s"] if t["mode"] == "q" else t["fp16_s"]) or 0))[:10]
        for t in top:
            chosen = t["q_s"] if t["mode"] == "q" else t["fp16_s"]
            qs = f"{t['q_s'] * 1e6:8.1f}" if t.get("q_s") else "     n/a"
            hs = f"{t['fp16_s'] * 1e6:8.1f}" if t.get("fp16_s") else "     n/a"
            tops = 2 * t["macs"] / chosen / 1e12 if chosen else 0
            err = f"  err: {t['q_error'][:60]}" if t.get("q_error") else ""
            print(
                f"  {t['name']:22s} {t['macs'] / 1e9:7.2f} {qs} {hs} {t['mode']:>4} {t.get('config')!s:18s}"
                f" {tops:6.0f}{err}"
            )


if __name__ == "__main__":
    sys.exit(main())
