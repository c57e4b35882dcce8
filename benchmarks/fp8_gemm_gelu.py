"""The fused fp8 Linear + GELU + quantization kernels against what the engine runs today, per GEMM shape.

Today (bert-base's first MLP Linear): cuBLASLt's ``torch._scaled_mm`` writes bf16 with the bias, then an
Inductor kernel applies GELU and quantizes to fp8 for the next GEMM. The candidate
(`deepgap.measure.quant.linear_kernels.fp8_linear`) does all of it in one Triton kernel, on either GEMM
core: the grouped kernel (its tiles below) or the persistent TMA one (`tiles.linear_persistent_configs`).
The other three Linears (QKV, attention output, ff2) are timed too, bias only, bf16 out. All are timed on
the same fp8 operands by CUDA events (median of 5 windows of 50 calls), each tile in turn, and checked
against the fp32 reference. One JSON line per (shape, path, tile) goes to ``--out``/fp8_gemm_gelu.jsonl;
the last lines are a table, per shape: cuBLASLt + Inductor, the grouped kernel's best and the persistent
one's best, in µs.

    python benchmarks/fp8_gemm_gelu.py --out OUT [--shapes bert-base]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from deepgap.measure.quant.linear_kernels import Epilogue, fp8_linear, reference
from deepgap.measure.quant.tiles import TileConfig, linear_persistent_configs

SHAPES = {  # name: (M, K, N, GELU + fp8 out); batch 256: 256 × 128 tokens, 256 × 197 patches
    f"{model} {name}": (m, k, n, name == "ff1")
    for model, m in (("bert-base", 256 * 128), ("vit_b_16", 256 * 197))
    for name, k, n in (("ff1", 768, 3072), ("qkv", 768, 2304), ("out", 768, 768), ("ff2", 3072, 768))
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


def time_tiles(a, w, epi: Epilogue, want, path: str, tiles) -> list[dict]:
    """A row per tile of one GEMM core: µs, spread, agreement with the reference; a tile that fails is a row."""
    rows = []
    for t in dict.fromkeys(t.fit(a.shape[1], w.shape[0]) for t in tiles):
        try:
            call = (a, w, epi, t)
            got = fp8_linear(*call)
            us, spread = time_us(lambda call=call: fp8_linear(*call))
            rows.append({"path": path, "tile": t.label, "us": round(us, 1), "spread": round(spread, 3),
                         **agreement(got, want)})  # fmt: skip
        except Exception as exc:  # a tile that does not compile (shared memory) is a row, not a stop
            rows.append({"path": path, "tile": t.label, "error": str(exc)[:200]})
    return rows


def fastest_by(rows: list[dict], shape: str, key: str) -> dict[str, dict]:
    """``shape``'s fastest timed row for each value of ``key`` (a path or a variant), in first-seen order."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["shape"] == shape and "us" in r and (r[key] not in best or r["us"] < best[r[key]]["us"]):
            best[r[key]] = r
    return best


def summary(rows: list[dict]) -> list[str]:
    """Per shape: cuBLASLt + Inductor's µs, each fused core's best µs and tile, and their ratios to it."""
    lines = [
        "best µs per path; ×: cuBLASLt + Inductor's µs over the fused kernel's (above 1: the fused one is faster)",
        f"{'shape':<20} {'cuBLASLt+Inductor':>18} {'grouped fused':>28} {'persistent fused':>38}",
    ]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        best = fastest_by(rows, shape, "path")
        base = best.get("cuBLASLt + Inductor", {}).get("us")
        cells = [f"{base:>16.1f}us" if base else f"{'-':>18}"]
        for path, width in (("grouped", 28), ("persistent", 38)):
            r = best.get(path)
            ratio = f" {base / r['us']:.2f}x" if r and base else ""
            cells.append(f"{r['us']:.1f}us{ratio} {r['tile']}".rjust(width) if r else "-".rjust(width))
        lines.append(f"{shape:<20} " + " ".join(cells))
    return lines


def emit(rows: list[dict], path: Path, **shape) -> list[dict]:
    """Each row with its shape's fields and TFLOP/s, printed and appended to ``path`` as a JSON line."""
    m, k, n = shape["m"], shape["k"], shape["n"]
    for r in rows:
        r.update(shape)
        if "us" in r:
            r["tflops"] = round(2 * m * k * n / r["us"] / 1e6, 1)
        print(json.dumps(r), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(r) + "\n")
    return rows


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--shapes", default="", help="only shapes whose name contains this (e.g. bert-base)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    everything = []
    for name, (m, k, n, gelu) in SHAPES.items():
        if args.shapes not in name:
            continue
        a = (torch.randn(m, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        bias = torch.randn(n, device="cuda", generator=g)
        scale, out_scale = 1.0 / (1600 * k**0.5), (0.05 if gelu else None)
        epi = Epilogue(scale, bias, gelu, out_scale)
        want = reference(a, w, epi)
        fn = today(a, w, scale, bias, gelu, out_scale or 1.0)
        us, spread = time_us(fn)
        rows = [
            {
                "path": "cuBLASLt + Inductor",
                "us": round(us, 1),
                "spread": round(spread, 3),
                **agreement(fn(), want),
            }
        ]
        persistent = linear_persistent_configs(k, n, 1 if gelu else 2)
        rows += time_tiles(a, w, epi, want, "grouped", TILES)
        rows += time_tiles(a, w, epi, want, "persistent", persistent)
        everything += emit(rows, args.out / "fp8_gemm_gelu.jsonl", shape=name, m=m, k=k, n=n, gelu=gelu)
    print("\n".join(summary(everything)))


if __name__ == "__main__":
    main()
