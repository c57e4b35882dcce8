"""Does deepgap's harness cost anything? Its throughput vs a minimal standalone CUDA-event loop.

Same model (built by deepgap's registry: identical weights), batch, precision (fp16; fp32 on a CPU),
layout and host settings (``torch.set_num_interop_threads(1)``, as deepgap's worker) on the same
device. The comparison is made in ``--rounds`` interleaved rounds, each a fresh standalone process
and a fresh deepgap run, their order alternating (ABBA) so that drift cancels; per batch size the
result is the median of the per-round ratios deepgap / standalone with a 95% bootstrap CI. Why
rounds: at batches where eager execution is bound by Python's kernel launches, one process's
throughput differs from the next one's by more than the 2% goal (measured on the H100: ResNet-50
batch 1, 240.6 vs 187.4 img/s in two fresh processes), so a single pair of runs cannot decide.

Verdict per batch: ``agree`` when the CI lies within ±2%, ``differ`` when it lies outside, else
``undecided`` (more rounds needed). For information, one standalone run with the default host
threads (not deepgap's interop=1) is also reported.

The JSON is rewritten after every round (``"complete": false`` until the last), so a run stopped
by a time limit keeps the rounds it finished; ``--continue`` adds rounds to the file's earlier ones
(same model, precision, iterations and batch sizes) until the verdict is decided.

    python benchmarks/harness_overhead.py [--batch-sizes 1,32,256] [--rounds 6] [--iterations 100] [--out DIR]
                                          [--continue]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import numpy as np

import deepgap
from deepgap.config import SweepSpec
from deepgap.stats import bootstrap_ci

TOLERANCE = 0.02


def standalone(model_name: str, bs: int, iterations: int, warmup: int, device: str = "cuda") -> float:
    """Images/s = bs / median latency of a bare loop (CUDA events on a GPU, perf_counter on a CPU)."""
    import time

    import torch

    from deepgap.models import build_model, resolve_model

    res = resolve_model(model_name).default_resolution
    model = build_model(model_name, res)
    x = torch.randn(bs, 3, res, res)
    times = []
    with torch.inference_mode():
        if device == "cpu":  # fp32, perf_counter: a smoke path for machines without a GPU
            for _ in range(warmup):
                model(x)
            for _ in range(iterations):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
            return bs / statistics.median(times)
        torch.backends.cudnn.benchmark = True
        model, x = model.to(device).half(), x.to(device).half()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(warmup):
            model(x)
        torch.cuda.synchronize()
        for _ in range(iterations):
            start.record()
            model(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
    return bs / statistics.median(times)


def _child(conn, model_name, sizes, iterations, interop1, device, warmup):
    try:
        if interop1:  # once per process, before any parallel work (torch refuses it later)
            import torch

            torch.set_num_interop_threads(1)
        conn.send(("ready", {bs: standalone(model_name, bs, iterations, warmup, device) for bs in sizes}))
    except BaseException as exc:  # report, never leave the parent waiting
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def in_fresh_process(model_name: str, sizes: list[int], iterations: int, interop1: bool, device: str,
                     warmup: int) -> dict[int, float]:
    """The bare loop in a fresh spawned process, started as deepgap starts its workers (`WorkerHandle`)."""
    from deepgap.runner import WorkerHandle

    handle = WorkerHandle(device)
    try:  # a child that dies or hangs raises WorkerLost
        kind, out = handle.spawn(_child, (model_name, sizes, iterations, interop1, device, warmup),
                                 "deepgap-standalone-loop", 600)
    finally:
        handle.stop()
    if kind != "ready":
        raise RuntimeError(f"standalone loop failed: {out}")
    return out


def verdict(low: float, high: float, tol: float = TOLERANCE) -> str:
    """``agree`` (CI inside ±tol), ``differ`` (CI outside), else ``undecided``."""
    if 1 - tol <= low and high <= 1 + tol:
        return "agree"
    if high < 1 - tol or low > 1 + tol:
        return "differ"
    return "undecided"


def summarize(sizes: list[int], rounds: list[dict]) -> list[dict]:
    """Per batch: median per-round ratio deepgap / standalone, its 95% CI and the verdict."""
    rows = []
    for bs in sizes:
        ratios = np.array([r["deepgap"][bs] / r["standalone"][bs] for r in rounds])
        low, high = bootstrap_ci(ratios)
        med = float(np.median(ratios))
        rows.append({"batch_size": bs, "rounds": len(ratios), "ratio_median": med, "ratio_ci": [low, high],
                     "difference_pct": 100 * (med - 1), "verdict": verdict(low, high),
                     "standalone_ips": [r["standalone"][bs] for r in rounds],
                     "deepgap_ips": [r["deepgap"][bs] for r in rounds]})
    return rows


def load_rounds(path: str, settings: dict) -> list[dict]:
    """The rounds of an earlier run in ``path`` (JSON keys back to ints); its settings must match."""
    with open(path) as fh:
        old = json.load(fh)
    differ = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if differ:
        raise SystemExit(f"error: {path} was measured with other settings {differ}; "
                         "use another --out or the same settings")
    return [{k: ({int(b): v for b, v in r[k].items()} if isinstance(r[k], dict) else r[k]) for k in r}
            for r in old.get("round_data", [])]


def save(path: str, settings: dict, rounds: list[dict], sizes: list[int], complete: bool,
         default_threads: dict | None, device_name: str) -> None:
    """Write everything measured so far (atomically: a kill mid-write leaves the previous file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({**settings, "rounds": len(rounds), "complete": complete, "tolerance": TOLERANCE,
                   "rows": summarize(sizes, rounds) if rounds else [], "round_data": rounds,
                   "default_threads_loop_ips": default_threads, "env": device_name}, fh, indent=1)
    os.replace(tmp, path)


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--rounds", type=int, default=6, help="rounds to run now")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (the real check) or cpu (a smoke test, fp32)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--continue", dest="cont", action="store_true",
                    help="add the rounds to those already in OUT/harness_overhead.json")
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    store = os.path.join(tempfile.mkdtemp(), "overhead.sqlite")
    precision = "fp16" if args.device.startswith("cuda") else "fp32"
    settings = {"model": args.model, "precision": precision, "iterations": args.iterations,
                "batch_sizes": sizes}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "harness_overhead.json")
    rounds = load_rounds(path, settings) if args.cont and os.path.exists(path) else []
    spec = SweepSpec(models=(args.model,), precisions=(precision,), batch_sizes=tuple(sizes), device=args.device,
                     warmup=args.warmup, iterations=args.iterations, repeats=1, idle_s=0.0)

    def bare(interop1: bool = True) -> dict[int, float]:
        return in_fresh_process(args.model, sizes, args.iterations, interop1, args.device, args.warmup)

    device_name = args.device

    def harness() -> dict[int, float]:
        nonlocal device_name
        res = deepgap.run(spec, store=store, on_event=lambda e: None)
        device_name = str(res.to_pandas()["device_name"].iloc[0])
        return {r.spec.batch_size: r.throughput_ips for r in res.results}

    total = len(rounds) + args.rounds
    for i in range(len(rounds), total):
        order = ("standalone", "deepgap") if i % 2 == 0 else ("deepgap", "standalone")
        got: dict = {name: (bare() if name == "standalone" else harness()) for name in order}
        got["order"] = " then ".join(order)
        rounds.append(got)
        save(path, settings, rounds, sizes, False, None, device_name)
        d, a = got["deepgap"], got["standalone"]
        cells = ", ".join(f"bs{bs} {d[bs]:,.1f}/{a[bs]:,.1f} = {d[bs] / a[bs]:.3f}" for bs in sizes)
        print(f"round {i + 1}/{total} ({got['order']}): {cells}", flush=True)
    default_threads = bare(interop1=False)
    rows = summarize(sizes, rounds)
    print(f"{'batch':>6} {'standalone img/s':>17} {'deepgap img/s':>14} {'ratio':>7} {'95% CI':>17} "
          f"{'verdict (±2%)':>14} {'default-threads loop':>21}")
    for row in rows:
        lo, hi = row["ratio_ci"]
        print(f"{row['batch_size']:>6} {statistics.median(row['standalone_ips']):>17,.1f} "
              f"{statistics.median(row['deepgap_ips']):>14,.1f} {row['ratio_median']:>7.4f} "
              f"{f'[{lo:.4f}, {hi:.4f}]':>17} {row['verdict']:>14} {default_threads[row['batch_size']]:>21,.1f}")
    save(path, settings, rounds, sizes, True, default_threads, device_name)


if __name__ == "__main__":
    main()
