"""What the fused fp8 Linear's epilogue costs, part by part, at bert-base's and ViT-B/16's first MLP GEMM.

Why: on one H200 (session 23) the persistent TMA core ran the bias-only shapes at ~1,170 TFLOP/s but ff1
with its epilogue (bias, exact erf GELU, fp8 quantization for the next Linear) at ~570: about 6.6 µs per
128×256 tile, 23 tiles per SM. Here the same kernel (`linear_kernels.fp8_linear`, persistent tiles) runs
the same GEMM with more of the epilogue each time, so the differences say what each part costs:

  bias, bf16 out            the GEMM and its store (the floor; cuBLASLt's ``_scaled_mm`` beside it)
  bias, fp8 out             + the quantization, half the bytes stored
  bias, GELU erf, bf16 out  + the exact GELU (libdevice erff)
  bias, GELU erf, fp8 out   today's fused epilogue
  bias, GELU tanh, fp8 out  the tanh form (``tanh.approx.f32``), the default since session 24
  bias, GELU erf-poly, fp8  the exact GELU with a branch-free erf (Abramowitz & Stegun 7.1.26)

Compiled for sm_90 (Triton 3.6, ptxas), today's epilogue is about 39 PTX instructions an element beyond the
bias-only one (libdevice's erf branches on |x|), the branch-free erf about 20 and the tanh form about 8;
none of the three spills at the 128×256 tile in halves (204, 163, 170 registers).

Each variant is timed at the first ``--tiles`` persistent tiles (`tiles.linear_persistent_configs`; the
best one counts) by CUDA events (median of 5 windows of 50 calls, `fp8_gemm_gelu.time_us`) on the same
fp8 operands, and checked against the fp32 reference. JSON lines go to ``--out``/fp8_epilogue.jsonl; the
table at the end: per shape and variant the best µs, its tile, TFLOP/s, µs beyond "bias, bf16" and that
difference per tile an SM walks.

    python benchmarks/fp8_epilogue.py --out OUT [--shapes bert-base] [--tiles 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from fp8_gemm_gelu import agreement, emit, fastest_by, time_us

from deepgap.measure.quant.linear_kernels import Epilogue, fp8_linear, reference
from deepgap.measure.quant.persistent import programs
from deepgap.measure.quant.tiles import linear_persistent_configs

SHAPES = {"bert-base ff1": (256 * 128, 768, 3072), "vit_b_16 ff1": (256 * 197, 768, 3072)}  # batch 256
VARIANTS = {  # name: (GELU, approximate, fp8 out)
    "bias, bf16": (False, "none", False),
    "bias, fp8": (False, "none", True),
    "bias, GELU erf, bf16": (True, "none", False),
    "bias, GELU erf, fp8": (True, "none", True),
    "bias, GELU tanh, fp8": (True, "tanh", True),
    "bias, GELU erf-poly, fp8": (True, "erf-poly", True),
}
OUT_SCALE = 0.05


def cublaslt_us(a, w, scale, bias) -> float:
    """``torch._scaled_mm`` with the bias, bf16 out: cuBLASLt's GEMM at this shape, the floor beside ours."""
    sa, one, b16 = torch.tensor(scale, device="cuda"), torch.ones((), device="cuda"), bias.bfloat16()
    return time_us(lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=one, bias=b16, out_dtype=torch.bfloat16,
                                            use_fast_accum=True))[0]  # fmt: skip


def variant_rows(a, w, scale, bias, name: str, tiles) -> list[dict]:
    """One row per tile of one variant: µs, spread, agreement with its reference; a failing tile is a row."""
    gelu, approximate, fp8 = VARIANTS[name]
    epi = Epilogue(scale, bias, gelu, OUT_SCALE if fp8 else None, approximate)
    want = reference(a, w, epi)
    rows = []
    for t in tiles:
        call = (a, w, epi, t)
        walk = round(-(-a.shape[0] // t.bm) * (w.shape[0] // t.bn) / programs(a.device), 2)  # tiles per SM
        try:
            got = fp8_linear(*call)
            us, spread = time_us(lambda call=call: fp8_linear(*call))
            rows.append({"variant": name, "tile": t.label, "us": round(us, 1), "spread": round(spread, 3),
                         "tiles_per_sm": walk, **agreement(got, want)})  # fmt: skip
        except Exception as exc:  # a tile that does not build is a row, not a stop
            rows.append({"variant": name, "tile": t.label, "error": str(exc)[:200]})
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Per shape and variant: best µs, tile, TFLOP/s, µs beyond "bias, bf16", and that per tile an SM walks."""
    lines = [f"{'shape / variant':<38} {'us':>7} {'TFLOP/s':>8} {'+us':>7} {'+us/tile':>9}  tile"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        best = fastest_by(rows, shape, "variant")
        floor = best.get("bias, bf16")
        for name, r in best.items():
            extra = r["us"] - floor["us"] if floor and "tile" in r else None
            per_tile = extra / r["tiles_per_sm"] if extra is not None and r.get("tiles_per_sm") else None
            lines.append(f"{shape + ' / ' + name:<38} {r['us']:>7.1f} {r['tflops']:>8.0f} "
                         f"{'' if extra is None else f'{extra:+.1f}':>7} "
                         f"{'' if per_tile is None else f'{per_tile:+.2f}':>9}  {r.get('tile', '')}")  # fmt: skip
    return lines


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--shapes", default="", help="only shapes whose name contains this (e.g. bert-base)")
    ap.add_argument("--tiles", type=int, default=4, help="the first N persistent tiles (0: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    everything = []
    for shape, (m, k, n) in SHAPES.items():
        if args.shapes not in shape:
            continue
        a = (torch.randn(m, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda", generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
        bias, scale = torch.randn(n, device="cuda", generator=g), 1.0 / (1600 * k**0.5)
        rows = [
            {"variant": "cuBLASLt _scaled_mm, bias, bf16", "us": round(cublaslt_us(a, w, scale, bias), 1)}
        ]
        for name in VARIANTS:
            fp8 = VARIANTS[name][2]
            tiles = linear_persistent_configs(k, n, 1 if fp8 else 2)
            rows += variant_rows(a, w, scale, bias, name, tiles[: args.tiles or None])
        everything += emit(rows, args.out / "fp8_epilogue.jsonl", shape=shape, m=m, k=k, n=n)
    print("\n".join(summary(everything)))


if __name__ == "__main__":
    main()
