"""Time the int8-pixel stem's two kernels apart: the convolution per tile and walk, and the max-pool per block.

Why: the per-layer table puts ResNet-50's stem at about a tenth of its time at batch 256 and 1024, at a
tenth of its roof, but it times the convolution and the max-pool as one row; which of the two to work on is
this script's answer. It times, on resident int8 pixels (no quantizing pass):

- the convolution alone (`stem_int8.convolve`) for every int8 tile the engine offers
  (`stem_choice.STEM_VARIANTS`: a program per tile, and the persistent walk, `stem_conv_persistent_kernel`)
  and a few more persistent walks, each output checked bit for bit against the default tile's;
- the max-pool alone: today's `stem_kernels.pool8` (the maximum of the codes) at several blocks, and the
  former kernel that widened every value to fp32 (`float_pool`, kept here only to measure the change),
  each checked bit for bit against `pool8`;
- the pair as the engine runs it (`stem_int8.stem`) at the default tile and at the fastest convolution;
- the same convolution on 16-byte space-to-depth pixels (`stem_s2d.convolve`, session 29) at several tiles,
  and as `stem_s2d.stem_swap_kernel` (weights as the MMA's M side) at each of `stem_s2d.SWAP_TILES`, all
  checked bit for bit against the 4-byte-pixel convolution, and the two quantizing passes from an fp16 batch
  (`stem_int8.quantize_image`, `stem_s2d.quantize`), as the default input mode runs them.

One JSON line per timing and one summary line per (batch, format).

    PYTHONPATH=src python benchmarks/stem_split.py --batch-sizes 1,256,1024
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from deepgap.measure.quant import stem_int8, stem_kernels, stem_s2d, stem_swap_pool
from deepgap.measure.quant.kernels import window_origin
from deepgap.measure.quant.launch import launcher, out_size
from deepgap.measure.quant.stem_choice import STEM_VARIANTS
from deepgap.measure.quant.tiles import stem_tile_args, stem_tile_name
from deepgap.measure.quant.tuning import time_s

EXTRA_WALKS = ((64, 4, 4), (64, 4, 6), (128, 8, 3), (256, 8, 1))  # (block, warps, programs per SM)
POOL_BLOCKS = (32, 64, 128)
S2D_TILES = ((64, 4), (128, 4), (128, 4, 2), (128, 4, 3), (64, 4, 4), (64, 4, 6), (128, 8, 2), (256, 8, 1))


@triton.jit
def float_pool_kernel(x_ptr, out_ptr, P, H, W, OH, OW, C: tl.constexpr, BP: tl.constexpr):
    """The max-pool as it was before session 26: each value widened to fp32, the maximum converted back."""
    rp = tl.program_id(0) * BP + tl.arange(0, BP)
    rc = tl.arange(0, C)
    p_ok = rp < P
    nb, ih0, iw0 = window_origin(rp, OH, OW, 2, 1)
    best = tl.zeros((BP, C), dtype=tl.float32)
    for kh in tl.static_range(3):
        for kw in tl.static_range(3):
            ih = ih0 + kh
            iw = iw0 + kw
            ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            row = ((nb * H + ih) * W + iw) * C
            v = tl.load(x_ptr + row[:, None] + rc[None, :], mask=ok[:, None], other=0.0)
            best = tl.maximum(best, v.to(tl.float32))
    tl.store(out_ptr + rp[:, None] * C + rc[None, :], best.to(out_ptr.dtype.element_ty), mask=p_ok[:, None])


def float_pool(conv: torch.Tensor, nb: int, oh: int, ow: int) -> torch.Tensor:
    ph, pw = out_size(oh, 3, 2, 1), out_size(ow, 3, 2, 1)
    out = torch.empty((nb * ph * pw, conv.shape[1]), dtype=conv.dtype, device=conv.device)
    launcher(float_pool_kernel, conv.device)[(triton.cdiv(nb * ph * pw, 32),)](
        conv, out, nb * ph * pw, oh, ow, ph, pw, C=conv.shape[1], BP=32, num_warps=4
    )
    return out


def _inputs(batch: int, res: int, out_fmt: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, res, res, device="cuda", generator=g).half()
    pixels = stem_int8.quantize_image(x.contiguous(memory_format=torch.channels_last), 0.03)
    w_i8, _ = stem_int8.pack_weights(torch.randn(64, 3, 7, 7, dtype=torch.float64) * 0.2)
    alpha = torch.rand(64, device="cuda", generator=g) * 0.01 + 0.001
    beta = torch.randn(64, device="cuda", generator=g)
    return pixels, w_i8.cuda(), 7, 2, 3, alpha, beta, out_fmt


def _timed(row: dict, fn, ref: torch.Tensor, reps: int) -> float | None:
    try:
        out = fn()
        row["bit_equal"] = bool(torch.equal(out.view(torch.int8), ref.view(torch.int8)))
        row["ms"] = round(time_s(fn, reps=reps) * 1e3, 4)
    except Exception as exc:  # noqa: BLE001 - report and go on
        row["error"] = repr(exc)[:200]
    print(json.dumps(row), flush=True)
    return row.get("ms") if row.get("bit_equal") else None


def one(batch: int, res: int, fmt: str, reps: int, parts: str = "all") -> None:
    """Every timing at one batch and format; ``parts`` 's2d': only the super-pixel ones (the 4-byte-pixel
    convolution and the pool timed once each, as the reference)."""
    args = _inputs(batch, res, fmt)
    base = {"batch": batch, "out_fmt": fmt}
    tiles = [cfg for kind, _, cfg in STEM_VARIANTS if kind == "int8"] + list(EXTRA_WALKS)
    tiles = tiles if parts == "all" else tiles[:1]
    ref, nb, oh, ow = stem_int8.convolve(*args, block_m=128, num_warps=4)
    conv_ms: dict[tuple, float] = {}
    for cfg in tiles:
        ms = _timed(
            {**base, "part": "conv", "tile": stem_tile_name(cfg)},
            lambda cfg=cfg: stem_int8.convolve(*args, **stem_tile_args(cfg))[0],
            ref,
            reps,
        )
        if ms is not None:
            conv_ms[cfg] = ms
    pooled = stem_kernels.pool8(ref, nb, oh, ow)
    pool_ms = {"float32 (before)": _timed({**base, "part": "pool", "block": "float32 32"},
                                          lambda: float_pool(ref, nb, oh, ow), pooled, reps)}  # fmt: skip
    for bp in POOL_BLOCKS if parts == "all" else POOL_BLOCKS[:1]:
        pool_ms[f"codes {bp}"] = _timed(
            {**base, "part": "pool", "block": f"codes {bp}"},
            lambda bp=bp: stem_kernels.pool8(ref, nb, oh, ow, block_p=bp),
            pooled,
            reps,
        )
    s2d_ms = s2d(args, ref, base, reps)
    s2d_ms["stem_s2d_ms"] = s2d_stems(args, pooled, base, reps)
    best = min(conv_ms, key=conv_ms.get) if conv_ms else (128, 4)
    pair = {}
    for cfg in {(128, 4), best}:
        pair[stem_tile_name(cfg)] = _timed(
            {**base, "part": "stem", "tile": stem_tile_name(cfg)},
            lambda cfg=cfg: stem_int8.stem(*args, **stem_tile_args(cfg)),
            pooled,
            reps,
        )
    summary = {**base, "summary": True, "conv_ms": {stem_tile_name(c): v for c, v in conv_ms.items()},
               "pool_ms": pool_ms, "stem_ms": pair, "best_conv": stem_tile_name(best), **s2d_ms}  # fmt: skip
    print(json.dumps(summary), flush=True)


def s2d(args: tuple, ref: torch.Tensor, base: dict, reps: int) -> dict:
    """The space-to-depth convolution per tile (equal to ``ref`` bit for bit) and both quantizing passes."""
    pixels, w_i8 = args[0], args[1]
    xs, ws = stem_s2d.to_super(pixels), stem_s2d.from_pixel_weights(w_i8, 7, 7, 3)
    conv_ms = {}
    for cfg in S2D_TILES:
        ms = _timed(
            {**base, "part": "conv-s2d", "tile": stem_tile_name(cfg)},
            lambda cfg=cfg: stem_s2d.convolve(xs, ws, *args[2:], **stem_tile_args(cfg))[0],
            ref,
            reps,
        )
        if ms is not None:
            conv_ms[stem_tile_name(cfg)] = ms
    for block, warps, stages, per_sm in stem_s2d.SWAP_TILES:  # weights as the MMA's M side (session 29)
        name = f"swap {block}x{warps}w s{stages} p{per_sm}"
        ms = _timed(
            {**base, "part": "conv-s2d", "tile": name},
            lambda c=(block, warps, stages, per_sm): stem_s2d.convolve(
                xs, ws, *args[2:], block_m=c[0], num_warps=c[1], persistent=c[3], swap=c[2]
            )[0],
            ref,
            reps,
        )
        if ms is not None:
            conv_ms[name] = ms
    g = torch.Generator(device=pixels.device).manual_seed(1)
    n, _, h, w = pixels.shape
    x16 = torch.randn(n, 3, h, w, device=pixels.device, generator=g).half()
    x16 = x16.contiguous(memory_format=torch.channels_last)
    q4 = stem_int8.quantize_image(x16, 0.03)
    quant_ms = {
        "pixels": _timed({**base, "part": "quantize", "layout": "pixels"},
                         lambda: stem_int8.quantize_image(x16, 0.03), q4, reps),
        "s2d": _timed({**base, "part": "quantize", "layout": "s2d"},
                      lambda: stem_s2d.quantize(x16, 0.03), stem_s2d.to_super(q4), reps),
    }  # fmt: skip
    return {"conv_s2d_ms": conv_ms, "quantize_ms": quant_ms}


def s2d_stems(args: tuple, pooled: torch.Tensor, base: dict, reps: int) -> dict:
    """The whole super-pixel stem (convolution and max-pool) per form, each equal to ``pooled`` bit for bit.

    The engine's pair (`stem_s2d.stem`: the 128×4 tile, then `pool8`), the swapped convolution (2 programs an SM;
    session 57's call 1 ran it with 1) then `pool8`, and the swapped convolution with the pool inside
    (`stem_swap_pool`) at each of its `TILES`.
    """
    pixels, w_i8 = args[0], args[1]
    xs, ws = stem_s2d.to_super(pixels), stem_s2d.from_pixel_weights(w_i8, 7, 7, 3)
    forms = {
        "pair 128x4w": lambda: stem_s2d.stem(xs, ws, *args[2:], block_m=128, num_warps=4),
        "swap 128x4w s2 p2 + pool8": lambda: stem_s2d.stem(
            xs, ws, *args[2:], block_m=128, persistent=2, swap=2
        ),
    }
    for cfg in stem_swap_pool.TILES:
        forms[f"swap+pool {stem_swap_pool.tile_name(cfg)}"] = lambda cfg=cfg: stem_swap_pool.stem(
            xs, ws, *args[2:], **stem_swap_pool.tile_args(cfg)
        )
    return {
        name: _timed({**base, "part": "stem-s2d", "form": name}, fn, pooled, reps)
        for name, fn in forms.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="1,256,1024")
    p.add_argument("--formats", default="fp8,int8")
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--parts", choices=("all", "s2d"), default="all", help="s2d: the super-pixel timings only")
    a = p.parse_args()
    for bs in [int(b) for b in a.batch_sizes.split(",")]:
        for fmt in a.formats.split(","):
            one(bs, a.resolution, fmt, a.reps, a.parts)


if __name__ == "__main__":
    main()
