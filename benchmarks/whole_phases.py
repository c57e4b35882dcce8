"""Where the whole-network kernel's time goes (`quant.whole`), phase by phase, against the per-layer kernels.

Why: its first GPU run (session 34, one H200, ResNet-50 fp8 at batch 1) took 0.45–0.54 ms a network against
0.247 ms per layer, and a total says nothing of why. Per model and precision this prepares the engine at the
batch (the tuned per-layer tiles), then for each variant (split-K cap × barrier form × warps) checks the plan
against each layer's exact reference, times it in a CUDA graph, times it with every work item left out (the
grid barriers alone), and reads program 0's global timer after each barrier (median over ``--stamps`` launches)
so that each phase's µs stands beside the tuned per-layer times of its layers. A last variant per (barrier,
warps) takes each layer's split from the cap whose phase was fastest.

    python benchmarks/whole_phases.py --models resnet50 --precisions fp8,int8 --out $OUT/whole-phases.jsonl

One JSON line per variant; a summary table last.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

# (barrier form, warps, pipeline stages, programs an SM, dataflow): session 34's second call found the one-thread
# barrier 1.35 µs and a K step of 64 about 0.35 µs (latency-bound); these weigh K steps of 128 (layers from 128
# channels), deeper pipelines (two programs an SM need 4 warps, which spill) and dataflow counters for barriers;
# and (session 35) 16 warps a program: 126-128 registers a thread against 8 warps' 219-249, no spills (sm_90,
# Triton 3.6), twice the threads an SM to keep loads in flight (as session 37's one-kernel decode step did)
VARIANTS = ((1, 8, 3, 1, False), (1, 8, 4, 1, False), (1, 8, 3, 1, True), (1, 16, 3, 1, False))


def _phases(plan) -> list[list[str]]:
    """The plan's layers grouped by phase."""
    from deepgap.measure.quant import whole

    out, cur = [], []
    for name, row in zip(plan.names, plan.table.tolist()[:-1], strict=True):  # the last row: zeros
        cur.append(name)
        if row[whole.COL["sync_after"]]:
            out.append(cur)
            cur = []
    return [*out, cur]


def timer_deltas_us(run, size: int, n: int, device) -> list[list[float]]:
    """``n`` launches of ``run(times=buf)``: each one's µs between program 0's consecutive global-timer stamps."""
    buf = torch.zeros(size, dtype=torch.int64, device=device)
    rows = []
    for _ in range(n):
        run(times=buf)
        torch.cuda.synchronize()
        t = buf.tolist()
        rows.append([(b - a) / 1e3 for a, b in zip(t, t[1:], strict=False)])
    return rows


def _stamps(plan, x, n: int) -> list[float]:
    """Median µs of each phase over ``n`` launches (program 0's global timer after each barrier)."""
    rows = timer_deltas_us(lambda times: plan.run(x, times=times), plan.n_phases + 2, n, x.device)
    return [statistics.median(col) for col in zip(*rows, strict=True)]


def measure(model_name: str, precision: str, batch: int, reps: int, stamps: int) -> list[dict]:
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant import whole, whole_choice, whole_plan
    from deepgap.measure.quant.prepare import prepare_quant
    from deepgap.measure.quant.tuning import time_s

    res = prepare_quant(build_model(model_name, 224, None, 0), precision, batch, 224, model_name)
    net = res.net
    kept = net.whole
    net.whole = None
    q_s = {t["name"]: t["q_s"] for t in res.info["layers"]}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    images = (
        torch.randn(batch, 3, 224, 224, device="cuda").half().contiguous(memory_format=torch.channels_last)
    )
    rows = []
    with torch.inference_mode():
        x = net.run_stem(images, net.stem_backend).contiguous()
        steps = net.steps(batch)[1:-1]  # the convolutions' steps, per layer (the stem and head left out)
        env = {net.stem.out: x}
        per_layer = time_s(lambda: [step(env) for _, step in steps], reps)
        base = {"model": model_name, "precision": precision, "batch": batch, "per_layer_ms": per_layer * 1e3,
                "engine_whole": res.info.get("whole"), "engine_kept": kept is not None}  # fmt: skip
        print(json.dumps({**base, "variant": "per-layer kernels"}), flush=True)
        for barrier, warps, stages, per_sm, flow in VARIANTS:
            by_cap = {}
            for cap in (1, 4, 16, "tuned"):
                row = {
                    **base,
                    "variant": f"cap {cap}, b{barrier} w{warps} s{stages} x{per_sm}{' flow' * flow}",
                }
                if cap == "tuned" and not by_cap:
                    continue
                try:
                    if cap == "tuned":  # each phase's split from the cap whose phase was fastest
                        splits = {}
                        for i, group in enumerate(_phases(next(iter(by_cap.values()))[0])):
                            best = min(by_cap, key=lambda c, i=i: by_cap[c][1][i])
                            table = by_cap[best][0].table.tolist()
                            names = by_cap[best][0].names
                            splits |= {n: table[names.index(n)][whole.COL["split"]] for n in group}
                        plan = whole_plan.build(
                            net, batch, sms * per_sm, 16, barrier, splits, warps, stages, flow
                        )
                    else:
                        plan = whole_plan.build(
                            net, batch, sms * per_sm, cap, barrier, None, warps, stages, flow
                        )
                    row["label"] = plan.label
                    row["check"] = whole_choice.check_plan(net, plan, x)
                    row["ms"] = time_s(lambda plan=plan: plan.run(x), reps) * 1e3
                    row["flagged"] = plan.flagged()
                    if flow:  # no barriers, so no phase stamps: the total only
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                        continue
                    row["barriers_only_ms"] = (
                        time_s(lambda plan=plan: plan.run(x, skip_work=True), reps) * 1e3
                    )
                    row["phase_us"] = [round(v, 2) for v in _stamps(plan, x, stamps)]
                    row["phases"] = [
                        (g, round(sum(q_s.get(n) or 0 for n in g) * 1e6, 2)) for g in _phases(plan)
                    ]  # each phase's layers and their tuned per-layer µs
                    if cap != "tuned":
                        by_cap[cap] = (plan, row["phase_us"])
                except Exception as exc:  # noqa: BLE001 - one variant's failure is a row, not the end
                    torch.cuda.synchronize()
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet50")
    p.add_argument("--precisions", default="fp8,int8")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--stamps", type=int, default=30)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    for model in a.models.split(","):
        for prec in a.precisions.split(","):
            rows += measure(model, prec, a.batch, a.reps, a.stamps)
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{'model':10} {'prec':5} {'variant':32} {'ms':>7} {'barriers':>8} check")
    for r in rows:
        print(f"{r['model']:10} {r['precision']:5} {r['variant']:32} {r.get('ms', float('nan')):7.4f} "
              f"{r.get('barriers_only_ms', float('nan')):8.4f} {r.get('check') or r.get('error') or 'ok'}")  # fmt: skip


if __name__ == "__main__":
    main()
