"""The TMA-fed 3×3 convolution (`quant.conv_tma`) against the grouped kernel's tiles, per ResNet-50 3×3 shape.

    python benchmarks/conv_tma_bench.py --batch-sizes 1024,256 --precisions fp8,int8 --out conv_tma.jsonl

For each 3×3 shape of ResNet-50 (layer1–layer4 ``conv2``, stride 1, and each stage's first at stride 2), at each
batch: every tile the tuner offers the layer without this kernel (grouped and split-K, `pair_bench.best_alone`),
the fastest kept; then every `conv_tma.tma_configs` tile (DEEPGAP_QUANT_CONV_TMA is set on here). Each
candidate is checked against the exact reference first; times are CUDA-graph medians as the tuner takes them.
One JSON line per (shape, batch, precision): both bests, every TMA tile's time or failure, the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from deepgap.measure.quant import conv_tma, layers, tuning
from deepgap.measure.quant.fold import ConvNode

SHAPES = [  # name, input side, channels, stride
    ("layer1.x.conv2", 56, 64, 1),
    ("layer2.x.conv2", 28, 128, 1),
    ("layer3.x.conv2", 14, 256, 1),
    ("layer4.x.conv2", 7, 512, 1),
    ("layer2.0.conv2", 56, 128, 2),
    ("layer3.0.conv2", 28, 256, 2),
    ("layer4.0.conv2", 14, 512, 2),
]


def main(argv: list[str] | None = None) -> int:
    from pair_bench import best_alone  # benchmarks/ on sys.path when run as a script

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1024,256")
    p.add_argument("--precisions", default="fp8,int8")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--layers", default="", help="only the shapes whose name holds this text (e.g. layer2)")
    p.add_argument("--out", default="conv_tma.jsonl")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("conv_tma_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    with open(args.out, "w") as fh, torch.inference_mode():
        for qfmt in args.precisions.split(","):
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                for name, h, c, st in (s for s in SHAPES if args.layers in s[0]):
                    g = torch.Generator().manual_seed(h)
                    node = ConvNode(name, "a", "b", torch.randn(c, c, 3, 3, generator=g) * (2.0 / (9 * c)) ** 0.5,
                                    torch.randn(c, generator=g) * 0.1, st, 1, True)  # fmt: skip
                    lay = layers.make_qconv(
                        node, qfmt, "q", dict.fromkeys("ab", qfmt), {"a": 0.05, "b": 0.05}
                    )
                    lay = lay.to("cuda")
                    x = tuning.rand_act(batch * h * h, c, qfmt, "cuda")
                    nhw = (batch, h, h)
                    os.environ.pop(conv_tma.ENV, None)
                    grouped_s, grouped_tile, errors = best_alone(lay, x, None, args.reps, nhw=nhw)
                    os.environ[conv_tma.ENV] = "on"
                    tma = {}
                    ref_b = min(batch, 2)
                    ref = layers.conv_reference(lay, x[: ref_b * h * h], (ref_b, h, h), None)
                    for cfg in conv_tma.tma_configs(
                        node, h, h, torch.cuda.get_device_capability(), explore=True
                    ):

                        def fn(x=x, nhw=nhw, cfg=cfg, lay=lay, qfmt=qfmt, st=st):
                            return conv_tma.conv_gemm(
                                x, nhw, lay.w_q, 3, st, 1, lay.alpha, lay.beta, qfmt, True, cfg
                            )

                        def check(fn=fn, x=x, h=h, ref_b=ref_b, ref=ref, qfmt=qfmt):
                            return tuning._agree(fn(x[: ref_b * h * h], (ref_b, h, h)), ref, qfmt)

                        tma[cfg.label] = tuning.checked_time(check, fn, args.reps, "cuda")
                    times = {k: v for k, v in tma.items() if isinstance(v, float)}
                    best = min(times.items(), key=lambda kv: kv[1]) if times else (None, None)
                    row = {"layer": name, "batch": batch, "precision": qfmt, "grouped_s": grouped_s,
                           "grouped_tile": grouped_tile, "tma": tma, "best_tma": best[0], "best_tma_s": best[1],
                           "grouped_over_tma": grouped_s / best[1] if best[1] else None, "errors": errors}  # fmt: skip
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(f"{qfmt} b{batch:<5} {name:16} grouped {grouped_s * 1e6:8.1f} us ({grouped_tile})  "
                          f"tma {best[1] * 1e6 if best[1] else float('nan'):8.1f} us ({best[0]})  "
                          f"x{row['grouped_over_tma'] or 0:.3f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
