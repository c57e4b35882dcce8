"""The launches `compile_sm90.py` compiles for sm_90: each a call of deepgap's own launch code on meta tensors.

Why through the launch code: the signature, the constexprs and the options a kernel is compiled with are
whatever its launcher passes (a default string, an int that is 1, a None pointer all change the compile),
so each case calls the real launcher (`llm_attention.attend`, `gemv.fp8_gemv`, `kernels.conv_gemm` ...) with
the shapes and tiles the engine launches (the tiles from `quant.tiles`, `gemv`'s tile tables, the stems'
`stem_choice.STEM_VARIANTS`); `compile_sm90.capture` records what each launch would compile. Meta tensors
are not CPU tensors, so no launch takes the interpreter's path (``DOT_F32`` stays off, as on a GPU). Where a
launcher asks the device itself (the persistent grid's SM count, the GPU's tanh), the case
gives what an H200 answers.

`CASES` maps a family name to its cases; a case is ``(label, launch)``, ``launch()`` makes the launches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from unittest import mock

import torch

from deepgap.measure import llm_attention
from deepgap.measure.quant import (
    conv_tma,
    gemv,
    gemv_fused,
    head_pool,
    kernels,
    launch,
    linear_kernels,
    pair,
    persistent,
    row_quant,
    split_k,
    stem_int8,
    stem_kernels,
    stem_pool,
    stem_s2d,
    stem_swap_pool,
    tiles,
)
from deepgap.measure.quant.fold import ConvNode
from deepgap.measure.quant.norm_handoff import HandOff, squares_width
from deepgap.measure.quant.stem_choice import STEM_VARIANTS
from deepgap.measure.quant.tiles import stem_tile_args

H200_SMS = 132
Case = tuple[str, Callable[[], None]]
F8, I8, BF16, F16, F32 = torch.float8_e4m3fn, torch.int8, torch.bfloat16, torch.float16, torch.float32
QFMT = {"int8": I8, "fp8": F8}
SHORT = {F8: "fp8", I8: "int8", BF16: "bf16", F16: "fp16", F32: "fp32"}


def meta(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    """An uninitialised tensor with no storage: a launch reads its shape, dtype and (aligned) address only."""
    return torch.empty(shape, dtype=dtype, device="meta")


def pdl_or_not(on: bool) -> Callable:
    """The context of a launch with programmatic dependent launch (`launch.pdl`), or of one without."""
    return launch.pdl if on else contextlib.nullcontext


def pdl_modes(on: bool, off: bool = True) -> Iterator[tuple[str, Callable]]:
    """(label suffix, context) for the launches with programmatic dependent launch (`launch.pdl`) and without."""
    if off:
        yield "", contextlib.nullcontext
    if on:
        yield " pdl", launch.pdl


@contextlib.contextmanager
def pdl_ahead() -> Iterator[None]:
    """Launches under PDL with each kernel's epilogue constants before its wait (`launch.constants_ahead`)."""
    with mock.patch.dict(os.environ, {"DEEPGAP_PDL_CONSTANTS": "ahead"}), launch.pdl():
        yield


# ---- decode (Llama-3.1-8B; Llama-3.2-1B for head_dim 64): hidden, heads, kv heads, head_dim, intermediate
DECODERS = {"8b": (4096, 32, 8, 128, 14336), "1b": (2048, 32, 8, 64, 8192)}


