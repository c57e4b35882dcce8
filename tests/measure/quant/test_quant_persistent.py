"""The persistent TMA kernel for 1×1 convolutions (quant.persistent) on the CPU, and how the tuner offers it.

The Triton interpreter runs the kernel as written, device-side TMA descriptors and the persistent tile walk
included (a few programs, so each walks several tiles). int8 must equal the exact reference bit for bit;
fp8 outputs may differ only at the interpreter's known e4m3 misroundings (`fp8_codes.same_codes`'s
rule). tests/measure/quant/test_quant_persistent_gpu.py checks it against `conv_gemm_kernel` on a Hopper GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from fp8_codes import same_codes  # noqa: E402
from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import kernels, layers, persistent, tunecache, tuning  # noqa: E402
from deepgap.measure.quant.fold import ConvNode  # noqa: E402
from deepgap.measure.quant.tiles import TileConfig, gemm_mode, persistent_configs  # noqa: E402

CFG = TileConfig(32, 32, 32, group_m=2, num_warps=4, num_stages=2, persistent=1)


def _case(qfmt, cin, cout, res_fmt, out_fmt, rows, seed=0):
    """A quantized 1×1 layer, its input [rows, cin], residual and exact reference output."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(cout, cin, 1, 1, generator=g) * 0.1
    node = ConvNode("t", "a", "b", w, torch.randn(cout, generator=g), 1, 0, True, "r" if res_fmt else None)
    fmts = {"a": qfmt, "b": out_fmt, "r": res_fmt or qfmt}
    lay = layers.make_qconv(node, qfmt, "q", fmts, {"a": 0.05, "b": 0.08, "r": 0.03})
    x = layers.quantize_act(torch.randn(rows, cin, generator=g) * 40, qfmt)
    res = layers.quantize_act(torch.randn(rows, cout, generator=g) * 40, res_fmt) if res_fmt else None
    return lay, x, res, layers.conv_reference(lay, x, (1, rows, 1), res)


def _run(lay, x, res, out_fmt, cfg, out=None, num_programs=None):
    return persistent.conv_gemm(
        x, (1, x.shape[0], 1), lay.w_q, 1, 1, 0, lay.alpha, lay.beta, out_fmt, True, cfg, res, lay.gamma,
        out=out, num_programs=num_programs,
    )  # fmt: skip


CASES = [  # cin, cout, residual format, output format, TMA epilogue, residual prefetched a tile ahead, split epilogue
    (64, 64, None, "q", False, False, False),
    (32, 64, "q", "q", False, False, False),
    (64, 32, "q", "q", True, False, False),
    (32, 32, "fp16", "fp16", True, True, False),
    (32, 32, "q", "fp16", False, True, False),
    (32, 64, "q", "q", False, True, False),
    (32, 64, "q", "q", False, False, True),  # the epilogue in two 16-column halves, each with its residual
    (64, 32, "fp16", "fp16", True, False, True),
    (32, 64, None, "q", True, False, True),
]


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"c{c[0]}n{c[1]}r{c[2]}o{c[3]}{'-te' * c[4]}{'-er' * c[5]}{'-se' * c[6]}"
)
def test_persistent_kernel_matches_the_exact_reference(qfmt, case):
    cin, cout, res_fmt, out_fmt, epi, early, split = case
    res_fmt = qfmt if res_fmt == "q" else res_fmt
    out_fmt = qfmt if out_fmt == "q" else out_fmt
    lay, x, res, ref = _case(qfmt, cin, cout, res_fmt, out_fmt, rows=126)  # M not a multiple of BM
    cfg = dataclasses.replace(CFG, tma_epilogue=epi, early_res=early, split_epilogue=split)
    same_codes(_run(lay, x, res, out_fmt, cfg), ref, out_fmt, min_equal=0.9)


@pytest.mark.parametrize("programs", [1, 5, 64])
@pytest.mark.parametrize(
    "epi,early,split",
    [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (False, False, True),
        (True, False, True),
    ],
    ids=["", "te", "er", "se", "te-se"],
)
def test_the_tile_walk_writes_every_tile_once_whatever_the_grid(programs, epi, early, split):
    """16 tiles (4 row × 4 column tiles, the last row tile partial) over 1, 5 or 64 (> tiles) programs.

    With ``early_res`` each program carries its next tile's residual through the walk: a wrong hand-on
    would put another tile's residual into this one's sum; with ``split_epilogue`` a half finished at the wrong
    columns would leave −128 where the other half belongs.
    """
    lay, x, res, ref = _case("int8", 32, 128, "int8", "int8", rows=100, seed=programs)
    out = torch.full_like(ref, -128)  # no kernel writes −128 (outputs clamp to ±127)
    cfg = dataclasses.replace(CFG, tma_epilogue=epi, early_res=early, split_epilogue=split)
    _run(lay, x, res, "int8", cfg, out=out, num_programs=programs)
    assert torch.equal(out, ref)


