"""Bare loops over a transformer's fp16 engines and its fp8/int8 Linear variants, each one CUDA graph.

Why a bare script beside `deepgap run`: it weighs the quant Linear path's choices (activation scales per
row or static, fp8 or int8, the compiler's mode) and finds where a transformer's fp16 time goes (ViT's
``nn.MultiheadAttention`` under torch.compile), with nothing of the harness in between; `deepgap run
--engines quant` then measures the chosen default and this loop cross-checks its number.

    python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 --out OUT [--variants ...]

Each variant: build (seeded, as deepgap builds), convert, compile, capture one CUDA graph, then the median
of ``--repeats`` windows of ``--iters`` replays timed by CUDA events; relL2 and cosine against fp32 eager.
Writes ``transformer_quant.jsonl`` (one line per variant) under ``--out``. The ``-fused`` variants run the
MLP's first Linear, GELU and the next quantization as one Triton kernel on the grouped GEMM core
(``fp8-tensor-fast-fused``), the persistent TMA core (``-fused-persistent``) or each shape's fastest tile of
both (``-fused-tuned``); ``-fused-engine`` is what the quant engine runs with ``DEEPGAP_QUANT_FUSED=tuned``
(`linear_choice.apply`: the MLP tuned, every other fp8 Linear on cuBLASLt or a Triton tile, whichever is
faster at its shape);
a ``-tanh`` ending runs the fused GELU's tanh form, ``-erfpoly`` the exact one with a branch-free erf.
``--fused-tile`` puts one tile under all of them.

``--lengths uniform:32:320 --packing packed`` (or ``padded``) times the batch of mixed lengths that `deepgap run
--inputs packed --seq-len-dist uniform:32:320` times (`deepgap.measure.models.text_batch`: the same seeded draw),
``--seq`` its cap; each row then has the batch's real tokens per sequence and tokens/s.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from deepgap.measure import graph_runner
from deepgap.measure.models.attention import unfuse_attention
from deepgap.measure.models.build import build_model
from deepgap.measure.models.registry import MODELS
from deepgap.measure.quant import sdpa_choice
from deepgap.measure.quant.linear import LinearQuant
from deepgap.measure.quant.transformer import calibrate_linears, quantize_linears

Q = LinearQuant
VARIANTS = {
    # name: (float dtype name or a LinearQuant, unfuse attention, compile mode, freezing)
    "fp16-eager": ("fp16", False, None, False),
    "fp16-compile-freeze": ("fp16", False, "reduce-overhead", True),
    "fp16-unfused-compile-freeze": ("fp16", True, "reduce-overhead", True),
    "bf16-unfused-compile": ("bf16", True, "default", False),
    "fp16-unfused-compile": ("fp16", True, "default", False),
    "fp8-row": (Q("fp8", "row"), True, "default", False),
    "fp8-row-fast": (Q("fp8", "row", fast_accum=True), True, "default", False),
    "fp8-static": (Q("fp8", "static"), True, "default", False),
    "fp8-static-fast": (Q("fp8", "static", fast_accum=True), True, "default", False),
    "fp8-tensor-fast": (Q("fp8", "static", weight_scale="tensor", fast_accum=True), True, "default", False),
    "fp8-tensor": (Q("fp8", "static", weight_scale="tensor"), True, "default", False),
    "fp8-row-tensor-fast": (Q("fp8", "row", weight_scale="tensor", fast_accum=True), True, "default", False),
    "int8-row": (Q("int8", "row"), True, "default", False),
    "int8-static": (Q("int8", "static"), True, "default", False),
    "fp8-row-freeze": (Q("fp8", "row"), True, "default", True),
    # the MLP's first Linear + GELU + next quantization as one Triton kernel (quant/fused_mlp.py), its GEMM
    # core the grouped kernel (FP8_LINEAR_TILE), the persistent TMA one, or each shape's fastest of both
    **{
        f"fp8-tensor-fast-fused{core}": (
            Q("fp8", "static", weight_scale="tensor", fast_accum=True),
            True,
            "default",
            False,
        )
        for core in ("", "-persistent", "-tuned", "-tuned-tanh", "-engine", "-engine-tanh", "-engine-erfpoly")
    },
    "fp8-tensor-fast-autotune": (
        Q("fp8", "static", weight_scale="tensor", fast_accum=True),
        True,
        "max-autotune-no-cudagraphs",
        False,
    ),
}
FLOAT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def make_input(model: str, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """The benchmark's input: token ids for a text model, N(0, 1) images for a vision model."""
    g = torch.Generator().manual_seed(seed)
    entry = MODELS.get(model)
    if entry.is_text:
        return torch.randint(0, entry.vocab_size, (batch, seq), generator=g)
    return torch.randn(batch, 3, seq, seq, generator=g)