def attention_cases() -> Iterator[Case]:
    """The decode attention: one pass, split with the combine kernel and with the last-block merge; over a bf16
    cache, and over fp8 codes (`llama_cache`) at 8B's batch 1 and 16."""
    for (name, (_, nq, nkv, d, _)), (b, length, mode, last, kv) in itertools.product(
        DECODERS.items(), [(1, 256, "off", False, BF16), (1, 256, "on", False, BF16), (1, 256, "on", True, BF16),
                           (1, 2048, "on", False, BF16), (16, 256, "auto", False, BF16), (1, 256, "off", False, F8),
                           (1, 256, "on", False, F8), (16, 256, "auto", False, F8)],
    ):  # fmt: skip
        if kv == F8 and name != "8b":
            continue
        split = llm_attention.plan(b, nkv, length, H200_SMS, mode)
        pos = meta(b, dtype=torch.int64)  # batch > 1: one position per sequence (continuous batching)
        for suffix, ctx in pdl_modes(on=True, off=name == "8b"):
            how = (
                f"split {split.chunks}x{split.chunk}" + " last-block" * last if split.combine else "one pass"
            )

            def run(b=b, length=length, split=split, last=last, ctx=ctx, pos=pos, nq=nq, nkv=nkv, d=d, kv=kv):
                with ctx():
                    cache = [meta(b, nkv, length, d, dtype=kv) for _ in range(2)]
                    llm_attention.attend(meta(b, nq, 1, d), *cache, pos, split, last)

            yield f"{name} b{b} L{length} {how}{' kv-fp8' * (kv == F8)}{suffix}", run


def gemv_cases() -> Iterator[Case]:
    """The 8-bit GEMV: every one-row tile (8B's qkv) under PDL, some without it and in int8; the 2-16-row tiles."""
    k, n = 4096, 6144
    picks = [(t, "fp8", True) for t in gemv.ROW_TILES]
    picks += [(t, q, p) for t in (gemv.ROW_TILES[0], gemv.ROW_TILES[4], gemv.ROW_TILES[8]) for q, p in
              (("fp8", False), ("int8", True))]  # fmt: skip
    rows = [(8, t, "fp8", True) for t in gemv.DOT_TILES] + [(16, gemv.DOT_TILES[0], "int8", False)]
    for m, tile, qfmt, pdl in [(1, t, q, p) for t, q, p in picks] + rows:

        def run(m=m, tile=tile, qfmt=qfmt, pdl=pdl):
            with pdl_or_not(pdl)():
                gemv.fp8_gemv(meta(m, k), meta(n, k, dtype=QFMT[qfmt]), meta(n, dtype=F32), None, tile)

        yield f"m{m} {k}x{n} {qfmt} {gemv_label(tile)}{' pdl' * pdl}", run


def gemv_label(t: gemv.GemvTile) -> str:
    """A GEMV tile as `gemv.chosen` writes it, short."""
    return t.describe(short=True)


def rope_fusion(dec: str, handed: bool = False, kv: torch.dtype = BF16) -> gemv_fused.Fusion:
    """The qkv GEMV's fusion at batch 1: the norm (folded, or ``handed`` over) and RoPE into a 2048-position cache
    of ``kv`` (bf16, or fp8 codes)."""
    hidden, nq, nkv, d, _ = DECODERS[dec]
    cache = meta(1, nkv, 2048, d, dtype=kv)
    r = gemv_fused.RopeWrite(meta(d), meta(d), meta(1, dtype=torch.int64), cache, cache, nq)
    if handed:
        return gemv_fused.Fusion(eps=1e-5, rope=r, handed=meta(squares_width(hidden), dtype=F32))
    return gemv_fused.Fusion(meta(hidden), 1e-5, rope=r)


def hand_off(n: int) -> HandOff:
    """A writer's hand-off buffers for a row of ``n`` (`norm_handoff`), on meta tensors."""
    return HandOff(meta(n), meta(1, n), meta(squares_width(n), dtype=F32))