def test_it_equals_conv_gemm_kernel_bit_for_bit_int8():
    lay, x, res, _ = _case("int8", 64, 64, "int8", "int8", rows=77, seed=3)
    grouped = kernels.conv_gemm(
        x, (1, 77, 1), lay.w_q, 1, 1, 0, lay.alpha, lay.beta, "int8", True, dataclasses.replace(CFG, persistent=0),
        res, lay.gamma,
    )  # fmt: skip
    assert torch.equal(_run(lay, x, res, "int8", CFG), grouped)


def test_what_the_kernel_cannot_take_is_a_clear_error():
    lay, x, res, _ = _case("int8", 32, 32, None, "int8", rows=16)
    both = dataclasses.replace(CFG, split_epilogue=True, early_res=True)
    with pytest.raises(ValueError, match="not both"):
        _run(lay, x, None, "int8", both)
    lay2, x2, res2, _ = _case("int8", 64, 32, "int8", "int8", rows=16)  # K = 64: two steps of BK = 32
    with pytest.raises(ValueError, match="needs K in one step"):
        _run(lay2, x2, res2, "int8", dataclasses.replace(CFG, early_res=True))
    with pytest.raises(ValueError, match="1×1 stride-1"):
        persistent.conv_gemm(x, (1, 4, 4), lay.w_q, 1, 2, 0, lay.alpha, lay.beta, "int8", True, CFG)
    shifted = torch.empty(17 * 32, dtype=torch.int8)[32:].view(16, 32)  # a view that starts 32 bytes in: fine
    shifted.copy_(x)
    _run(lay, shifted, None, "int8", CFG)
    odd = torch.empty(16 * 32 + 8, dtype=torch.int8)[8:].view(16, 32)  # 8 bytes in: no TMA descriptor
    odd.copy_(x)
    with pytest.raises(ValueError, match="16-byte boundary"):
        _run(lay, odd, None, "int8", CFG)


