"""Does deepgap's harness cost anything? Its throughput vs a minimal standalone CUDA-event loop.

Same model (ResNet-50, random weights), batch, precision (fp16) and layout on the same GPU, in one
run. The standalone loop runs in a fresh spawned process (as deepgap's worker does), before and after
deepgap (bracketing any drift); the comparison uses their mean. For information it is also run with
``torch.set_num_interop_threads(1)`` (deepgap's setting) and inside this benchmark's own process. Goal: agreement within 2% at batch 1, 32 and 256.

    python benchmarks/harness_overhead.py [--batch-sizes 1,32,256] [--iterations 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import deepgap
from deepgap.config import SweepSpec


def standalone(model_name: str, bs: int, iterations: int, warmup: int, interop1: bool = False,
               device: str = "cuda") -> float:
    """Images/s = bs / median latency of a bare loop: event, forward, event, synchronize."""
    import time

    import torch
    from torchvision import models

    if device == "cpu":  # a smoke path for machines without a GPU: fp32, perf_counter
        torch.manual_seed(0)
        model = models.get_model(model_name, weights=None).eval()
        x = torch.randn(bs, 3, 224, 224)
        with torch.inference_mode():
            for _ in range(warmup):
                model(x)
            times = []
            for _ in range(iterations):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
        return bs / statistics.median(times)

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = models.get_model(model_name, weights=None).eval().cuda().half()
    x = torch.randn(bs, 3, 224, 224, device="cuda").half()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        torch.cuda.synchronize()
        for _ in range(iterations):
            start.record()
            model(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
    del model, x
    torch.cuda.empty_cache()
    return bs / statistics.median(times)


def _child(conn, model_name, sizes, iterations, interop1, device, warmup):
    try:
        if interop1:  # once per process, before any parallel work (torch refuses it later)
            import torch

            torch.set_num_interop_threads(1)
        conn.send({bs: standalone(model_name, bs, iterations, warmup, interop1, device) for bs in sizes})
    except BaseException as exc:  # report, never leave the parent waiting
        conn.send(f"{type(exc).__name__}: {exc}")


def in_fresh_process(model_name: str, sizes: list[int], iterations: int, interop1: bool, device: str,
                     warmup: int) -> dict[int, float]:
    """The same bare loop in a fresh spawned process (the isolation deepgap's worker has)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child, args=(child, model_name, sizes, iterations, interop1, device, warmup))
    p.start()
    child.close()  # so a dead child gives EOF instead of a hang
    if not parent.poll(600):
        p.kill()
        raise RuntimeError("standalone loop gave no answer in 600 s")
    out = parent.recv()
    p.join()
    if isinstance(out, str):
        raise RuntimeError(f"standalone loop failed: {out}")
    return out


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (the real check) or cpu (a smoke test, fp32)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    store = os.path.join(tempfile.mkdtemp(), "overhead.sqlite")
    run = lambda interop1: in_fresh_process(args.model, sizes, args.iterations, interop1, args.device, args.warmup)
    print("standalone loop (fresh process) ...", flush=True)
    before = run(False)
    fresh_interop1 = run(True)
    precision = "fp16" if args.device == "cuda" else "fp32"
    spec = SweepSpec(models=(args.model,), precisions=(precision,), batch_sizes=tuple(sizes), device=args.device,
                     warmup=args.warmup, iterations=args.iterations // 2, repeats=2)
    print("deepgap ...", flush=True)
    res = deepgap.run(spec, store=store)
    print("standalone loop again ...", flush=True)
    after = run(False)
    in_main = {bs: standalone(args.model, bs, args.iterations, args.warmup, False, args.device) for bs in sizes}
    rows = []
    for r in res.results:
        bs = r.spec.batch_size
        ref = (before[bs] + after[bs]) / 2
        rows.append({"batch_size": bs, "standalone_before_ips": before[bs], "standalone_after_ips": after[bs],
                     "standalone_interop1_ips": fresh_interop1[bs], "standalone_in_parent_process_ips": in_main[bs],
                     "deepgap_ips": r.throughput_ips, "deepgap_pipelined_ips": r.throughput_pipelined_ips,
                     "difference_pct": 100 * (r.throughput_ips / ref - 1), "status": r.status.value})
    print(f"{'batch':>6} {'standalone img/s':>18} {'deepgap img/s':>15} {'diff %':>8} {'pipelined img/s':>16} within 2%"
          f" {'interop=1 img/s':>16} {'parent-process img/s':>21}")
    for row in rows:
        sa = (row["standalone_before_ips"] + row["standalone_after_ips"]) / 2
        ok = abs(row["difference_pct"]) <= 2.0
        print(f"{row['batch_size']:>6} {sa:>18,.1f} {row['deepgap_ips']:>15,.1f} {row['difference_pct']:>+8.2f} "
              f"{row['deepgap_pipelined_ips']:>16,.1f} {'yes' if ok else 'NO':>9} {row['standalone_interop1_ips']:>16,.1f}"
              f" {row['standalone_in_parent_process_ips']:>21,.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "harness_overhead.json"), "w") as fh:
        json.dump({"model": args.model, "precision": precision, "rows": rows, "env": res.to_pandas()["device_name"].iloc[0]},
                  fh, indent=1)


if __name__ == "__main__":
    main()
