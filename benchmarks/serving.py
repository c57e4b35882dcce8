"""ResNet-50 serving on the current device: capacity at a p99 SLO vs offline throughput, predicted vs measured.

Runs ``deepgap serve`` into one store, each in its own process as a user would: offline (best batch,
with ``--loadgen`` also LoadGen's Offline), server ``--find-capacity`` at p99 ≤ ``--slo`` (MLPerf's
ResNet-50 server bound is 15 ms; with ``--loadgen`` LoadGen's Server at the capacity found), optionally
single-stream and, with ``--tenants``, a multi-tenant interference run. "Engine alone" is the engine on
device-resident inputs, back to back, measured in the serving worker's calibration: a sweep's number.
Prints the ratios the serving issue sets goals for (on the H100: serve's offline / engine ≥ 0.95,
capacity / engine ≥ 0.85, measured / predicted capacity within 5%, LoadGen's verdict at the capacity).

    python benchmarks/serving.py [--engine quant] [--precision int8] [--batch-sizes 1,...,256] [--slo 15ms]
        [--loadgen] [--single-stream] [--tenants resnet50,resnet18,vit_b_16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def serve(args: argparse.Namespace, *extra: str) -> dict:
    """One ``deepgap serve --json`` run; its headline numbers (a failed run says why and returns {})."""
    cmd = [
        sys.executable,
        "-m",
        "deepgap",
        "serve",
        "--model",
        args.model,
        "--engine",
        args.engine,
        "--precision",
        args.precision,
        "--memory-format",
        args.memory_format,
        "--device",
        args.device,
        "--store",
        args.store,
        "--json",
        *(["--batch-sizes", args.batch_sizes] if args.batch_sizes else []),
        *(["--loadgen"] if args.loadgen and "--tenants" not in extra else []),
        *args.serve_args.split(),
        *extra,
    ]
    print("$", " ".join(cmd[2:]), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        print(f"  failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return {}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out.get("status") not in (None, "ok"):
        print(f"  {out.get('status')}: {out.get('reason')}", file=sys.stderr)
    return out


def main() -> int:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--engine", default="cudagraph")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--memory-format", default="channels_last")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--slo", default="15ms")
    ap.add_argument("--tenants", default="", help="e.g. resnet50,resnet18,vit_b_16 (empty: no tenant run)")
    ap.add_argument("--batch-sizes", default="", help="batch sizes to prepare (default: deepgap serve's)")
    ap.add_argument("--loadgen", action="store_true", help="also drive each scenario with MLCommons LoadGen")
    ap.add_argument("--single-stream", action="store_true", help="also run the single-stream scenario")
    ap.add_argument(
        "--serve-args", default="", help="extra flags for every deepgap serve, e.g. '--min-duration 1s'"
    )
    ap.add_argument("--store", default=os.path.join(os.environ.get("OUT", "."), "serving.sqlite"))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "serving.json"))
    args = ap.parse_args()

    res = {
        "single_stream": serve(args, "--scenario", "single-stream") if args.single_stream else {},
        "offline": serve(args, "--scenario", "offline"),
        "server": serve(args, "--scenario", "server", "--find-capacity", "--slo-p99", args.slo),
    }
    if args.tenants:
        res["tenants"] = serve(args, "--scenario", "server", "--tenants", args.tenants, "--slo-p99", args.slo)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2, default=str)

    ss, off, srv = res["single_stream"], res["offline"], res["server"]
    cap, pred, ips = srv.get("capacity_qps"), srv.get("capacity_predicted_qps"), off.get("offline_ips")
    print(
        f"{args.model} {args.engine} {args.precision} {args.memory_format}, p99 SLO {args.slo} ({args.store})"
    )
    print("| metric | value |\n|---|---:|")
    if ss.get("single_stream_p90_s"):
        print(f"| single-stream p90 latency (ms) | {ss['single_stream_p90_s'] * 1e3:.3f} |")
    eng = off.get("engine_ips") or srv.get("engine_ips")
    if eng:
        print(
            f"| engine alone, device-resident inputs (img/s, batch {off.get('engine_batch')}) | {eng:,.1f} |"
        )
    if ips:
        print(f"| serve offline throughput (samples/s, batch {off.get('offline_batch')}) | {ips:,.1f} |")
        if eng:
            print(f"| serve offline / engine alone (goal ≥ 0.95) | {ips / eng:.3f} |")
    if cap is not None:
        print(f"| server capacity at p99 ≤ {args.slo} (queries/s) | {cap:,.1f} |")
        print(
            f"| batching policy found | max batch {srv.get('capacity_max_batch')}, "
            f"max delay {float(srv.get('capacity_max_delay_s') or 0) * 1e3:g} ms |"
        )
    if cap and eng:
        print(f"| server capacity / engine alone (goal ≥ 0.85) | {cap / eng:.3f} |")
    if cap and ips:
        print(f"| server capacity / serve offline | {cap / ips:.3f} |")
    if srv.get("capacity_host_mean_s") is not None:
        print(
            f"| per batch at capacity (ms): host / h2d / compute, mean batch | "
            f"{srv['capacity_host_mean_s'] * 1e3:.3f} / {srv['capacity_h2d_mean_s'] * 1e3:.3f} / "
            f"{srv['capacity_compute_mean_s'] * 1e3:.3f}, {srv['capacity_mean_batch']:.1f} |"
        )
    if srv.get("capacity_sim_best_policy"):
        print(
            f"| simulator's best policy | {srv['capacity_sim_best_policy']} at "
            f"{srv['capacity_sim_best_qps']:,.1f}"
            f"{'' if srv.get('capacity_sim_best_verified') else ' (unverified)'} |"
        )
    for name, row in (("offline", off), ("server", srv)):
        lg = row.get("loadgen") or {}
        rate = (
            lg.get("Samples per second")
            or lg.get("Completed samples per second")
            or lg.get("QPS w/o loadgen overhead")
        )
        if lg:
            p99 = lg.get("99.00 percentile latency (ns)")
            print(
                f"| LoadGen {lg.get('Scenario')}: result, samples/s, p99 (ms) | {lg.get('Result is')}, "
                f"{rate}, "
                f"{float(p99) / 1e6 if p99 else float('nan'):.3f} |"
            )
            if name == "server" and rate and cap:
                print(f"| LoadGen Server completed / deepgap capacity | {float(rate) / cap:.3f} |")
            if name == "server" and "loadgen_capacity_qps" in row:
                lc = row.get("loadgen_capacity_qps")
                print(
                    f"| LoadGen Server capacity (highest VALID) / deepgap capacity (goal ≥ 0.95) | "
                    f"{f'{lc:,.0f} q/s = {lc / cap:.3f}' if lc and cap else 'INVALID at every rate tried'} |"
                )
    if cap and pred:
        print(f"| measured / predicted capacity (goal within 5%) | {cap / pred:.3f} |")
        up, pup = srv.get("capacity_upper_qps"), srv.get("capacity_predicted_upper_qps")
        if up and pup:  # each capacity is a bracket [highest pass, lowest fail) as wide as the search stops
            print(
                f"| capacity brackets: measured / predicted (queries/s) | [{cap:,.0f}, {up:,.0f}) / "
                f"[{pred:,.0f}, {pup:,.0f}) |"
            )
    for tenant, row in (res.get("tenants", {}).get("interference") or {}).items():
        cells = ", ".join(
            f"{k}: p99 {v['p99_s'] * 1e3:.2f} ms at {v['achieved_qps']:,.0f}/s" for k, v in row.items()
        )
        print(f"| tenant {tenant} | {cells} |")
    return 0 if cap is not None and ips else 1


if __name__ == "__main__":
    raise SystemExit(main())