def fused_cases() -> Iterator[Case]:
    """The fused one-row GEMV: norm + SwiGLU (gate_up), residual (down), norm + RoPE (qkv); PDL.

    And the norm handed over (`norm_handoff`): its readers (gate_up, qkv) and a writer (down)."""
    hidden, nq, nkv, d, ff = DECODERS["8b"]
    handed = meta(squares_width(hidden), dtype=F32)
    variants = {
        "norm+swiglu": (hidden, 2 * ff, lambda: gemv_fused.Fusion(meta(hidden), 1e-5, swiglu=True)),
        "residual": (ff, hidden, lambda: gemv_fused.Fusion(residual=meta(1, hidden))),
        "norm+rope": (hidden, (nq + 2 * nkv) * d, lambda: rope_fusion("8b")),
        "handed+swiglu": (hidden, 2 * ff, lambda: gemv_fused.Fusion(eps=1e-5, swiglu=True, handed=handed)),
        "residual+hand": (
            ff,
            hidden,
            lambda: gemv_fused.Fusion(residual=meta(1, hidden), hand=hand_off(hidden)),
        ),
        "handed+rope": (hidden, (nq + 2 * nkv) * d, lambda: rope_fusion("8b", handed=True)),
        "handed+rope kv-fp8": (hidden, (nq + 2 * nkv) * d, lambda: rope_fusion("8b", handed=True, kv=F8)),
    }
    for what, (k, n, fusion) in variants.items():
        for tile in fusion().tiles():
            first = tile == gemv_fused.FUSED_TILES[0]
            for suffix, ctx in pdl_modes(on=True, off=first):
                yield (
                    f"{what} {k}x{n} fp8 {gemv_label(tile)}{suffix}",
                    fused_run(k, n, fusion, tile, ctx, "fp8"),
                )
            if first:
                yield (
                    f"{what} {k}x{n} int8 {gemv_label(tile)} pdl",
                    fused_run(k, n, fusion, tile, launch.pdl, "int8"),
                )
        # the H200's tiles (results/h200/session53); qkv: the tuner's, and the same capped at 128 registers (four
        # programs an SM with its constants ahead; `llm_decode_loop.py --tiles 4096x6144=8x512w4s4br128`)
        rope = (gemv.GemvTile(8, 512, 1, 4, 4), gemv.GemvTile(8, 512, 1, 4, 4, maxnreg=128))
        for tile in rope if "rope" in what else (gemv.IN_THREAD_TILES[0 if "residual" in what else 1],):
            yield (
                f"{what} {k}x{n} fp8 {gemv_label(tile)} pdl ahead",
                fused_run(k, n, fusion, tile, pdl_ahead, "fp8"),
            )


def fused_run(k, n, fusion, tile, ctx, qfmt) -> Callable[[], None]:
    """A launch of the fused GEMV on meta operands."""

    def run():
        x, codes, scale = meta(1, k), meta(n, k, dtype=QFMT[qfmt]), meta(n, dtype=F32)
        with ctx():
            gemv_fused.fused_gemv(x, codes, scale, fusion(), tile)

    return run


# ---- ResNet-50 at 224²: (name, input size, C_in, C_out, kernel, stride, padding, residual)
CONVS = [
    ("l1.0.conv2", 56, 64, 64, 3, 1, 1, False),
    ("l1.0.conv3", 56, 64, 256, 1, 1, 0, True),
    ("l2.0.conv1", 56, 256, 128, 1, 1, 0, False),
    ("l2.0.conv2", 56, 128, 128, 3, 2, 1, False),
    ("l2.0.down", 56, 256, 512, 1, 2, 0, False),
    ("l4.0.conv2", 14, 512, 512, 3, 2, 1, False),
    ("l4.2.conv3", 7, 512, 2048, 1, 1, 0, True),
]


