"""How fast one H200 can read its HBM, per kernel size: the ceiling the batch-1 decode's GEMVs are held to.

Why: issue 51's batch-1 goal (480 tok/s for an 8B fp8 decoder) needs ~7.5 GB of weights read at about
4.3 TB/s, 0.9x the 4.8 TB/s datasheet. Whether that is reachable at all is a property of the memory
system, not of deepgap's GEMV: this times a plain streaming read (each program sums its slice of bytes
with 16-byte loads and writes one number) at the sizes of Llama-3.1-8B's weight matrices in fp8 (o 16.8 MB,
qkv 25 MB, down 58.7 MB, gate_up 117 MB, lm_head 525 MB) and at 2 GB, in a CUDA graph of back-to-back
calls over enough copies (>= 400 MB) that no call finds its bytes in L2, as `decode_linear.py` times the
GEMVs. The best configuration per size gives TB/s and the per-call time beyond the bytes at the large
sizes' rate: the fixed cost of one kernel boundary that a GEMV of that size pays too. With ``--pdl`` the
calls are also captured with programmatic dependent launch (each program's first loads before its wait).

    python benchmarks/hbm_read.py --out OUT     # one JSON line per (size, config) to OUT/hbm_read.jsonl
"""

# ruff: noqa: N803

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

SIZES_MB = {"o": 16.78, "qkv": 25.17, "down": 58.72, "gate_up": 117.44, "lm_head": 525.3, "2GB": 2000.0}
MIN_BYTES = 400e6
# (bytes per program per step, steps per program, warps): ~the row GEMV's 4 KB steps and larger ones
CONFIGS = [
    (4096, 4, 4),
    (4096, 16, 4),
    (8192, 8, 4),
    (8192, 8, 8),
    (16384, 4, 8),
    (16384, 16, 8),
    (32768, 8, 8),
]


@triton.jit
def read_kernel(src, out, n_bytes, BLOCK: tl.constexpr, STEPS: tl.constexpr, PDL: tl.constexpr):
    """out[pid] = the XOR of this program's STEPS x BLOCK bytes (as int32 words), so no load is dead."""
    pid = tl.program_id(0)
    words = src.to(tl.pointer_type(tl.int32))
    base = pid.to(tl.int64) * (STEPS * BLOCK // 4)
    r = tl.arange(0, BLOCK // 4)
    acc = tl.zeros((BLOCK // 4,), dtype=tl.int32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        acc ^= tl.load(words + base + r, mask=(base + r) * 4 < n_bytes, other=0)
        tl.extra.cuda.gdc_wait()
    for s in range(PDL * 1, STEPS):
        offs = base + s * (BLOCK // 4) + r
        acc ^= tl.load(words + offs, mask=offs * 4 < n_bytes, other=0)
    tl.store(out + pid, tl.xor_sum(acc, axis=0))


def time_us(bufs, block: int, steps: int, warps: int, pdl: bool, calls: int = 24) -> float:
    """µs per read of one buffer: ``calls`` reads cycling over ``bufs`` in one graph, median of 5 windows."""
    n = bufs[0].numel()
    grid = (triton.cdiv(n, block * steps),)
    outs = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    extra = {"launch_pdl": True} if pdl else {}

    def one(i):
        read_kernel[grid](
            bufs[i % len(bufs)], outs, n, BLOCK=block, STEPS=steps, PDL=pdl, num_warps=warps, **extra
        )

    for i in range(2):
        one(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            one(i)
    g.replay()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(4):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (4 * calls))
    return sorted(times)[2]


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pdl", action="store_true", help="also time each configuration with PDL")
    args = ap.parse_args()
    path = Path(args.out) / "hbm_read.jsonl"
    for name, mb in SIZES_MB.items():
        n = int(mb * 1e6) // 16 * 16
        bufs = [
            torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
            for _ in range(max(1, int(MIN_BYTES // n) + 1))
        ]
        for block, steps, warps in CONFIGS:
            for pdl in (False, True) if args.pdl else (False,):
                us = time_us(bufs, block, steps, warps, pdl)
                row = {"size": name, "MB": round(n / 1e6, 2), "block": block, "steps": steps, "warps": warps,
                       "pdl": pdl, "us": round(us, 2), "TBps": round(n / us / 1e6, 3)}  # fmt: skip
                print(json.dumps(row), flush=True)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        del bufs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
