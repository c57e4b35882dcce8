"""Whether the batch-1 GEMV is bound by its loads or by its arithmetic: one tile, the math taken away in steps.

Why (issue 51, session 40): alone (`fused_variants.py`) the GEMVs read their weights at 0.84-0.90× a
plain streaming read of the same bytes (`hbm_read.py`): gate_up 29.7 µs against 26.3 on one H200, down 15.8
against 13.8, 0.37 ms of the 2.42 ms step over its 32 layers. A one-row GEMV converts every 8-bit code to fp32
(fp8: ``cvt.rn.f16x2.e4m3x2`` then f16 → f32; int8: an I2F each) and multiplies it by x: about 18 codes a
clock an SM at 4.8 TB/s, which the conversion pipe may not keep. The int8 step runs 14% slower than fp8's
over the same bytes (352.9 against 410.2 tokens/s), which points that way.

This kernel has the row GEMV's shape (`gemv.fp8_gemv_row_kernel` at one K step: BN rows × K codes a program,
loaded before PDL's wait) and a ``MATH`` that says what it does with the codes:

- ``load``: XOR of the codes as int32 words (the loads alone: this tile's ceiling);
- ``cvt``: each code converted to fp32 and summed (the conversion, no x);
- ``gemv``: ``Σ w·x`` in fp32 (the GEMV's arithmetic, `gemv.mac`), each step summed across threads;
- ``gemv-in-thread``: the same, each step summed within the thread and across threads once (`gemv.IN_THREAD`);
- ``f16``: the products in fp16 (``w`` to f16, x to f16: one packed multiply for two codes), summed in fp32;
- ``f16x8``: as ``f16``, eight neighbouring products summed in fp16 before the fp32 sum;
- ``bits``: each code made an fp32 with integer ops on its 32-bit word, no conversion instruction (fp8:
  sign and the 7 other bits moved into an fp32's: the code × 2⁻¹²⁰, x taken × 2¹⁰⁰ so no product is subnormal;
  int8: ``(b ^ 0x80) | 0x4B000000`` is 2²³ + 128 + the code as an fp32, less 2²³ + 128), then ``Σ w·x``.

Each is timed as `fused_variants.py` times a GEMV (a CUDA graph of calls over ≥ 400 MB of weight copies,
none hits L2, under PDL), at gate_up's and down's shapes, fp8 and int8.

Measured on one H100 (session 40, results/h100/session40): fp8's arithmetic costs 2% over the tile's loads at
gate_up (39.00 against 38.17 µs) and 7-10% at down; the loads read 117 MB at 3.07 TB/s, 0.92× the H100's rate.
int8's conversion binds: 45.66 against 37.79 at gate_up. ``bits`` helps only int8's gate_up tile (43.10); in
the step it lost everywhere (fp8 328.6 → 264.4 tokens/s), so the engine kept its conversions.

    python benchmarks/gemv_ceiling.py --out OUT     # one JSON line per (shape, codes, tile, math)
"""

# ruff: noqa: N803 - Triton's capitals

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from decode_linear import MIN_BYTES, graph_time_us

from deepgap.measure.quant import gemv

SHAPES = {"gate_up": (4096, 28672), "down": (14336, 4096)}
MATHS = ("load", "cvt", "gemv", "gemv-in-thread", "f16", "f16x8", "bits")
TILES = [(4, 4096, 4), (8, 2048, 8)]  # (BN, BK, warps): the one-step tiles the tuner picks for gate_up, down
CALLS = 24