def conv_run(conv, batch, qfmt, cfg, ctx=contextlib.nullcontext, out_fmt=None) -> Callable[[], None]:
    """`kernels.conv_gemm` (or, a persistent tile, `persistent.conv_gemm`) of one layer on meta operands."""
    _, h, cin, cout, k, s, p, res = conv

    def run():
        x, w = meta(batch * h * h, cin, dtype=QFMT[qfmt]), meta(cout, k * k * cin, dtype=QFMT[qfmt])
        m = batch * ((h + 2 * p - k) // s + 1) ** 2
        r = meta(m, cout, dtype=QFMT[qfmt]) if res else None
        args = (
            x,
            (batch, h, h),
            w,
            k,
            s,
            p,
            meta(cout, dtype=F32),
            meta(cout, dtype=F32),
            out_fmt or qfmt,
            True,
        )
        with ctx():
            if cfg.persistent:  # an H200's SM count, not the interpreter's (`persistent.programs`)
                persistent.conv_gemm(*args, cfg, res=r, gamma=1.0, num_programs=H200_SMS * cfg.persistent)
            elif cfg.tma_conv:
                conv_tma.conv_gemm(*args, cfg, res=r, gamma=1.0)
            else:
                kernels.conv_gemm(*args, cfg, res=r, gamma=1.0)

    return run


def conv_cases() -> Iterator[Case]:
    """The grouped implicit-GEMM convolution: `tiles.candidate_configs` at batch 256 (int8: all, fp8: the first
    two) and batch 1 (int8: the first)."""
    for conv, (qfmt, batch, first) in itertools.product(
        CONVS, [("int8", 256, 99), ("fp8", 256, 2), ("int8", 1, 1)]
    ):
        name, h, cin, cout, k, s, p, res = conv
        m = batch * ((h + 2 * p - k) // s + 1) ** 2
        for cfg in tiles.candidate_configs(m, cout, cin, qfmt, res)[:first]:  # as `tuning` asks
            yield f"{name} b{batch} {qfmt} {cfg.label}", conv_run(conv, batch, qfmt, cfg)
    conv = CONVS[1]
    cfg = tiles.candidate_configs(256 * 56 * 56, 256, 64, "int8", True)[0]
    yield f"{conv[0]} b256 int8 {cfg.label} pdl", conv_run(conv, 256, "int8", cfg, launch.pdl)
    yield f"{conv[0]} b256 int8 {cfg.label} fp16 out", conv_run(conv, 256, "int8", cfg, out_fmt="fp16")
    for conv in CONVS:  # batch 1 as its PDL graph runs it, each epilogue's constants before the wait
        m = ((conv[1] + 2 * conv[6] - conv[4]) // conv[5] + 1) ** 2
        first = tiles.candidate_configs(m, conv[3], conv[2], "fp8", conv[7])[0]
        yield f"{conv[0]} b1 fp8 {first.label} pdl ahead", conv_run(conv, 1, "fp8", first, pdl_ahead)


def persistent_cases() -> Iterator[Case]:
    """The persistent TMA 1×1 GEMM: `tiles.persistent_configs` of ResNet-50's 1×1 stride-1 layers at batch 256."""
    for conv, qfmt in itertools.product([c for c in CONVS if c[4] == 1 and c[5] == 1], ("int8", "fp8")):
        name, h, cin, cout, _, _, _, res = conv
        node = ConvNode(name, "in", "out", torch.zeros(cout, cin, 1, 1), torch.zeros(cout), 1, 0, True,
                        "res" if res else None)  # fmt: skip
        for cfg in tiles.persistent_configs(node, 256 * h * h, (9, 0), qfmt, H200_SMS):
            yield f"{name} b256 {qfmt} {cfg.label}", conv_run(conv, 256, qfmt, cfg)
    conv = CONVS[1]
    cfg = dataclasses.replace(tiles.TileConfig(128, 64, 64, 8, 4, 4, persistent=2), early_res=True)
    yield f"{conv[0]} b256 int8 {cfg.label} pdl", conv_run(conv, 256, "int8", cfg, launch.pdl)


def conv_tma_cases() -> Iterator[Case]:
    """The TMA-fed 3×3 convolution (`conv_tma.tma_configs`, DEEPGAP_QUANT_CONV_TMA=on) at ResNet-50's 3×3
    shapes (stride 1, and each stage's first at stride 2), batch 256, both formats."""
    shapes = [("l1.x.conv2", 56, 64, 1), ("l2.x.conv2", 28, 128, 1), ("l3.x.conv2", 14, 256, 1),
              ("l4.x.conv2", 7, 512, 1), ("l2.0.conv2", 56, 128, 2), ("l3.0.conv2", 28, 256, 2),
              ("l4.0.conv2", 14, 512, 2)]  # fmt: skip
    for (name, h, c, s), qfmt in itertools.product(shapes, ("int8", "fp8")):
        conv = (name, h, c, c, 3, s, 1, False)
        node = ConvNode(name, "in", "out", torch.zeros(c, c, 3, 3), torch.zeros(c), s, 1, True)
        with mock.patch.dict(os.environ, {conv_tma.ENV: "on"}):
            cfgs = conv_tma.tma_configs(node, h, h, (9, 0), explore=True)
        for cfg in cfgs:
            yield f"{name} b256 {qfmt} {cfg.label}", conv_run(conv, 256, qfmt, cfg)


PAIRS = [(64, 256, 64), (64, 256, 128)]  # K1, N1, N2 of ResNet-50's pairs that fit (layer1's)


def pair_cases() -> Iterator[Case]:
    """The fused pair of 1×1 convolutions (`pair.pair_kernel`): every tile of ResNet-50's eligible pairs."""
    for (k1, n1, n2), qfmt in itertools.product(PAIRS, ("int8", "fp8")):
        for cfg in pair.pair_configs(k1, n1, n2, qfmt):
            yield f"pair {k1}>{n1}>{n2} {qfmt} {cfg.label}", pair_run(k1, n1, n2, qfmt, cfg)
    cfg = pair.pair_configs(*PAIRS[0], "fp8")[0]
    yield f"pair {PAIRS[0]} fp8 {cfg.label} pdl", pair_run(*PAIRS[0], "fp8", cfg, ctx=launch.pdl)


def pair_run(k1, n1, n2, qfmt, cfg, rows=256 * 56 * 56, ctx=contextlib.nullcontext) -> Callable[[], None]:
    """`pair.run` on meta operands: the first layer with a residual, both with ReLU."""

    def layer(name, cin, cout, res, in_fmt):
        node = ConvNode(name, "in", "out", torch.zeros(cout, cin, 1, 1), torch.zeros(cout), 1, 0, True, res)
        return SimpleNamespace(node=node, in_fmt=in_fmt, out_fmt=qfmt, w_q=meta(cout, cin, dtype=QFMT[qfmt]),
                               alpha=meta(cout, dtype=F32), beta=meta(cout, dtype=F32), gamma=1.0)  # fmt: skip

    def run():
        first, second = layer("a", k1, n1, "res", qfmt), layer("b", n1, n2, None, qfmt)
        x, r = meta(rows, k1, dtype=QFMT[qfmt]), meta(rows, n1, dtype=QFMT[qfmt])
        with ctx():
            pair.run(first, second, x, r, cfg, num_programs=H200_SMS)

    return run


def split_cases() -> Iterator[Case]:
    """Split-K (`split_k.split_configs`) of the grouped convolution at batch 1, where it is offered."""
    for conv, qfmt in itertools.product(CONVS, ("int8", "fp8")):
        name, h, cin, cout, k, s, p, res = conv
        m = ((h + 2 * p - k) // s + 1) ** 2
        base = tiles.candidate_configs(m, cout, cin, qfmt, res)
        for cfg in split_k.split_configs(base, m, cout, k * k * cin, H200_SMS, spread=True):
            yield f"{name} b1 {qfmt} {cfg.label}", conv_run(conv, 1, qfmt, cfg)
            yield f"{name} b1 {qfmt} {cfg.label} pdl", conv_run(conv, 1, qfmt, cfg, launch.pdl)


def epilogue_cases() -> Iterator[Case]:
    """The epilogue alone: an fp16 (cuDNN) result into int8 or fp8 (with a residual), format conversions."""
    m, n = 256 * 28 * 28, 128
    for src, out_fmt, res, pdl in [
        (F16, "int8", None, False), (F16, "fp8", F8, False), (F16, "int8", I8, True), (I8, "fp16", None, False),
        (F8, "fp16", None, False), (F16, "fp8", None, False),
    ]:  # fmt: skip

        def run(src=src, out_fmt=out_fmt, res=res, pdl=pdl):
            r = meta(m, n, dtype=res) if res is not None else None
            with pdl_or_not(pdl)():
                kernels.epilogue(
                    meta(m, n, dtype=src), meta(n, dtype=F32), meta(n, dtype=F32), out_fmt, True, r, 1.0
                )

        label = f"{SHORT[src]} -> {out_fmt}" + " +res" * (res is not None) + " pdl" * pdl
        yield label, run


def stem_cases() -> Iterator[Case]:
    """ResNet's stems at batch 256 (`stem_choice.STEM_VARIANTS`): cuDNN's + max-pool, fused fp16, int8, int8+pool."""
    batch, conv = 256, (3, 64, 7, 2, 3)  # C_in, C_out, kernel, stride, padding
    alpha, beta = meta(64, dtype=F32), meta(64, dtype=F32)
    for (kind, padded, cfg), out_fmt in itertools.product(STEM_VARIANTS, ("int8", "fp8")):
        if kind == "cudnn":
            if padded:
                continue  # the padded-input cuDNN stem pools the same 64-channel output

            def run(out_fmt=out_fmt):
                stem_kernels.maxpool(meta(batch * 112 * 112, 64, dtype=F16), (batch, 112, 112), alpha, beta, out_fmt,
                                     True)  # fmt: skip
        elif kind == "fused":

            def run(out_fmt=out_fmt, cfg=cfg):
                w = stem_kernels.pad_weights(meta(64, 3, 7, 7, dtype=F16))  # K 7·7·3 padded to the K block
                stem_kernels.stem(meta(batch * 224 * 224, 3, dtype=F16), (batch, 224, 224), w, *conv[2:], alpha,
                                  beta, out_fmt, block_m=cfg[0], num_warps=cfg[1])  # fmt: skip
        else:

            def run(out_fmt=out_fmt, cfg=cfg, kind=kind):
                x = torch.empty(
                    (batch, 4, 224, 224), dtype=I8, device="meta", memory_format=torch.channels_last
                )
                args = (x, meta(64, 7 * stem_int8.ROW, dtype=I8), *conv[2:], alpha, beta, out_fmt)
                if kind in ("int8s2d", "int8swap"):  # 16-byte space-to-depth pixels (`stem_s2d`)
                    x = torch.empty(
                        (batch, 16, 112, 112), dtype=I8, device="meta", memory_format=torch.channels_last
                    )
                    w = meta(64, stem_s2d.TAPS * stem_s2d.ROW, dtype=I8)
                    if kind == "int8swap":  # with the max-pool inside (`stem_swap_pool`)
                        stem_swap_pool.stem(x, w, *args[2:], **stem_swap_pool.tile_args(cfg))
                    else:
                        stem_s2d.stem(x, w, *args[2:], **stem_tile_args(cfg))
                elif kind == "int8pool":
                    stem_pool.stem(*args, cfg[:2], *cfg[2:])
                else:
                    stem_int8.stem(*args, **stem_tile_args(cfg))

        yield f"{kind} {cfg or ''} {out_fmt}".replace("  ", " "), run
    for (bm, warps, stages, per_sm), out_fmt in itertools.product(stem_s2d.SWAP_TILES, ("int8", "fp8")):

        def run(out_fmt=out_fmt, bm=bm, warps=warps, stages=stages, per_sm=per_sm):
            x = torch.empty((batch, 16, 112, 112), dtype=I8, device="meta", memory_format=torch.channels_last)
            w = meta(64, stem_s2d.TAPS * stem_s2d.ROW, dtype=I8)
            stem_s2d.stem(x, w, *conv[2:], alpha, beta, out_fmt, block_m=bm, num_warps=warps, persistent=per_sm,
                          swap=stages)  # fmt: skip

        yield f"int8s2d swap {bm}x{warps}w s{stages} p{per_sm} {out_fmt}", run
    for src, pdl in ((F32, False), (F16, False), (F32, True)):

        def run(src=src, pdl=pdl):
            with pdl_or_not(pdl)():
                stem_int8.quantize_image(meta(batch, 3, 224, 224, dtype=src), 0.02)

        yield f"quantize {SHORT[src]} image" + " pdl" * pdl, run

        def run_s2d(src=src, pdl=pdl):
            with pdl_or_not(pdl)():
                stem_s2d.quantize(meta(batch, 3, 224, 224, dtype=src), 0.02)

        yield f"quantize {SHORT[src]} image to super pixels" + " pdl" * pdl, run_s2d


def head_cases() -> Iterator[Case]:
    """The head's Triton pool (`head_pool.pool`): ResNet-50's last activation [batch·7·7, 2048], each 8-bit format."""
    for batch, dtype, pdl in ((1, I8, False), (1, F8, False), (1, F8, True), (1024, F8, False)):

        def run(batch=batch, dtype=dtype, pdl=pdl):
            with pdl_or_not(pdl)():
                head_pool.pool(meta(batch * 49, 2048, dtype=dtype), batch, 0.01)

        yield f"pool b{batch} {SHORT.get(dtype, dtype)}" + " pdl" * pdl, run


def linear_cases() -> Iterator[Case]:
    """The fused fp8 Linear (bert-base at batch 256 × 128 tokens): ff1 with GELU to fp8, ff2 to bf16."""
    m = 256 * 128
    shapes = {"ff1": (768, 3072, True), "ff2": (3072, 768, False)}
    for (what, (k, n, gelu)), form in itertools.product(shapes.items(), linear_kernels.APPROXIMATE):
        if not gelu and form != "none":
            continue
        cands = [
            linear_kernels.FP8_LINEAR_TILE.fit(k, n),
            *tiles.linear_persistent_configs(k, n, 1 if gelu else 2),
        ]
        for cfg in cands if form == "none" else cands[1:2]:
            label = f"{what} {k}x{n}" + f" gelu {GELU_NAMES[form]}" * gelu + f" {cfg.label}"
            yield label, linear_run(m, k, n, gelu, form, cfg)


GELU_NAMES = {"none": "erf", "tanh": "tanh-ptx", "erf-poly": "erf-poly"}


class GpuEpilogue(linear_kernels.Epilogue):
    """The `Epilogue` whose GELU code is a GPU's (the tanh form through ``tanh.approx.f32``), on meta tensors."""

    def gelu_code(self, device: torch.device) -> int:
        return super().gelu_code(torch.device("cuda"))


def linear_run(m, k, n, gelu, form, cfg) -> Callable[[], None]:
    """`linear_kernels.fp8_linear` on meta operands (a persistent tile: an H200's SM count)."""

    def run():
        epi = GpuEpilogue(0.01, meta(n, dtype=BF16), gelu, 0.05 if gelu else None, form)
        programs = H200_SMS * cfg.persistent if cfg.persistent else None
        linear_kernels.fp8_linear(meta(m, k, dtype=F8), meta(n, k, dtype=F8), epi, cfg, programs)

    return run


def row_quant_cases() -> Iterator[Case]:
    """`row_quant.row_quant` over bf16 token rows of the 8B prefill's Linear inputs (4096 wide; down's 14336)."""
    for k, precision in itertools.product((4096, 14336), ("fp8", "int8")):

        def run(k=k, precision=precision):
            row_quant.row_quant(meta(4096, k), precision)

        yield f"rows 4096x{k} {precision}", run


def whole_cases() -> Iterator[Case]:
    """`whole_plan.Plan.run` (the whole-network kernel) in the engine's form (`whole_choice`'s barrier, warps and
    stages), with barriers and with dataflow, int8 and fp8: a plan of meta arenas (the kernel reads its shapes
    from the device table, so one compile serves every network)."""
    from deepgap.measure.quant import whole, whole_choice, whole_plan

    forms = [(q, f, whole_choice.WARPS) for q, f in itertools.product(("fp8", "int8"), (False, True))]
    for qfmt, flow, warps in [*forms, ("fp8", False, 16)]:  # 16 warps: `benchmarks/whole_phases.py`'s variant

        def run(qfmt=qfmt, flow=flow, warps=warps):
            q, acc = QFMT[qfmt], torch.int32 if qfmt == "int8" else F32
            plan = whole_plan.Plan(
                names=["a", "b"], input="x", output="b", qfmt=qfmt, batch=1, programs=H200_SMS, max_split=16,
                barrier=whole_choice.BARRIER, warps=warps, stages=whole_choice.STAGES,
                table=meta(3, whole.NF, dtype=torch.int64), gamma=meta(3, dtype=F32), act=meta(4096, dtype=q),
                weights=meta(4096, dtype=q), alpha=meta(128, dtype=F32), beta=meta(128, dtype=F32),
                out16=meta(64, 64, dtype=F16), fp16_out=True, ws=meta(4096, dtype=acc),
                cnt=meta(16, dtype=torch.int32), sync=meta(4, dtype=torch.int32), n_phases=2, flow=flow,
                counters=meta(64, dtype=torch.int32), in_shape=(64, 64),
            )  # fmt: skip
            plan.run(meta(64, 64, dtype=q))

        yield f"resnet b1 {qfmt}{' dataflow' if flow else ' barriers'}{' 16 warps' * (warps == 16)}", run


def angles_cases() -> Iterator[Case]:
    """RoPE's angles in one kernel (`llm_angles`, ``DEEPGAP_DECODE_ANGLES=kernel``): a batch-1 step's one position."""
    from deepgap.measure import llm_angles

    for (name, (_, _, _, d, _)), (suffix, ctx) in itertools.product(DECODERS.items(), pdl_modes(on=True)):

        def run(d=d, ctx=ctx):
            with ctx():
                llm_angles.compute(meta(1, dtype=torch.int64), meta(d // 2, dtype=F32), BF16)

        yield f"{name} d{d}{suffix}", run


def normalise_cases() -> Iterator[Case]:
    """Serve's normaliser (`serving.worker.normalise_kernel`): a batch of 128 uint8 224² images into each input dtype.

    Every served batch of 224² images is 150,528·b bytes, a multiple of 16, so one compile per dtype serves all.
    """
    from deepgap.serving.worker import normalise_kernel

    for dtype in normalise_kernel.DTYPES:

        def run(dtype=dtype):
            out = meta(128, 3, 224, 224, dtype=dtype).contiguous(memory_format=torch.channels_last)
            normalise_kernel.normalise(meta(128, 224, 224, 3, dtype=torch.uint8), out, (1.0,) * 3, (0.0,) * 3)

        yield f"b128 224 {SHORT.get(dtype, dtype)}", run


CASES: dict[str, Callable[[], Iterator[Case]]] = {
    "attention": attention_cases,
    "gemv": gemv_cases,
    "fused": fused_cases,
    "conv": conv_cases,
    "persistent": persistent_cases,
    "pair": pair_cases,
    "conv-tma": conv_tma_cases,
    "split-k": split_cases,
    "epilogue": epilogue_cases,
    "stem": stem_cases,
    "head": head_cases,
    "linear": linear_cases,
    "row-quant": row_quant_cases,
    "whole": whole_cases,
    "normalise": normalise_cases,
    "angles": angles_cases,
}
