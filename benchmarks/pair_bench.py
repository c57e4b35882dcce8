"""The fused pair of 1×1 convolutions (`quant.pair`) against the two layers run separately, per ResNet-50 pair.

    python benchmarks/pair_bench.py --batch-sizes 1024,1 --precisions fp8,int8 --out pair.jsonl

For each pair shape that ResNet-50 has (a block's ``conv3`` with its residual, then the next block's
``conv1``), at each batch: every tile the tuner would time for each layer alone (`tuning.candidates`'s
grouped, persistent and split-K tiles), the fastest kept, summed; then every `pair.pair_configs` tile of
the fused kernel. Each candidate is first checked against the exact reference on a slice (failures are
reported, not timed). Times are CUDA-graph medians (`tuning.time_s`), as the tuner takes them. One JSON
line per (shape, batch, precision) with the separate and fused times and the ratio separate ÷ fused.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from deepgap.measure.quant import layers, pair, split_k, tuning
from deepgap.measure.quant.fold import ConvNode
from deepgap.measure.quant.persistent import programs
from deepgap.measure.quant.tiles import candidate_configs, persistent_configs

# name, side (H = W), K1 = C_mid, N1 = 4·C_mid, N2 = the next block's C_mid
SHAPES = [
    ("layer1.x.conv3>conv1", 56, 64, 256, 64),
    ("layer1.2.conv3>layer2.0.conv1", 56, 64, 256, 128),
    ("layer2.x.conv3>conv1", 28, 128, 512, 128),
    ("layer2.3.conv3>layer3.0.conv1", 28, 128, 512, 256),
    ("layer3.x.conv3>conv1", 14, 256, 1024, 256),
]


def make_pair(qfmt: str, k1: int, n1: int, n2: int, seed: int = 0):
    """Two quantized 1×1 layers chained as in a bottleneck: (first with a residual, second)."""
    g = torch.Generator().manual_seed(seed)
    a = ConvNode("first", "a", "t", torch.randn(n1, k1, 1, 1, generator=g) * 0.1, torch.randn(n1, generator=g),
                 1, 0, True, "r")  # fmt: skip
    b = ConvNode("second", "t", "u", torch.randn(n2, n1, 1, 1, generator=g) * 0.1, torch.randn(n2, generator=g),
                 1, 0, True, None)  # fmt: skip
    fmts = dict.fromkeys("atur", qfmt)
    scales = {"a": 0.05, "t": 0.08, "u": 0.1, "r": 0.03}
    return (layers.make_qconv(a, qfmt, "q", fmts, scales).to("cuda"),
            layers.make_qconv(b, qfmt, "q", fmts, scales).to("cuda"))  # fmt: skip


def best_alone(layer, x, res, reps: int, nhw=None) -> tuple[float, str, list[str]]:
    """(seconds, tile label, errors) of the fastest checked tile for one layer alone (grouped, persistent, split-K).

    ``nhw``: the input's (images, H, W); None: a 1×1 layer's rows as one column (1, M, 1).
    """
    from deepgap.measure.quant import kernels, persistent

    n = layer.node
    nb, h, w = nhw or (1, x.shape[0], 1)
    k, s, p = n.kernel_size, n.stride, n.padding
    m = nb * ((h + 2 * p - k) // s + 1) * ((w + 2 * p - k) // s + 1)
    cfgs = candidate_configs(m, n.cout, n.cin, layer.qfmt, n.residual is not None)
    cfgs += persistent_configs(n, m, torch.cuda.get_device_capability(), layer.qfmt, programs(x.device))
    cfgs += split_k.split_configs(cfgs, m, n.cout, k * k * n.cin, programs(x.device))
    ref_nhw = (min(nb, 2), h, w) if nhw else (1, min(m, 2 * 3136), 1)
    rows = ref_nhw[0] * h * w if nhw else ref_nhw[1]
    out_rows = rows * m // (nb * h * w)
    r_ref = None if res is None else res[:out_rows]
    ref = layers.conv_reference(layer, x[:rows], ref_nhw, r_ref)
    best, errors = (float("inf"), ""), []
    for cfg in cfgs:
        launch = persistent.conv_gemm if cfg.persistent else kernels.conv_gemm

        def fn(x=x, res=res, cfg=cfg, launch=launch, shape=(nb, h, w) if nhw else (1, x.shape[0], 1)):
            return launch(x, shape, layer.w_q, k, s, p, layer.alpha, layer.beta, layer.out_fmt, n.relu, cfg, res,
                          layer.gamma)  # fmt: skip

        got = tuning.checked_time(
            lambda fn=fn: tuning._agree(fn(x[:rows], r_ref, shape=ref_nhw), ref, layer.out_fmt),
            fn,
            reps,
            x.device,
        )
        if isinstance(got, str):
            errors.append(f"{cfg.label}: {got}")
        else:
            best = min(best, (got, cfg.label))
    return best[0], best[1], errors


def fused_time(first, second, x, res, rows, tr, ur, cfg, reps) -> float | str:
    """Seconds of the fused pair in tile ``cfg``, or why it failed its check on the first ``rows`` rows."""

    def check() -> str | None:
        tk, uk = pair.run(first, second, x[:rows], res[:rows], cfg)
        why = tuning._agree(tk, tr, first.out_fmt) or tuning._agree(uk, ur, second.out_fmt)
        if why:  # where: T or U, the share of rows with a wrong or non-finite element, the first such row
            for name, o, r in (("T", tk, tr), ("U", uk, ur)):
                bad = ~torch.isfinite(o.float()) | (
                    (o.float() - r.float()).abs() > 1e-3 + 0.25 * r.float().abs()
                )
                rows_bad = bad.any(1).nonzero()
                if len(rows_bad):
                    share = float(bad.float().mean())
                    why += f"; {name}: {share:.2%} elements, {len(rows_bad)} rows, first {int(rows_bad[0])}"
        return why

    return tuning.checked_time(check, lambda: pair.run(first, second, x, res, cfg), reps, x.device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1024,1")
    p.add_argument("--precisions", default="fp8,int8")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default="pair.jsonl")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("pair_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    with open(args.out, "w") as fh, torch.inference_mode():
        for qfmt in args.precisions.split(","):
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                for name, side, k1, n1, n2 in SHAPES:
                    if not pair.pair_configs(k1, n1, n2, qfmt):
                        continue
                    first, second = make_pair(qfmt, k1, n1, n2)
                    m = batch * side * side
                    x, res = tuning.rand_act(m, k1, qfmt, "cuda"), tuning.rand_act(m, n1, qfmt, "cuda")
                    t = tuning.rand_act(m, n1, qfmt, "cuda")
                    s1, l1, e1 = best_alone(first, x, res, args.reps)
                    s2, l2, e2 = best_alone(second, t, None, args.reps)
                    rows = min(m, 2 * side * side)
                    tr, ur = pair.reference(first, second, x[:rows], res[:rows])
                    fused = {cfg.label: fused_time(first, second, x, res, rows, tr, ur, cfg, args.reps)
                             for cfg in pair.pair_configs(k1, n1, n2, qfmt)}  # fmt: skip
                    times = {k: v for k, v in fused.items() if isinstance(v, float)}
                    best = min(times.items(), key=lambda kv: kv[1]) if times else (None, None)
                    row = {"pair": name, "batch": batch, "precision": qfmt, "first_s": s1, "first_tile": l1,
                           "second_s": s2, "second_tile": l2, "separate_s": s1 + s2, "fused": fused,
                           "best_fused": best[0], "best_fused_s": best[1],
                           "separate_over_fused": (s1 + s2) / best[1] if best[1] else None,
                           "errors": e1 + e2}  # fmt: skip
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    sep = f"{(s1 + s2) * 1e6:8.1f}"
                    print(f"{qfmt} b{batch:<5} {name:32} separate {sep} us ({l1} + {l2})  "
                          f"fused {best[1] * 1e6 if best[1] else float('nan'):8.1f} us ({best[0]})  "
                          f"x{row['separate_over_fused'] or 0:.3f}", flush=True)  # fmt: skip
                    del x, res, t
    return 0


if __name__ == "__main__":
    sys.exit(main())
