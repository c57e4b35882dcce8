"""Decode speed of a Llama-architecture decoder (issue 51): TTFT, TPOT, tokens/s and memory, per batch.

Runs `deepgap.measure.llm_timing.measure_decode` for each batch on one device and writes
``llm_decode.json`` (every figure, the shape, the environment) and ``llm_decode.csv`` (one row per
batch) under ``--out``. Beside each measurement it puts the analytic roofline of decode
(`deepgap.measure.llm_cost.decode_cost` at the run's mean context): bytes and FLOPs per token and, with
``--bandwidth-gbs``, the memory-bound ceiling and the fraction of it reached. Where ``--step`` is not
eager, the first run's greedy tokens are compared with the eager step's (same dtype), so a graph that
replays wrong is seen at once. Weights are seeded random (or ``--weights`` from a local HF folder).

    # CPU, seconds:
    python benchmarks/llm_decode.py --model llama-tiny --device cpu --batches 1,4 --out /tmp/llm
    # one H200: bf16, CUDA graphs of the compiled decode step, 128 in / 128 out
    python benchmarks/llm_decode.py --model llama-3.1-8b --device cuda --dtype bf16 \\
        --step cuda-graph --compiled-graph --batches 1,8,32,64,128,256 --bandwidth-gbs 4800 --out out/
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import time

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-tiny", help="a named shape or a local HF config.json / folder")
    ap.add_argument("--weights", action="store_true", help="load *.safetensors from --model's folder")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument(
        "--dtype", default="bf16", choices=sorted(DTYPES), help="on a CPU: fp32 whatever is asked"
    )
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--step", default="eager", choices=["eager", "static", "compile", "cuda-graph"])
    ap.add_argument("--compiled-graph", action="store_true", help="cuda-graph: capture the compiled step")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--bandwidth-gbs", type=float, help="device memory bandwidth for the roofline bound")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder for llm_decode.json and llm_decode.csv")
    return ap.parse_args(argv)


def load(args):
    """The model on its device in its dtype, and the device string."""
    import torch

    from deepgap.measure.models.llama_net import build_llama

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, DTYPES["fp32" if device == "cpu" else args.dtype])
    t0 = time.perf_counter()
    model = build_llama(args.model, seed=args.seed, weights=args.weights, device=device).to(dtype)
    return model, device, time.perf_counter() - t0


def one_batch(model, args, batch: int, clock) -> dict:
    """Measure one batch; add the roofline figures and the eager-token agreement."""
    from deepgap.measure.llm_cost import Itemsizes, decode_cost
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import generate, measure_decode, prompts

    step = make_step(model, args.step, args.compile_mode, args.compiled_graph)
    r = measure_decode(
        model,
        batch,
        args.input_len,
        args.output_len,
        clock,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        step=None if args.step == "eager" else step,
    )
    row = {
        "model": args.model,
        "step": args.step,
        "dtype": str(model.embed_tokens.weight.dtype),
        **r.summary(),
    }
    itemsize = model.embed_tokens.weight.element_size()
    cost = decode_cost(
        model.shape, batch, args.input_len + args.output_len // 2, Itemsizes(itemsize, itemsize, itemsize)
    )
    row.update(
        decode_bytes_per_token=cost.bytes_per_token,
        decode_flops_per_token=cost.flops_per_token,
        decode_intensity=cost.intensity,
    )
    if args.bandwidth_gbs:
        bound = cost.bound_tokens_per_s(args.bandwidth_gbs * 1e9)
        row.update(decode_bound_tok_s=bound, decode_fraction_of_bound=(row["decode_tok_s"] or 0) / bound)
    if args.step != "eager":
        ids = prompts(model.shape.vocab, batch, args.input_len, args.seed).to(
            model.embed_tokens.weight.device
        )
        eager = generate(model, ids, args.output_len).cpu().tolist()
        same = sum(a == b for x, y in zip(eager, r.tokens, strict=True) for a, b in zip(x, y, strict=True))
        row["token_agreement_with_eager"] = same / (batch * args.output_len)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from deepgap.measure.models.llama_config import as_dict
    from deepgap.measure.timing import HostClock

    model, device, build_s = load(args)
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        row = one_batch(model, args, batch, HostClock(sync=sync))
        rows.append(row)
        print(
            f"{args.model} {args.step} bs{batch} {args.input_len}/{args.output_len}: "
            f"TTFT {row['ttft_median_s'] * 1e3:.2f} ms, TPOT {(row['tpot_median_s'] or 0) * 1e3:.3f} ms "
            f"(tail {row['tpot_tail_kind']} of {row['tpot_n']}: {(row['tpot_tail_s'] or 0) * 1e3:.3f} ms), "
            f"decode {row['decode_tok_s'] or 0:,.0f} tok/s, pipelined {row['pipelined_decode_tok_s'] or 0:,.0f}, "
            f"output {row['output_tok_s']:,.0f} tok/s",
            flush=True,
        )
    env = {
        "device": device,
        "device_name": torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else platform.processor(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "build_s": build_s,
        "args": vars(args),
        "shape": as_dict(model.shape),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "llm_decode.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "llm_decode.csv"), "w", newline="") as f:
        fields = sorted({k for r in rows for k in r})
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
