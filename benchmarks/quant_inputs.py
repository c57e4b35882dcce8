"""The quant engine's two input modes side by side, timed by a bare CUDA-event loop (no deepgap harness).

Why: ``--inputs int8-resident`` (int8 pixels already in device memory, MLPerf-like) and the default fp16
batch differ only in what the network's first step reads; this measures both from the same calibrated
network build, per model, precision and batch, with the stem each build chose and every stem variant's
time, so the gain of the int8 stem and of the resident input can be read apart. It is also the
independent loop that deepgap's own numbers for these configurations are checked against (within 2%): its
back-to-back rate against the harness's pipelined figure, its synchronized one (`synchronized`) against
``throughput_ips``.

    python benchmarks/quant_inputs.py --models resnet50 --precisions int8,fp8 --batch-sizes 256,1024 \
        --out $OUT/quant_inputs.jsonl

Prints one JSON line per configuration and a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def bare_loop(run, x: torch.Tensor, batch: int, windows: int = 5, window_s: float = 1.0) -> dict:
    """img/s of ``run(x)`` in ``windows`` CUDA-event windows of about ``window_s`` each: median and range."""
    for _ in range(10):
        run(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        run(x)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / 10
    iters = max(10, int(window_s / max(per_call, 1e-6)))
    rates = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run(x)
        end.record()
        end.synchronize()
        rates.append(batch * iters / (start.elapsed_time(end) * 1e-3))
    return {"img_s": statistics.median(rates), "low": min(rates), "high": max(rates), "iters": iters,
            **synchronized(run, x, batch)}  # fmt: skip


def synchronized(run, x: torch.Tensor, batch: int, calls: int = 40) -> dict:
    """batch ÷ the median of ``calls`` single calls, each timed by CUDA events from an idle, synchronized GPU.

    Why: it is what deepgap's answer ranks by (``throughput_ips``, the paper's batch ÷ latency), and at a power
    cap it parts from the back-to-back rate above (each call starts at the clock an idle gap restores); the
    loop reports both so that each is checked against its own kind (session 29: 2.5% apart on one H200).
    """
    ms = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(x)
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    med = statistics.median(ms)
    return {"img_s_synchronized": batch / (med * 1e-3), "synchronized_ms": med}


def constants_turns(res, inp: torch.Tensor, batch: int, turns: list[str]) -> list[dict]:
    """The built network captured again under PDL (serial, no second stream) per ``DEEPGAP_PDL_CONSTANTS`` turn.

    Why here: the same build's tiles and the same process for each turn, so what differs is only where each kernel
    loads its epilogue's constants (`quant.launch.constants_ahead`); each turn's logits against the kept graph's.
    """
    import os
    from unittest import mock

    from deepgap.measure import graph_runner
    from deepgap.measure.quant import launch

    with torch.inference_mode():
        kept = res.run(inp).clone()
    rows = []
    for value in turns:
        with mock.patch.dict(os.environ, {"DEEPGAP_PDL_CONSTANTS": value}), launch.pdl():
            graph, out = graph_runner.capture(res.net.forward, inp, "cuda", warmup=2)
        run = graph_runner.GraphRunner(graph, inp, out, owns=res.net)
        with torch.inference_mode():
            same = torch.equal(run(inp), kept)
            rows.append({"constants": value, "same_logits": same, **bare_loop(run, inp, batch)})
        del run, graph
    return rows


def measure(
    model_name: str, precision: str, batch: int, resident: bool, pdl: str = "auto", constants: str = ""
) -> dict:
    """Build one configuration, check it against fp32, time it with the bare loop."""
    from deepgap.measure import correctness
    from deepgap.measure.graph_runner import bound_input
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    model = build_model(model_name, 224, None, 0)
    t0 = time.perf_counter()
    res = prepare_quant(
        model, precision, batch, 224, model_name, opts=QuantOptions(resident_input=resident, pdl=pdl)
    )
    setup = time.perf_counter() - t0
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    check = x[:8]
    with torch.inference_mode():
        ref = model.cuda()(check.cuda()).float()
        model.cpu()
        xd = x.cuda()
        inp = res.make_input(xd) if resident else xd.half().contiguous(memory_format=torch.channels_last)
        inp = bound_input(res.run, inp)  # in the graph's own input buffer, as the harness places it
        agree = correctness.compare(res.run(inp)[:8].float(), ref, precision)
        timing = bare_loop(res.run, inp, batch)
    turns = constants_turns(res, inp, batch, constants.split(",")) if constants else []
    info = res.info
    stem_row = info["outside_layers"][0]
    return {
        "model": model_name,
        "precision": precision,
        "batch": batch,
        "input": "int8-resident" if resident else "default",
        **timing,
        "ms_per_batch": batch / timing["img_s"] * 1e3,
        "stem": info["stem"]["chosen"],
        "stem_ms": {k: round(v * 1e3, 4) for k, v in info["stem"].get("seconds", {}).items()},
        "stem_row_ms": round((stem_row["q_s"] or stem_row["fp16_s"]) * 1e3, 4),
        "layers_ms": round(
            sum((t["q_s"] if t["mode"] == "q" else t["fp16_s"]) for t in info["layers"]) * 1e3, 3
        ),
        "rel_l2": agree.rel_l2,
        "cosine": agree.cosine,
        "flagged": agree.flagged,
        "cuda_graph": info.get("cuda_graph"),
        "pdl": info.get("pdl"),
        # the shortcuts on a second stream (`quant.branch_choice`): both graphs' times, and which was kept
        "branch": info.get("branch"),
        "whole": info.get("whole"),  # the whole-network kernel (`quant.whole_choice`): each plan's time, kept
        "gemm": info.get("gemm", "off"),  # DEEPGAP_QUANT_GEMM: 'persistent' (the default) or 'off'
        "persistent_layers": [t["name"] for t in info["layers"] if "persistent" in (t["config"] or "")],
        "setup_s": round(setup, 1),
        "constants_turns": turns,
    }


def _pdl_cell(pdl) -> str:
    if not pdl or "seconds" not in pdl:
        return str((pdl or {}).get("error") or (pdl or {}).get("reason") or "-")[:40]
    off, on = pdl["seconds"]["off"], pdl["seconds"]["on"]
    return (
        f"{'on' if pdl['chosen'] else 'off'} (off {off * 1e3:.3f} ms, on {on * 1e3:.3f} ms, {off / on:.3f}x, "
        f"trigger {pdl.get('trigger', 'early')})"
    )


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet50")
    p.add_argument("--precisions", default="int8,fp8")
    p.add_argument("--batch-sizes", default="256,1024")
    p.add_argument("--inputs", default="default,int8-resident")
    p.add_argument(
        "--pdl", default="auto", help="programmatic dependent launch: auto (timed both ways), on, off"
    )
    p.add_argument(
        "--constants",
        default="",
        help="after PDL's choice, the network captured again under PDL per turn of DEEPGAP_PDL_CONSTANTS, e.g. "
        "after,ahead,after,ahead (each kernel's epilogue constants before its wait or after its K loop)",
    )
    p.add_argument("--out", default=None, help="append JSON lines here too")
    a = p.parse_args()
    rows = []
    for model in a.models.split(","):
        for prec in a.precisions.split(","):
            for bs in [int(b) for b in a.batch_sizes.split(",")]:
                for mode in a.inputs.split(","):
                    try:
                        row = measure(model, prec, bs, mode == "int8-resident", a.pdl, a.constants)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        row = {
                            "model": model,
                            "precision": prec,
                            "batch": bs,
                            "input": mode,
                            "error": repr(exc)[:300],
                        }
                    print(json.dumps(row), flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
                    rows.append(row)
                    torch.cuda.empty_cache()
    print(
        f"\n{'model':10} {'prec':5} {'batch':>5} {'input':14} {'img/s':>9} {'synced':>9} {'ms':>7} {'stem':16} "
        f"{'stem ms':>8}"
    )
    for r in rows:
        if "error" in r:
            print(
                f"{r['model']:10} {r['precision']:5} {r['batch']:>5} {r['input']:14} ERROR {r['error'][:60]}"
            )
            continue
        print(
            f"{r['model']:10} {r['precision']:5} {r['batch']:>5} {r['input']:14} {r['img_s']:>9,.0f} "
            f"{r['img_s_synchronized']:>9,.0f} {r['ms_per_batch']:>7.3f} {r['stem']:16} {r['stem_row_ms']:>8.3f} "
            f"{_pdl_cell(r.get('pdl'))}"
        )
        for t in r.get("constants_turns", []):
            print(
                f"  PDL graph, constants {t['constants']:5}: {t['img_s']:>9,.0f} img/s back to back, "
                f"{t['synchronized_ms']:.4f} ms synchronized, logits {'same' if t['same_logits'] else 'DIFFER'}"
            )


if __name__ == "__main__":
    main()
