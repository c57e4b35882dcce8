"""What each fold costs the batch-1 GEMV: the same weights with and without the norm, SwiGLU's pairs and RoPE.

Why (issue 51, session 38): on one H100 the step's critical path (`llm_decode_loop.py --timeline`) charged the
o and down GEMVs (a residual add) about a plain read of their bytes (`hbm_read.py` with PDL), but the qkv GEMV
(norm, RoPE's row pairs) 1.28× and gate_up (norm, SwiGLU's row pairs) 1.19×. This times
`gemv_fused.fused_gemv` at qkv's and gate_up's shapes in each combination of the folds, every candidate the
tuner has for it (`Fusion.tiles`), as `decode_linear.py` times a GEMV (a CUDA graph of calls over
≥ 400 MB of weight copies, so none hits L2; here under PDL where the GPU has it, as the step runs), and prints
the best tile's µs and TB/s per variant: the fold that costs is the one whose rows run slower than "plain".
Measured on one H100 (session 38, results/h100/session38): the pairs cost nothing (gate_up 39.55 µs plain, 39.86
with SwiGLU's pairs), the norm 8% (42.77; with both 43.46; qkv 10.39 plain, 11.41 with the norm and RoPE), and the
one-step tiles most (4 × 4096: 39.55 → 52.19 µs with both: 178 registers a thread against 128, half the programs
an SM). Session 39 adds the norm handed over by the row's writer (`norm_handoff`): the readers with it
(``handed+swiglu``, ``handed+rope``: the plain loop, 128 registers at sm_90) and the writers (o, down) with and
without the hand-off's stores. Session 40 adds the tiles that sum each step within the thread
(`gemv.IN_THREAD_TILES`, among the tuner's candidates since session 41).

    python benchmarks/fused_variants.py --out OUT     # one JSON line per (shape, variant, tile)
"""

# ruff: noqa: B023 - every closure over a loop's variables is called within that iteration (graph capture)

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
from decode_linear import MIN_BYTES, graph_time_us

from deepgap.measure.quant import launch
from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv
from deepgap.measure.quant.norm_handoff import HandOff, squares_width

# Llama-3.1-8B's (K, N): the norm's readers, then its writers (`norm_handoff`)
SHAPES = {"qkv": (4096, 6144), "gate_up": (4096, 28672), "o": (4096, 4096), "down": (14336, 4096)}
CALLS = 24


def variants(name: str, k: int, n: int, dev) -> dict[str, Fusion]:
    """The folds to time at ``name``'s shape: none, the norm, the pairs (SwiGLU or RoPE), both; the norm handed
    over with the pairs. At the writers' shapes: the residual add, and with the next norm handed over too."""
    gamma = (torch.rand(k, device=dev) + 0.5).bfloat16()
    handed = torch.rand(squares_width(k), device=dev) * 4  # the writer's square sums: x ⊙ γ is the row read
    if name in ("o", "down"):
        residual = torch.randn(1, n, device=dev).bfloat16()
        hand = HandOff.to((torch.rand(n, device=dev) + 0.5).bfloat16())
        return {"residual": Fusion(residual=residual), "residual+hand": Fusion(residual=residual, hand=hand)}
    pairs, pairing = "swiglu", {"swiglu": True}  # gate_up's rows in pairs, or qkv's (RoPE)
    if name == "qkv":
        cos, sin = torch.ones(1, 128, device=dev).bfloat16(), torch.zeros(1, 128, device=dev).bfloat16()
        pos = torch.tensor([100], device=dev)
        cache = [torch.zeros(1, 8, 256, 128, device=dev).bfloat16() for _ in range(2)]
        pairs, pairing = "rope", {"rope": RopeWrite(cos, sin, pos, *cache, 32)}
    return {
        "plain": Fusion(),
        "norm": Fusion(gamma, 1e-5),
        pairs: Fusion(**pairing),
        f"norm+{pairs}": Fusion(gamma, 1e-5, **pairing),
        f"handed+{pairs}": Fusion(eps=1e-5, handed=handed, **pairing),
    }


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    pdl = launch.pdl if torch.cuda.get_device_capability() >= (9, 0) else contextlib.nullcontext
    torch.manual_seed(0)
    best = {}
    for name, (k, n) in SHAPES.items():
        copies = int(MIN_BYTES // (k * n)) + 1
        codes = [
            (torch.randn(n, k, device=dev) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
            for _ in range(copies)
        ]
        scale = [torch.rand(n, device=dev) / 40 for _ in range(copies)]
        x = torch.randn(1, k, device=dev).bfloat16()
        for variant, fusion in variants(name, k, n, dev).items():
            for tile in fusion.tiles():
                calls = [
                    lambda i=i % copies, t=tile, f=fusion: fused_gemv(x, codes[i], scale[i], f, t)
                    for i in range(CALLS)
                ]
                try:
                    with pdl():
                        us = graph_time_us(calls)
                except Exception as e:  # noqa: BLE001 - a tile that does not build is a row, not a stop
                    print(
                        json.dumps(
                            {"shape": name, "variant": variant, "tile": str(tile), "error": repr(e)[:160]}
                        )
                    )
                    continue
                row = {"shape": name, "variant": variant, "tile": str(tile), "us": round(us, 2),
                       "TBps": round(k * n / us / 1e6, 3), "pdl": pdl is launch.pdl}  # fmt: skip
                with (Path(args.out) / "fused_variants.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
                if (name, variant) not in best or us < best[(name, variant)]["us"]:
                    best[(name, variant)] = row
    for row in best.values():
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
