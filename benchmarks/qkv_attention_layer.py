"""The batch-1 attention of Llama-3.1-8B's layers in a CUDA graph: split kernels against the qkv GEMV's tail (issue 51).

Per layer (distinct weights and cache per layer, so that no layer's weights sit in L2 from the one before): the
fused qkv GEMV with RoPE (`gemv_fused`, ``DEEPGAP_DECODE_ROPE=fused``), the attention, and the o projection
with its residual (its first K step is what PDL overlaps with the attention's tail). Three ways:

- ``split``: the RoPE GEMV, then `llm_attention.attend` as the step plans it (``DEEPGAP_DECODE_SPLIT_KV``,
  ``DEEPGAP_DECODE_COMBINE``), then o;
- ``qkv BLxS``: `llm_qkv_attention.rope_gemv_attend` (the last programs walk the cache in blocks of BL
  positions, S pipeline stages), then o;
- ``none``: the RoPE GEMV and o without any attention (o reads q): the floor both are held to.

µs per layer = the median of ``--repeats`` graph replays / layers. The attention outputs of the two ways are
compared (max |difference|). One JSON line per way to stdout.

    python benchmarks/qkv_attention_layer.py --pdl on --pos 192 --tails 64x1,32x1,16x1,64x2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics

import torch

from deepgap.measure import llm_attention, llm_qkv_attention
from deepgap.measure.quant import gemv, launch
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv


def _layer(k: int, nq: int, nkv: int, d: int, length: int, pos: torch.Tensor, g: torch.Generator) -> dict:
    n = (nq + 2 * nkv) * d

    def codes(rows, cols):
        return (
            (torch.randn(rows, cols, generator=g, device="cuda") * 40)
            .clamp(-400, 400)
            .to(torch.float8_e4m3fn)
        )

    half = torch.rand(d // 2, generator=g, device="cuda") * 6
    cos, sin = (f(torch.cat([half, half])).bfloat16()[None] for f in (torch.cos, torch.sin))
    cache = [torch.randn(1, nkv, length, d, generator=g, device="cuda").bfloat16() for _ in range(2)]
    return dict(
        qkv=codes(n, k),
        qkv_scale=torch.full((n,), 1 / (40 * math.sqrt(k)), device="cuda"),
        gamma=torch.ones(k, device="cuda").bfloat16(),
        rope=RopeWrite(cos, sin, pos, cache[0], cache[1], nq),
        o=codes(k, nq * d),
        o_scale=torch.full((k,), 1 / (40 * math.sqrt(nq * d)), device="cuda"),
    )


def _step(way: str, layers: list[dict], x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer once, in order; the attention rows each way wrote."""
    outs = []
    for lay in layers:
        r = lay["rope"]
        fusion = Fusion(lay["gamma"], 1e-5, rope=r)
        if way == "split" or way == "none":
            q = fused_gemv(x, lay["qkv"], lay["qkv_scale"], fusion)
            a = q
            if way == "split":
                q = q.view(1, r.heads, 1, r.k.shape[3])
                a = llm_attention.decode_attention(q, r.k, r.v, r.pos).reshape(1, -1)
        else:
            a = llm_qkv_attention.rope_gemv_attend(x, lay["qkv"], lay["qkv_scale"], fusion)
        outs.append(a)
        fused_gemv(a, lay["o"], lay["o_scale"], Fusion(residual=x))
    return outs


def measure(way: str, layers: list[dict], x: torch.Tensor, pdl: bool, repeats: int) -> tuple[float, list]:
    """µs per layer of the graph of every layer, and the attention rows of its last replay."""
    ctx = launch.pdl if pdl else contextlib.nullcontext
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), ctx():
        for _ in range(2):  # tiles timed, kernels compiled, counters made: before the capture
            _step(way, layers, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with ctx(), torch.cuda.graph(graph):
        outs = _step(way, layers, x)
    graph.replay()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(layers))
    return statistics.median(times), [o.clone() for o in outs]


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--pdl", default="on", choices=["on", "off"])
    ap.add_argument("--pos", type=int, default=192, help="the step's position in a 256-position cache")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--tails", default="64x1", help="the last programs' walk, BLxSTAGES, e.g. 64x1,32x1,64x2")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    pos = torch.full((1,), args.pos, dtype=torch.int64, device="cuda")
    layers = [_layer(4096, 32, 8, 128, 256, pos, g) for _ in range(args.layers)]
    x = (torch.randn(1, 4096, generator=g, device="cuda")).bfloat16()
    pdl = args.pdl == "on"
    with torch.inference_mode():
        base, split_rows = measure("split", layers, x, pdl, args.repeats)
        floor, _ = measure("none", layers, x, pdl, args.repeats)
        print(json.dumps({"way": "split", "us_per_layer": round(base, 2), "pdl": args.pdl, "pos": args.pos}))
        print(json.dumps({"way": "none", "us_per_layer": round(floor, 2)}))
        for tail in args.tails.split(","):
            bl, st = (int(v) for v in tail.split("x"))
            llm_qkv_attention.TAIL_BLOCK, llm_qkv_attention.TAIL_STAGES = bl, st
            t, rows = measure("qkv", layers, x, pdl, args.repeats)
            diff = max(
                float((a.float() - b.float()).abs().max()) for a, b in zip(rows, split_rows, strict=True)
            )
            counts = int(llm_attention.counters(8, x.device).abs().sum())
            row = {
                "way": f"qkv {tail}",
                "us_per_layer": round(t, 2),
                "max_diff_vs_split": diff,
                "counts": counts,
            }
            print(json.dumps(row), flush=True)
    print(json.dumps({"tiles": gemv.chosen()}))


if __name__ == "__main__":
    main()
