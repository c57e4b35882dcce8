"""Time ResNet-50's 1×1 stride-1 convolutions: today's grouped kernel (its tuned tile) vs the persistent TMA one.

Why: the per-layer table names the memory-bound 1×1 convolutions of layer1/layer2 (issue 47), and
`quant.persistent` is a candidate for them that no GPU has timed yet. This times each distinct 1×1
stride-1 shape of ResNet-50 at 224² as the engine runs it (int8 or fp8 in and out, bias, ReLU, the residual
where the layer has one): every tile `tiles.candidate_configs` offers `kernels.conv_gemm_kernel`, of which
the fastest is today's tuned tile, and the persistent kernel's tiles (`tiles.persistent_configs`; with
``--sweep`` a wider grid). Each persistent output is compared with the grouped kernel's first.

    python benchmarks/gemm_1x1.py --out $OUT/gemm_1x1.jsonl                # batch 256, int8 and fp8
    python benchmarks/gemm_1x1.py --layers layer1,layer2 --sweep --out $OUT/gemm_1x1_sweep.jsonl

One JSON line per (layer, precision, kernel): the grouped kernel's tuned tile, then each persistent tile,
with µs (median of CUDA-graph replays, `tuning.time_s`), TOPS, GB/s over the fewest bytes (input, weights,
residual, output once), the speed-up over the tuned grouped tile and whether the outputs agree. A table
last. Unmeasured so far: docs/quant.md says what the first GPU run finds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys

import torch

# name, H = W at 224², C_in, C_out, residual: each distinct 1×1 stride-1 convolution of ResNet-50 once
SHAPES = [
    ("layer1.0.conv1", 56, 64, 64, False),
    ("layer1.0.conv3", 56, 64, 256, True),
    ("layer1.0.downsample", 56, 64, 256, False),
    ("layer1.1.conv1", 56, 256, 64, False),
    ("layer2.0.conv1", 56, 256, 128, False),
    ("layer2.0.conv3", 28, 128, 512, True),
    ("layer2.1.conv1", 28, 512, 128, False),
    ("layer3.0.conv1", 28, 512, 256, False),
    ("layer3.0.conv3", 14, 256, 1024, True),
    ("layer3.1.conv1", 14, 1024, 256, False),
    ("layer4.0.conv1", 14, 1024, 512, False),
    ("layer4.0.conv3", 7, 512, 2048, True),
    ("layer4.1.conv1", 7, 2048, 512, False),
]
HBM_GBPS = 4800  # H200's datasheet bandwidth: a faster row was served from L2 (said in its note)


def _layer(qfmt: str, cin: int, cout: int, has_res: bool):
    """A quantized 1×1 layer as the engine builds one (per-channel weights, static scales), on the GPU."""
    from deepgap.measure.quant import layers
    from deepgap.measure.quant.fold import ConvNode

    g = torch.Generator().manual_seed(cin * 7 + cout)
    w = torch.randn(cout, cin, 1, 1, generator=g) * (2.0 / cin) ** 0.5
    node = ConvNode(
        "t", "a", "b", w, torch.randn(cout, generator=g) * 0.1, 1, 0, True, "r" if has_res else None
    )
    return layers.make_qconv(
        node, qfmt, "q", {"a": qfmt, "b": qfmt, "r": qfmt}, {"a": 0.05, "b": 0.05, "r": 0.05}
    )


def sweep_tiles(n: int, c: int, has_res: bool) -> list:
    """A wider grid of persistent tiles (``--sweep``): block shapes, stages, TMA epilogue, programs per SM.

    Warps follow the accumulator (8 from 128×128 up, as in `tiles.candidate_configs`); a residual layer
    keeps ≤ 64 accumulators per thread, beyond which its epilogue spilled on sm_90; one of a single K step
    also comes with its residual prefetched a tile ahead.
    """
    from deepgap.measure.quant.tiles import TileConfig

    out = []
    for bm, bn, stages, epi, per_sm in itertools.product(
        (64, 128), (64, 128, 256), (2, 3, 4), (False, True), (1, 2)
    ):
        warps = 8 if bm * bn >= 128 * 128 else 4
        if per_sm > 1 and warps > 4:  # two 8-warp programs of this size leave no registers to share
            continue
        cfg = TileConfig(bm, bn, min(c, 128), 8, warps, stages, persistent=per_sm, tma_epilogue=epi)
        if cfg.fits(n, c) and not (has_res and bm * bn // (32 * warps) > 64):
            out.append(cfg)
            if has_res and c <= 128 and not epi:  # the residual prefetched a tile ahead
                out.append(dataclasses.replace(cfg, early_res=True))
    return out


def compile_all(calls) -> None:
    """Compile every launch in ``calls`` at once on a thread pool (`launch.compile_only`), before timing.

    Why: a sweep is dozens of kernels per shape, each compiled in turn at its first launch otherwise; as in
    `quant.precompile`, a Triton without `AsyncCompileMode` just compiles them at first launch.
    """
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return
    from concurrent.futures import ThreadPoolExecutor

    from deepgap.measure.quant import launch

    with ThreadPoolExecutor(16) as pool, AsyncCompileMode(pool, ignore_errors=True), launch.compile_only():
        for call in calls:
            with contextlib.suppress(Exception):  # the timing loop meets it again and reports it
                call()


def _row(name, qfmt, m, n, c, has_res, kernel, cfg, seconds, nbytes, **extra) -> dict:
    tops = 2 * m * n * c / seconds / 1e12
    gbps = nbytes / seconds / 1e9
    row = {
        "layer": name, "precision": qfmt, "m": m, "n": n, "k": c, "residual": has_res, "kernel": kernel,
        "tile": cfg.label, "us": round(seconds * 1e6, 2), "tops": round(tops, 1), "gbps": round(gbps),
        **extra,
    }  # fmt: skip
    if gbps > HBM_GBPS:
        row["note"] = f"above HBM's {HBM_GBPS} GB/s: operands served from L2 across graph replays"
    return row


def _agree(out: torch.Tensor, ref: torch.Tensor, qfmt: str) -> bool:
    """int8: identical (same int32 sums, same fp32 epilogue); fp8: ≥ 99% identical, the rest 1-ulp flips."""
    if qfmt == "int8":
        return bool(torch.equal(out, ref))
    o, r = out.float(), ref.float()
    return bool(torch.isfinite(o).all()) and float((o == r).float().mean()) >= 0.99


def measure(name, h, cin, cout, has_res, qfmt, batch, reps, sweep, device="cuda") -> list[dict]:
    """The grouped kernel's tiles (the fastest is the tuned one) and the persistent tiles of one shape.

    ``device`` "cpu" runs every kernel in the Triton interpreter: a dry run of this script, not a timing.
    """
    from deepgap.measure.quant import kernels, persistent
    from deepgap.measure.quant.tiles import candidate_configs, persistent_configs
    from deepgap.measure.quant.tuning import rand_act, time_s

    lay = _layer(qfmt, cin, cout, has_res).to(device)
    m = batch * h * h
    x = rand_act(m, cin, qfmt, device)
    res = rand_act(m, cout, qfmt, device) if has_res else None
    nbytes = m * cin + cin * cout + m * cout * (2 if has_res else 1)

    def run(mod, cfg):
        return lambda: mod.conv_gemm(
            x, (batch, h, h), lay.w_q, 1, 1, 0, lay.alpha, lay.beta, qfmt, True, cfg, res, lay.gamma
        )

    grouped = candidate_configs(m, cout, cin, qfmt, has_res)
    cc = torch.cuda.get_device_capability() if device == "cuda" else None
    tiles = persistent_configs(lay.node, m, cc, qfmt)
    tiles += [t for t in sweep_tiles(cout, cin, has_res) if t not in tiles] if sweep else []
    compile_all([run(kernels, cfg) for cfg in grouped] + [run(persistent, cfg) for cfg in tiles])
    times = {cfg: time_s(run(kernels, cfg), reps, device) for cfg in grouped}
    best = min(times, key=times.get)
    ref = run(kernels, best)()
    rows = [
        _row(name, qfmt, m, cout, cin, has_res, "grouped", best, times[best], nbytes, candidates=len(grouped))
    ]
    for cfg in tiles:
        try:
            agree = _agree(run(persistent, cfg)(), ref, qfmt)
            sec = time_s(run(persistent, cfg), reps, device)
            extra = {
                "speedup": round(times[best] / sec, 3),
                "agrees": agree,
                "programs": persistent.programs(x.device) * cfg.persistent,
            }
            rows.append(_row(name, qfmt, m, cout, cin, has_res, "persistent", cfg, sec, nbytes, **extra))
        except Exception as exc:  # noqa: BLE001 - a tile that fails is reported, the others go on
            rows.append({"layer": name, "precision": qfmt, "kernel": "persistent", "tile": cfg.label,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
            if device == "cuda":
                torch.cuda.synchronize()
    return rows


def _table(rows: list[dict]) -> None:
    print(f"\n{'layer':20} {'prec':4} {'kernel':10} {'tile':36} {'µs':>8} {'TOPS':>6} {'GB/s':>6} {'×':>6}")
    for r in rows:
        if "error" in r:
            print(
                f"{r['layer']:20} {r['precision']:4} {r['kernel']:10} {r['tile']:36} ERROR {r['error'][:50]}"
            )
            continue
        x = f"{r['speedup']:.3f}" if "speedup" in r else "1"
        flag = "" if r.get("agrees", True) else "  DIFFERS"
        print(
            f"{r['layer']:20} {r['precision']:4} {r['kernel']:10} {r['tile']:36} {r['us']:8.1f} {r['tops']:6.0f} "
            f"{r['gbps']:6.0f} {x:>6}{flag}"
        )


def main() -> int:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precisions", default="int8,fp8")
    p.add_argument("--layers", default="", help="comma-separated layer names or prefixes (default: all)")
    p.add_argument("--sweep", action="store_true", help="a wider grid of persistent tiles per shape")
    p.add_argument("--reps", type=int, default=20, help="calls per CUDA-graph replay")
    p.add_argument("--out", default=None, help="write the JSON lines here (replaced)")
    a = p.parse_args()
    precisions = a.precisions.split(",")
    wanted = [w for w in a.layers.split(",") if w]
    shapes = [s for s in SHAPES if not wanted or any(s[0].startswith(w) for w in wanted)]
    problem = (
        "needs a CUDA GPU of compute capability ≥ 9.0 (TMA); run it on the device machine"
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0)
        else f"--precisions takes int8,fp8; got {a.precisions}"
        if not set(precisions) <= {"int8", "fp8"}
        else f"--layers {a.layers} names no 1×1 layer; choose among {', '.join(s[0] for s in SHAPES)}"
        if not shapes
        else "--batch and --reps must be ≥ 1"
        if a.batch < 1 or a.reps < 1
        else None
    )
    if problem:
        print(f"gemm_1x1: {problem}", file=sys.stderr)
        return 2
    os.environ["DEEPGAP_QUANT_GEMM"] = "persistent"  # the default: tiles.persistent_configs offers its tiles
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": a.batch}
    import triton

    env["triton"] = triton.__version__
    rows: list[dict] = []
    with open(a.out, "w") if a.out else contextlib.nullcontext() as out:

        def emit(row: dict) -> None:
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()

        emit({"env": env})
        for (name, h, cin, cout, has_res), qfmt in itertools.product(shapes, precisions):
            for row in measure(name, h, cin, cout, has_res, qfmt, a.batch, a.reps, a.sweep):
                emit(row)
                rows.append(row)
    _table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
