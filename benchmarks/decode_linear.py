"""A decode step's Linear layers at small batch, each way deepgap can run them, in GB/s of weights read.

Why: an 8B decoder's step at batch 1 is ~8 GB of fp8 weights read once; issue 51's goal (≥ 480 tok/s on
one H200) needs the Linears near HBM bandwidth. This times, per Llama-3.1-8B weight shape and rows M:

- ``bf16``: ``F.linear`` on bf16 weights (cuBLAS), the floor fp8 must beat;
- ``gemv``: `deepgap.measure.quant.gemv.fp8_gemv` (fp8 weights, bf16 activations), the tile its tuner
  picks and, at M = 1, every candidate;
- ``compiled-wo``: ``F.linear(x, codes.to(bf16)) * scale`` through torch.compile (gpt-fast's recipe);
- ``scaled-mm``: per-row fp8 activations and ``torch._scaled_mm`` (the quant engine's GEMM path).

Each is captured in a CUDA graph of ``CALLS`` calls that cycle through enough weight copies (≥ 400 MB) that
no call finds its weight in L2, and timed by CUDA events over the graph's replays (median of 5). One JSON
line per (shape, M, path, tile) goes to ``--out``/decode_linear.jsonl, with µs, GB/s of weight bytes,
and the largest difference from the fp32 reference relative to its range.

    python benchmarks/decode_linear.py --out OUT
"""

# ruff: noqa: B023 - every closure over a loop's variables is called within that iteration (graph capture)

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from deepgap.measure.quant.gemv import DOT_TILES, ROW_TILES, fp8_gemv, reference, tuned

SHAPES = {  # name: (K, N) of Llama-3.1-8B's Linears (QKV and gate/up fused, as deepgap's decoder has them)
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
    "lm_head": (4096, 128256),
}
ROWS = (1, 4, 16, 64)
COMPILED_ROWS = (1, 16)  # torch.compile's paths: one compile per shape and M, so only these
CALLS = 24
MIN_BYTES = 400e6
TILES = (
    ROW_TILES + DOT_TILES
)  # at one row: every candidate the tuner has, the CUDA-core and the tensor-core kernel


def graph_time_us(calls) -> float:
    """µs per call: ``calls`` (a list of thunks) captured as one graph, replayed, median of 5 windows."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:3]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(4):
            g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / (4 * len(calls)))
    return statistics.median(out)


def rel(got, want) -> float:
    return round(float((got.float() - want.float()).abs().max() / want.float().abs().max()), 5)


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows M to time, e.g. 1")
    args = ap.parse_args()
    out = Path(args.out) / "decode_linear.jsonl"
    dev = torch.device("cuda")
    for knob in (
        "cache_size_limit",
        "recompile_limit",
    ):  # one compile per (shape, M): never fall back to eager
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    torch.manual_seed(0)
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        copies = max(1, int(MIN_BYTES // (k * n)) + 1)
        w32 = [torch.randn(n, k, device=dev) * k**-0.5 for _ in range(copies)]
        scale = [w.abs().amax(1) / 448 for w in w32]
        codes = [
            (w / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn) for w, s in zip(w32, scale, strict=True)
        ]
        w16 = [w.bfloat16() for w in w32]
        del w32
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            want = reference(x, codes[0], scale[0])
            rows = []

            def put(path, us, got, tile=None, wbytes=1):
                row = {"shape": name, "K": k, "N": n, "M": m, "path": path, "tile": tile, "us": round(us, 2),
                       "GBps": round(k * n * wbytes / us / 1e3, 1), "max_rel": rel(got, want)}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)

            pick = [i % copies for i in range(CALLS)]
            us = graph_time_us([lambda i=i: F.linear(x, w16[i]) for i in pick])
            put("bf16", us, F.linear(x, w16[0]), wbytes=2)
            if m <= 16:
                us = graph_time_us([lambda i=i: fp8_gemv(x, codes[i], scale[i]) for i in pick])
                put(
                    "gemv",
                    us,
                    fp8_gemv(x, codes[0], scale[0]),
                    str(tuned(x, codes[0], scale[0])) + " (tuned)",
                )
                for t in TILES if m == 1 else ():
                    try:
                        us = graph_time_us(
                            [lambda i=i: fp8_gemv(x, codes[i], scale[i], None, t) for i in pick]
                        )
                        put("gemv", us, fp8_gemv(x, codes[0], scale[0], None, t), str(t.fit(k, n)))
                    except Exception as e:  # noqa: BLE001 - a tile that does not compile is a row, not a stop
                        print(json.dumps({"shape": name, "M": m, "tile": str(t), "error": repr(e)[:200]}))
            if m not in COMPILED_ROWS:
                with out.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                continue
            wo = torch.compile(lambda x, c, s: F.linear(x, c.to(torch.bfloat16)) * s, dynamic=False)
            us = graph_time_us([lambda i=i: wo(x, codes[i], scale[i].bfloat16()) for i in pick])
            put("compiled-wo", us, wo(x, codes[0], scale[0].bfloat16()))

            def smm(x, c, s):
                a = x.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448
                q = (x.float() / a).clamp(-448, 448).to(torch.float8_e4m3fn)
                return torch._scaled_mm(q, c.t(), scale_a=a, scale_b=s[None, :], out_dtype=torch.bfloat16,
                                        use_fast_accum=True)  # fmt: skip

            sm = torch.compile(smm, dynamic=False)
            try:
                us = graph_time_us([lambda i=i: sm(x, codes[i], scale[i]) for i in pick])
                put("scaled-mm", us, sm(x, codes[0], scale[0]))
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"shape": name, "M": m, "path": "scaled-mm", "error": repr(e)[:200]}))
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        codes.clear(), w16.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