def build_variant(
    name: str, fp32: torch.nn.Module, model: str, x: torch.Tensor, fused_tile=None, sdpa="torch"
):
    """(callable, input on the GPU, info) of one variant, compiled and captured where it says so.

    ``fused_tile`` (a `TileConfig`): the fused MLP kernel's tile in every ``-fused`` variant. ``sdpa``: a
    `sdpa_choice` mode, set while compiling and capturing (the graph replays what was chosen then).
    """
    prec, unfuse, mode, freezing = VARIANTS[name]
    net = copy.deepcopy(fp32).cuda()
    info: dict = {}
    if unfuse:
        info["unfused_attention"] = unfuse_attention(net)
    if isinstance(prec, str):
        net = net.to(FLOAT[prec])
        dtype = FLOAT[prec]
    else:
        amax = None
        if prec.act_scale == "static":
            calib = [make_input(model, 16, x.shape[-1], seed=s).cuda() for s in (101, 102)]
            amax = calibrate_linears(net, calib)
        info["quantized_linears"] = len(quantize_linears(net, prec, amax))
        dtype = torch.bfloat16
    xin = x.cuda() if not x.is_floating_point() else x.cuda().to(dtype)
    if "-fused" in name:
        info.update(fuse(net, name, xin, fused_tile))
    if mode is None:
        return net, xin, info, net
    info["sdpa_ran"] = sdpa_choice.chosen(net, xin, sdpa)
    with sdpa_choice.backends(sdpa):
        return _compile(net, xin, info, mode, freezing)


def _compile(net: torch.nn.Module, xin: torch.Tensor, info: dict, mode: str, freezing: bool):
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    compiled = torch.compile(net, mode=None if mode == "default" else mode, dynamic=False)
    t0 = time.perf_counter()
    with inductor_config.patch(freezing=freezing), torch.inference_mode():
        compiled(xin)
        torch.cuda.synchronize()
    info["compile_s"] = round(time.perf_counter() - t0, 1)
    if mode == "reduce-overhead":  # cudagraph trees already
        return compiled, xin, info, compiled
    with inductor_config.patch(freezing=freezing):
        graph, out = graph_runner.capture(compiled, xin, "cuda")
    return graph_runner.GraphRunner(graph, xin, out, owns=compiled), xin, info, compiled


def fuse(net: torch.nn.Module, name: str, x: torch.Tensor, fused_tile=None) -> dict:
    """A ``-fused`` variant's rewrite of ``net``, its tiles chosen by an eager pass on ``x`` where tuned."""
    from deepgap.measure.quant.fused_mlp import fuse_mlp
    from deepgap.measure.quant.linear_choice import APPROXIMATE, apply, choose_kernels
    from deepgap.measure.quant.linear_kernels import FP8_LINEAR_PERSISTENT_TILE

    core = name.split("-fused")[-1].removesuffix("-tanh").removesuffix("-erfpoly").lstrip("-")
    gelu = "tanh" if name.endswith("-tanh") else "erf-poly" if name.endswith("-erfpoly") else "erf"
    if core == "engine":
        return {**apply(net, x, "tuned", gelu, fused_tile), "fused_tile": "engine: linear_kernels"}
    tile = fused_tile or {"": None, "persistent": FP8_LINEAR_PERSISTENT_TILE, "tuned": "tuned"}[core]
    info = {"fused_mlp": fuse_mlp(net, tile, APPROXIMATE[gelu])}
    info["fused_tile"] = getattr(tile, "label", tile or "grouped default")
    if tile == "tuned":  # chosen in an eager pass before compiling, as the engine does
        info["linear_kernels"] = [asdict(k) for k in choose_kernels(net, x, others=False)]
    return info


