"""Time the int8-pixel stem with its max-pool in the kernel (`quant.stem_pool`) against the unfused pair.

Why: the unfused int8 stem (`quant.stem_int8.stem`: the convolution kernel, then `stem_kernels.pool8`) writes
the 112×112×64 pre-pool output and reads it back (205 MB each way at batch 256, 224²); the fused kernel
writes only the pooled quarter but computes 1.31× the convolution (its tiles' halo). Which wins is a
measurement; the engine times both per configuration anyway (`stem_choice.STEM_VARIANTS`), this script
shows the margin at batch 1, 256 and 1024 in about a minute. Inputs are resident int8 pixels (no
quantizing pass in the timed call), every tile the engine offers, int8 and fp8 outputs; each output is
compared bit for bit with the unfused stem at its default tile. Prints one JSON line per variant and one
summary line per (batch, format) with the best of each side and their ratio.

    PYTHONPATH=src python benchmarks/stem_pool.py --batch-sizes 1,256,1024
"""

from __future__ import annotations

import argparse
import json

import torch

from deepgap.measure.quant import stem_int8, stem_pool
from deepgap.measure.quant.stem_choice import STEM_VARIANTS
from deepgap.measure.quant.tiles import stem_tile_args, stem_tile_name
from deepgap.measure.quant.tuning import time_s


def _case(batch: int, res: int, out_fmt: str):
    """(callables by variant name, the reference output): resident pixels, ResNet-like stem weights."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, res, res, device="cuda", generator=g).half()
    pixels = stem_int8.quantize_image(x.contiguous(memory_format=torch.channels_last), 0.03)
    del x
    w_i8, _ = stem_int8.pack_weights(torch.randn(64, 3, 7, 7, dtype=torch.float64) * 0.2)
    alpha = torch.rand(64, device="cuda", generator=g) * 0.01 + 0.001
    beta = torch.randn(64, device="cuda", generator=g)
    args = (pixels, w_i8.cuda(), 7, 2, 3, alpha, beta, out_fmt)
    fns = {}
    for kernel, _, cfg in STEM_VARIANTS:
        if kernel == "int8":
            fns[f"unfused {stem_tile_name(cfg)}"] = lambda cfg=cfg: stem_int8.stem(
                *args, **stem_tile_args(cfg)
            )
        elif kernel == "int8pool":
            fns["pool{}x{}+{}w{}s".format(*cfg)] = lambda cfg=cfg: stem_pool.stem(*args, cfg[:2], *cfg[2:])
    return fns, stem_int8.stem(*args, block_m=128, num_warps=4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="1,256,1024")
    p.add_argument("--formats", default="int8,fp8")
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    for bs in [int(b) for b in a.batch_sizes.split(",")]:
        for fmt in a.formats.split(","):
            fns, ref = _case(bs, a.resolution, fmt)
            best: dict[str, tuple[float, str]] = {}
            for name, fn in fns.items():
                try:
                    equal = torch.equal(fn().float(), ref.float())
                    ms = time_s(fn, reps=a.reps) * 1e3
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(
                        json.dumps({"batch": bs, "out_fmt": fmt, "variant": name, "error": repr(exc)[:200]})
                    )
                    continue
                row = {"batch": bs, "out_fmt": fmt, "variant": name, "ms": round(ms, 4), "bit_equal": equal}
                print(json.dumps(row), flush=True)
                side = "fused" if name.startswith("pool") else "unfused"
                if equal and ms < best.get(side, (float("inf"), ""))[0]:
                    best[side] = (ms, name)
            if len(best) == 2:
                (fu, fname), (uu, uname) = best["fused"], best["unfused"]
                summary = {"batch": bs, "out_fmt": fmt, "best_fused": fname, "fused_ms": round(fu, 4),
                           "best_unfused": uname, "unfused_ms": round(uu, 4),
                           "fused_over_unfused_time": round(fu / uu, 3)}  # fmt: skip
                print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
