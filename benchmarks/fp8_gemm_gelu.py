"""The fused fp8 Linear + GELU + quantization kernel against what the engine runs today, per GEMM shape.

Today (bert-base's first MLP Linear): cuBLASLt's ``torch._scaled_mm`` writes bf16 with the bias, then an
Inductor kernel applies GELU and quantizes to fp8 for the next GEMM. The candidate
(`deepgap.measure.quant.linear_kernels.fp8_linear`) does all of it in one Triton kernel. Both are timed on
the same fp8 operands by CUDA events (median of 5 windows of 50 calls), each tile candidate of the fused
kernel in turn, and checked against the fp32 reference. One JSON line per (shape, path, tile) goes to
``--out``/fp8_gemm_gelu.jsonl.

    python benchmarks/fp8_gemm_gelu.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from deepgap.measure.quant.linear_kernels import fp8_linear, reference
from deepgap.measure.quant.tiles import TileConfig

SHAPES = {  # name: (M, K, N, GELU + fp8 out)
    "bert-base ff1 (256 × 128 tokens)": (32768, 768, 3072, True),
    "bert-base ff2": (32768, 3072, 768, False),
    "vit_b_16 fc1 (256 × 197 tokens)": (50432, 768, 3072, True),
}
TILES = [
    TileConfig(128, 128, 128, 8, 8, 4),
    TileConfig(128, 256, 64, 8, 8, 3),
    TileConfig(128, 256, 128, 8, 8, 3),
    TileConfig(256, 128, 64, 8, 8, 3),
    TileConfig(128, 128, 64, 8, 4, 4),
    TileConfig(64, 256, 128, 8, 4, 3),
]


def time_us(fn, iters: int = 50, repeats: int = 5) -> tuple[float, float]:
    """(median µs per call, spread) over ``repeats`` windows of ``iters`` calls."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    med = statistics.median(out)
    return med, (max(out) - min(out)) / med


def today(a, w, scale, bias, gelu, out_scale):
    """cuBLASLt's fp8 GEMM (bias in its epilogue, bf16 out), then GELU and quantization compiled."""
    one = torch.ones((), device=a.device)
    sa = torch.tensor(scale, device=a.device)
    bias16 = bias.to(torch.bfloat16)

    @torch.compile(dynamic=False)
    def run(a):
        y = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=one, bias=bias16, out_dtype=torch.bfloat16,
                             use_fast_accum=True)  # fmt: skip
        if not gelu:
            return y
        return (torch.nn.functional.gelu(y.float()) / out_scale).clamp(-448, 448).to(torch.float8_e4m3fn)

    return lambda: run(a)


def agreement(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Share of equal outputs, and the largest difference relative to the output's range."""
    g, w = got.float(), want.float()
    return {"equal": round(float((g == w).float().mean()), 4),
            "max_rel": round(float((g - w).abs().max() / w.abs().max().clamp(min=1e-12)), 5)}  # fmt: skip


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (m, k, n, gelu) in SHAPES.items():
        a = (torch.randn(m, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        bias = torch.randn(n, device="cuda", generator=g)
        scale, out_scale = 1.0 / (1600 * k**0.5), (0.05 if gelu else None)
        want = reference(a, w, scale, bias, gelu, out_scale)
        flops = 2 * m * k * n
        rows = []
        fn = today(a, w, scale, bias, gelu, out_scale or 1.0)
        us, spread = time_us(fn)
        rows.append({"path": "cuBLASLt + Inductor", "us": round(us, 1), "spread": round(spread, 3),
                     **agreement(fn(), want)})  # fmt: skip
        for t in TILES:
            try:
                got = fp8_linear(a, w, scale, bias, gelu, out_scale, t)
                call = (a, w, scale, bias, gelu, out_scale, t)
                us, spread = time_us(lambda call=call: fp8_linear(*call))
                rows.append({"path": "fused Triton", "tile": t.__dict__, "us": round(us, 1),
                             "spread": round(spread, 3), **agreement(got, want)})  # fmt: skip
            except Exception as exc:  # a tile that does not compile (shared memory) is a row, not a stop
                rows.append({"path": "fused Triton", "tile": t.__dict__, "error": str(exc)[:200]})
        for r in rows:
            r.update(shape=name, m=m, k=k, n=n, gelu=gelu)
            if "us" in r:
                r["tflops"] = round(flops / r["us"] / 1e6, 1)
            print(json.dumps(r), flush=True)
            with open(args.out / "fp8_gemm_gelu.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