def kernel_table(fn, x, top: int) -> list[dict]:
    """The ``top`` kernels by GPU time over 3 calls of ``fn`` (not captured: each kernel is its own row)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / 3
    return [{"kernel": e.key[:90], "us_per_call": round(e.device_time_total / 3, 1), "count": e.count // 3,
             "share": round(e.device_time_total / 3 / total, 3)} for e in rows[:top]]  # fmt: skip


def time_it(fn, x, iters: int, repeats: int) -> list[float]:
    """Seconds per call over ``repeats`` windows of ``iters`` back-to-back calls (CUDA events)."""
    out = []
    with torch.inference_mode():
        for _ in range(3):
            fn(x)
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn(x)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3 / iters)
    return out


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--seq", type=int, default=128, help="sequence length, or a vision model's resolution")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--variants", default="fp16-eager,fp16-compile-freeze,fp8-row,fp8-static,int8-row")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--profile", type=int, default=0, help="record this many top kernels per variant")
    ap.add_argument("--sdpa", default="torch", help="SDPA backends while compiling and capturing: torch (its own "
                    "order), cudnn (first), flash, efficient (the engine's DEEPGAP_QUANT_SDPA)")  # fmt: skip
    ap.add_argument("--lengths", default="", help="a mixed-length batch's --seq-len-dist (text models)")
    ap.add_argument("--packing", default="packed", choices=("packed", "padded"), help="with --lengths")
    ap.add_argument(
        "--fused-tile",
        default="",
        help="TileConfig.fields: BM,BN,BK,GROUP_M,WARPS,STAGES[,0,PERSISTENT,TMA_EPI,SPLIT]",
    )
    a = ap.parse_args()
    fused_tile = None
    if a.fused_tile:
        from deepgap.measure.quant.tiles import TileConfig

        fused_tile = TileConfig.from_fields([int(v) for v in a.fused_tile.split(",")])
    rows = []
    fp32 = build_model(a.model, a.seq)
    x = make_input(a.model, a.batch, a.seq)
    mixed = None
    if a.lengths:  # the model packs or masks the batch itself (`deepgap.measure.models.text_batch`)
        from deepgap.measure.models.text_batch import make

        mixed = make(f"{a.packing}:{a.lengths}", a.batch, 8)
        x = mixed.ids(x)
        fp32.set_text_batch(mixed)
    with torch.inference_mode():
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = copy.deepcopy(fp32).cuda()(x.cuda()).float()
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.variants.split(","):
        t0 = time.perf_counter()
        row = {"model": a.model, "seq": a.seq, "batch": a.batch, "variant": name, "sdpa": a.sdpa}
        if mixed is not None:
            row.update(lengths=a.lengths, packing=a.packing, tokens_per_sample=mixed.tokens_per_sample)
        try:
            fn, xin, info, uncaptured = build_variant(name, fp32, a.model, x, fused_tile, a.sdpa)
            with torch.inference_mode():
                y = fn(xin).float()
            row["rel_l2"] = float((y - ref).norm() / ref.norm())
            row["cosine"] = float(torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0))
            s = time_it(fn, xin, a.iters, a.repeats)
            med = statistics.median(s)
            row.update(info, ms=round(med * 1e3, 3), spread=round((max(s) - min(s)) / med, 4),
                       per_s=round(a.batch / med, 1))  # fmt: skip
            if mixed is not None:  # real tokens only, as deepgap counts them
                row["tokens_per_s"] = round(row["per_s"] * mixed.tokens_per_sample, 1)
            if "-tuned" in name or "-engine" in name:  # the tiles timed fastest (M×K×N)
                from deepgap.measure.quant.linear_kernels import kernel_label, tuned_tiles

                row["tuned_tiles"] = {
                    "x".join(map(str, k)): kernel_label(t) for k, t in tuned_tiles().items()
                }
            if a.profile:
                row["kernels"] = kernel_table(uncaptured, xin, a.profile)
        except Exception as exc:  # one variant's failure is its row, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        with open(a.out / "transformer_quant.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    print("\n".join(summary(rows)))


def summary(rows: list[dict]) -> list[str]:
    """A line per variant: seq/s (img/s), ms per batch, relL2, and its ratio to fp16 compile-freeze's rate."""
    base = next((r["per_s"] for r in rows if r["variant"] == "fp16-compile-freeze" and "per_s" in r), None)
    lines = [f"{'variant':<34} {'per s':>9} {'ms':>8} {'relL2':>7} {'/ fp16-compile-freeze':>22}  fused tile"]
    for r in rows:
        if "per_s" not in r:
            lines.append(f"{r['variant']:<34} {r.get('error', '')[:80]}")
            continue
        ratio = f"{r['per_s'] / base:.3f}x" if base else "-"
        lines.append(f"{r['variant']:<34} {r['per_s']:>9,.0f} {r['ms']:>8.3f} {r['rel_l2']:>7.3f} {ratio:>22}  "
                     f"{r.get('fused_tile', '')}")  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