@triton.jit
def _bits(x_ptr, words, rn, K, BN: tl.constexpr, BK: tl.constexpr, INT8: tl.constexpr, PDL: tl.constexpr):
    """``MATH == "bits"``: Σ w·x with every code made an fp32 by integer ops on its word (module docstring)."""
    rw = tl.arange(0, BK // 4)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k in range(0, K, BK):
        w = tl.load(words + rn[:, None] * (K // 4) + k // 4 + rw[None, :])
        if PDL and k == 0:
            tl.extra.cuda.gdc_wait()
        x = tl.load(x_ptr + k + tl.arange(0, BK)).to(tl.float32)
        if not INT8:
            x = x * 1.2676506002282294e30  # 2^100: no product of a code × 2^-120 is subnormal
        even, odd = tl.split(tl.reshape(x, (BK // 4, 2, 2)))  # x[4j + 2a], x[4j + 2a + 1]
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        prod = _code(w, 0, INT8) * x0[None, :] + _code(w, 1, INT8) * x1[None, :]
        prod += _code(w, 2, INT8) * x2[None, :] + _code(w, 3, INT8) * x3[None, :]
        acc += tl.sum(prod, axis=1)
    return acc if INT8 else acc * 1048576.0  # fp8: 2^-120 · 2^100 = 2^-20 undone


@triton.jit
def _code(w, i: tl.constexpr, INT8: tl.constexpr):
    """Byte ``i`` of each word as an fp32 by integer ops: the int8 code, or the fp8 code × 2⁻¹²⁰."""
    b = (w >> (8 * i)) & 0xFF
    if INT8:
        return ((b ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
    return (((b & 0x80) << 24) | ((b & 0x7F) << 20)).to(tl.float32, bitcast=True)


@triton.jit
def ceiling_kernel(
    x_ptr, w_ptr, out_ptr, K, BN: tl.constexpr, BK: tl.constexpr, MATH: tl.constexpr, PDL: tl.constexpr = True
):
    """``out[band]``: what ``MATH`` makes of program's BN rows × K codes (module docstring), PDL as the GEMV."""
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if MATH == "bits":
        words = w_ptr.to(tl.pointer_type(tl.int32))
        tl.store(out_ptr + rn, _bits(x_ptr, words, rn, K, BN, BK, w_ptr.dtype.element_ty == tl.int8, PDL))
    elif MATH == "load":
        rw = tl.arange(0, BK // 4)
        words = w_ptr.to(tl.pointer_type(tl.int32))
        acc = tl.zeros((BN, BK // 4), dtype=tl.int32)
        for k in range(0, K, BK):
            acc ^= tl.load(words + rn[:, None] * (K // 4) + k // 4 + rw[None, :])
            if PDL and k == 0:
                tl.extra.cuda.gdc_wait()
        tl.store(out_ptr + rn, tl.xor_sum(acc, axis=1).to(tl.float32))
    else:
        rk = tl.arange(0, BK)
        acc = tl.zeros((BN,), dtype=tl.float32)
        runs = gemv.zeros(BN, BK, gemv.IN_THREAD)  # gemv-in-thread's BN × BK/16 partial sums
        for k in range(0, K, BK):
            w = tl.load(w_ptr + rn[:, None] * K + k + rk[None, :])
            if PDL and k == 0:
                tl.extra.cuda.gdc_wait()
            x = tl.load(x_ptr + k + rk)
            if MATH == "cvt":
                acc += tl.sum(w.to(tl.float32), axis=1)
            elif MATH == "gemv":
                acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
            elif MATH == "gemv-in-thread":
                runs = gemv.mac(runs, w, x.to(tl.float32), gemv.IN_THREAD)
            elif MATH == "f16":
                acc += tl.sum((w.to(tl.float16) * x.to(tl.float16)[None, :]).to(tl.float32), axis=1)
            else:
                p = tl.reshape(w.to(tl.float16) * x.to(tl.float16)[None, :], (BN, BK // 8, 8))
                acc += tl.sum(tl.sum(p, axis=2).to(tl.float32), axis=1)
        if MATH == "gemv-in-thread":
            acc = gemv.total(runs, gemv.IN_THREAD)
        tl.store(out_ptr + rn, acc)


def codes_for(n: int, k: int, kind: str, dev) -> torch.Tensor:
    """Random codes in the weight format: fp8 e4m3 within ±440, or int8."""
    if kind == "int8":
        return torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev)
    return (torch.randn(n, k, device=dev) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)


def time_shape(name: str, k: int, n: int, kind: str, out_dir: Path) -> None:
    """Every (tile, math) at one shape and code format: a JSON line each, printed and appended to the jsonl."""
    dev = torch.device("cuda")
    codes = [codes_for(n, k, kind, dev) for _ in range(int(MIN_BYTES // (k * n)) + 1)]
    x = torch.randn(k, device=dev).bfloat16()
    out = torch.empty(n, device=dev)
    for (bn, bk, warps), math in ((t, m) for t in TILES for m in MATHS):
        while k % bk:  # down's 14336 is 3.5 steps of 4096: BK halved until it divides K, as `fit` does
            bk //= 2
        row = {"shape": name, "codes": kind, "tile": [bn, bk, warps], "math": math}

        def call(i, bn=bn, bk=bk, warps=warps, math=math):
            ceiling_kernel[(n // bn,)](
                x, codes[i % len(codes)], out, k, BN=bn, BK=bk, MATH=math, num_warps=warps, num_stages=1,
                launch_pdl=True,
            )  # fmt: skip

        try:
            us = graph_time_us([lambda i=i: call(i) for i in range(CALLS)])
            row |= {"us": round(us, 2), "TBps": round(k * n / us / 1e6, 3)}
        except Exception as e:  # noqa: BLE001 - a variant that does not build is a row, not a stop
            row["error"] = repr(e)[:160]
        print(json.dumps(row), flush=True)
        with (out_dir / "gemv_ceiling.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    for (name, (k, n)), kind in ((s, c) for s in SHAPES.items() for c in ("fp8", "int8")):
        time_shape(name, k, n, kind, Path(args.out))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