def _conv(k=1, stride=1, cin=64, cout=256, res=None):
    return ConvNode("c", "a", "b", torch.zeros(cout, cin, k, k), torch.zeros(cout), stride, k // 2, True, res)


def test_the_tiles_are_offered_by_default_and_off_turns_them_off(monkeypatch):
    """Session 22's winners: the 128×64 two-per-SM tile, and in fp8 without a residual the TMA-epilogue one; a
    residual layer also gets session 48's wide tiles (`WIDE_RESIDUAL`) where N divides, except with 'narrow'."""
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM", raising=False)
    assert gemm_mode() == "persistent"
    tiles = persistent_configs(_conv(), 802816, (9, 0))  # layer1.0.downsample's shape at batch 256
    assert [t.label for t in tiles] == ["128x64x64 w4 s4 persistentx2"]
    assert all(t.persistent and t.fits(256, 64) for t in tiles)
    fp8 = persistent_configs(_conv(cin=256, cout=128), 802816, (9, 0), "fp8")  # layer2.0.conv1
    assert [t.label for t in fp8] == ["128x64x128 w4 s4 persistentx2", "128x128x128 w8 s3 persistent tma-epi"]
    res128 = persistent_configs(
        _conv(cin=256, cout=128, res="r"), 802816, (9, 0), "fp8"
    )  # N = 128: no 256 tile
    assert [t.label for t in res128] == [
        "128x64x128 w4 s4 persistentx2",
        "128x128x128 w8 s4 persistent tma-epi",
    ]
    conv3 = persistent_configs(_conv(cin=256, cout=1024, res="r"), 200704, (9, 0), "int8")  # layer3's at 1024
    assert [t.label for t in conv3] == [
        "128x64x128 w4 s4 persistentx2",
        "128x256x128 w8 s3 persistent split-epi",
        "128x128x128 w8 s4 persistent tma-epi",
    ]
    monkeypatch.setenv("DEEPGAP_QUANT_GEMM", "narrow")
    narrowed = persistent_configs(_conv(cin=256, cout=1024, res="r"), 200704, (9, 0), "int8")
    assert [t.label for t in narrowed] == ["128x64x128 w4 s4 persistentx2"]
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM")
    narrow = persistent_configs(_conv(cin=64, cout=64), 802816, (9, 0), "fp8")  # N = 64: 3 stages won
    assert [t.label for t in narrow] == ["128x64x64 w4 s3 persistentx2"]
    assert persistent_configs(_conv(), 3136, (9, 0)) == []  # batch 1: 100 tiles for 264 programs
    assert persistent_configs(_conv(), 3136, None, sms=3)  # the interpreter's 3 "SMs": 6 programs
    assert persistent_configs(_conv(k=3), 802816, (9, 0)) == []  # 1×1 stride 1 only
    assert persistent_configs(_conv(stride=2), 802816, (9, 0)) == []
    assert persistent_configs(_conv(), 802816, (8, 9)) == []  # no TMA before Hopper
    monkeypatch.setenv("DEEPGAP_QUANT_GEMM", "off")
    assert gemm_mode() == "off" and persistent_configs(_conv(), 802816, None) == []
    for old in ("persistant", "default"):  # 'default' meant off before session 23: refused, not reinterpreted
        monkeypatch.setenv("DEEPGAP_QUANT_GEMM", old)
        with pytest.raises(
            UsageError, match=f"DEEPGAP_QUANT_GEMM='{old}'; set it to one of persistent, narrow, off"
        ):
            gemm_mode()


def test_the_tuning_cache_key_names_the_persistent_tiles_and_off_keeps_the_old_key(monkeypatch):
    monkeypatch.setenv("DEEPGAP_QUANT_GEMM", "off")
    off = tunecache.device_key("cpu")
    assert "gemm" not in off
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM", raising=False)
    on = tunecache.device_key("cpu")
    assert on == {**off, "gemm": on["gemm"]} and on["gemm"].startswith("persistent:")
    monkeypatch.setenv("DEEPGAP_QUANT_GEMM", "narrow")  # fewer candidates: a key of its own
    assert tunecache.device_key("cpu")["gemm"] == "narrow:" + on["gemm"].split(":", 1)[1]


def test_the_tuner_self_checks_and_times_the_persistent_tiles_through_the_network(r50_net, monkeypatch):
    """layer1.0.conv3 (1×1, 64 → 256, int8 residual) at batch 3 (M = 192: 8 tiles for the interpreter's 6
    programs): every candidate, the persistent ones included, passes its self-check; none at batch 2 (4 tiles)."""
    from deepgap.measure.quant.prepare import QuantOptions

    opts = QuantOptions(timing_reps=1, per_layer_choice=False, force_backend="triton")
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM", raising=False)
    assert not any(c.persistent for _, c in tuning.candidates(r50_net, "layer1.0.conv3", 2, opts, True))
    cands = tuning.candidates(r50_net, "layer1.0.conv3", 3, opts, True)
    assert [c.label for _, c in cands if c.persistent] == [
        "128x64x64 w4 s4 persistentx2",
        "128x256x64 w8 s3 persistent split-epi",  # `tiles.WIDE_RESIDUAL`: a residual layer, N = 256
        "128x128x64 w8 s4 persistent tma-epi",
    ]
    assert not any(c.persistent for _, c in tuning.candidates(r50_net, "layer1.0.conv2", 3, opts, True))
    monkeypatch.setenv("DEEPGAP_QUANT_GEMM", "off")
    assert not any(c.persistent for _, c in tuning.candidates(r50_net, "layer1.0.conv3", 3, opts, True))
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM")
    t = tuning.time_layer(r50_net, "layer1.0.conv3", 3, opts, True)
    assert t.q_error is None and t.q_s is not None  # each candidate ran the exact self-check and passed
    r50_net.configs["layer1.0.conv3"] = next(c for _, c in cands if c.persistent)
    x = tuning.rand_act(64, 64, "int8", "cpu")
    res = tuning.rand_act(64, 256, "int8", "cpu")
    got = r50_net.run_conv("layer1.0.conv3", x, 1, res)  # network.run_conv dispatches to quant.persistent
    assert torch.equal(got, layers.conv_reference(r50_net.convs["layer1.0.conv3"], x, (1, 8, 8), res))


@pytest.mark.parametrize("qfmt,mma,early", [("int8", "s32.s8.s8", True), ("fp8", "f32.e4m3.e4m3", False)])
def test_it_compiles_to_tma_copies_and_8bit_wgmma_for_hopper(qfmt, mma, early):
    """Ahead-of-time compile for sm_90 (no GPU needed): TMA loads and stores, 8-bit wgmma, no spills assumed."""
    cfg = TileConfig(128, 128, 64, 8, 8, 3, persistent=1, tma_epilogue=True)
    ptr = {"int8": "*i8", "fp8": "*fp8e4nv"}[qfmt]
    sig = {a: ptr for a in ("x_ptr", "w_ptr", "out_ptr", "res_ptr")}
    sig.update(alpha_ptr="*fp32", beta_ptr="*fp32", gamma="fp32", M="i32", N="i32")
    const = dict(
        K=64, RELU=True, HAS_RES=True, OUT_KIND=kernels.OUT_KIND[qfmt], ACC_INT=qfmt == "int8", BM=cfg.bm,
        BN=cfg.bn, BK=cfg.bk, GROUP_M=cfg.group_m, NUM_SMS=132, TMA_EPILOGUE=True, EARLY_RES=early, PDL=False,
    )  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "res_ptr", "alpha_ptr", "beta_ptr", "N")  # what the JIT infers
    compiled = compile_sm90(
        persistent.gemm_1x1_kernel, sig, const, aligned,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False,
    )  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async.sync.aligned" in ptx and mma in ptx
    assert "cp.async.bulk.tensor.2d.shared::c" in ptx  # TMA loads of A and W (and the residual unless early)
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # the output's TMA store
    assert "tensormap" in ptx  # descriptors made on the device (tl.make_tensor_descriptor)
    assert compiled.metadata.shared <= 227 * 1024
