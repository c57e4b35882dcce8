"""The persistent TMA kernel (quant.persistent) on a Hopper GPU (skipped without CUDA or below sm_90).

    python -m pytest tests/measure/quant/test_quant_persistent_gpu.py -v -rA

Its tiles against `conv_gemm_kernel` at ResNet-50's 1×1 stride-1 shapes (int8 bit for bit, fp8 but for
rare 1-ulp flips of a different fp32 accumulation order), with enough rows that each program walks many
tiles (those offered, and the TMA-epilogue and early-residual variants the kernel still takes); and the whole
quant ResNet-50 prepared with the persistent tiles (the default) against fp32, at the engine's own thresholds
(`measure.correctness`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"

SHAPES = [  # name, H = W at 224², C_in, C_out, residual
    ("layer1.0.conv1", 56, 64, 64, False),
    ("layer1.0.conv3", 56, 64, 256, True),
    ("layer1.1.conv1", 56, 256, 64, False),
    ("layer2.0.conv1", 56, 256, 128, False),
    ("layer2.0.conv3", 28, 128, 512, True),
    ("layer3.0.conv3", 14, 256, 1024, True),  # `tiles.WIDE_RESIDUAL`'s 128×256 tile, its epilogue in halves
]


@pytest.fixture(autouse=True)
def _hopper(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the persistent kernel's TMA descriptors need compute capability ≥ 9.0")
    monkeypatch.delenv("DEEPGAP_QUANT_GEMM", raising=False)  # the default offers the persistent tiles


def _layer(qfmt, cin, cout, has_res, seed):
    from deepgap.measure.quant import layers
    from deepgap.measure.quant.fold import ConvNode

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(cout, cin, 1, 1, generator=g) * (2.0 / cin) ** 0.5
    node = ConvNode(
        "t", "a", "b", w, torch.randn(cout, generator=g) * 0.1, 1, 0, True, "r" if has_res else None
    )
    fmts = {"a": qfmt, "b": qfmt, "r": qfmt}
    return layers.make_qconv(node, qfmt, "q", fmts, {"a": 0.05, "b": 0.05, "r": 0.05}).to(DEV)


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
def test_persistent_tiles_equal_conv_gemm_kernel_at_resnet50_shapes(qfmt, shape):
    from deepgap.measure.quant import kernels, layers, persistent
    from deepgap.measure.quant.tiles import candidate_configs, persistent_configs

    _, h, cin, cout, has_res = shape
    nb = 8  # 8 images: M = 25,088 at 56² (196 row tiles of 128 over 132 programs); M = 6,272 at 28²
    m = nb * h * h
    lay = _layer(qfmt, cin, cout, has_res, seed=cin + cout)
    g = torch.Generator(device=DEV).manual_seed(0)
    x = layers.quantize_act(torch.randn(m, cin, device=DEV, generator=g).relu() * 20, qfmt)
    res = layers.quantize_act(torch.randn(m, cout, device=DEV, generator=g) * 20, qfmt) if has_res else None
    args = (x, (nb, h, h), lay.w_q, 1, 1, 0, lay.alpha, lay.beta, qfmt, True)
    grouped = kernels.conv_gemm(
        *args, candidate_configs(256 * h * h, cout, cin, qfmt, has_res)[0], res, lay.gamma
    )
    offered = persistent_configs(lay.node, 256 * h * h, torch.cuda.get_device_capability(), qfmt)
    assert offered
    variants = [dataclasses.replace(t, tma_epilogue=True) for t in offered]
    if has_res:  # the residual a tile ahead: with K in one step (the kernel refuses more), not with a split
        variants += [
            dataclasses.replace(t, early_res=True) for t in offered if not t.split_epilogue and cin <= t.bk
        ]
    tiles = set(offered) | {t for t in variants if t.fits(cout, cin)}
    for cfg in sorted(tiles, key=lambda t: t.label):
        out = torch.empty_like(grouped)
        out.view(torch.uint8).fill_(0x80 if qfmt == "int8" else 0x7F)  # −128 / NaN: no kernel writes either
        persistent.conv_gemm(*args, cfg, res, lay.gamma, out=out)
        torch.cuda.synchronize()
        o, r = out.float(), grouped.float()
        assert torch.isfinite(o).all() and float(o.min()) > -128, f"{cfg.label}: unwritten elements"
        if qfmt == "int8":
            assert torch.equal(out, grouped), f"{cfg.label}: max |Δ| {float((o - r).abs().max())}"
        else:
            assert float((o == r).float().mean()) > 0.99, cfg.label
            assert float((o - r).norm() / r.norm()) < 0.02, cfg.label


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_resnet50_with_the_persistent_kernel_is_within_the_engines_thresholds(
    precision, capsys, tmp_path, monkeypatch
):
    from deepgap.measure import correctness
    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant.prepare import prepare_quant, variant

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))  # tuned afresh: the persistent tiles are timed
    model = build_model("resnet50", 224, None, 0)
    x = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        ref = model.cuda()(x.cuda()).float().cpu()
    res = prepare_quant(model.cpu(), precision, 8, 224, "resnet50")
    xd = x.cuda().half().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        a = res.run(xd).float().cpu()
        b = res.run(xd).float().cpu()
    agree = correctness.compare(a, ref, precision)
    chosen = [t["name"] for t in res.info["layers"] if "persistent" in (t["config"] or "")]
    forced = _every_1x1_persistent(res)  # the same network with the persistent kernel on every 1×1 layer
    run, info = variant(res)
    with torch.inference_mode():
        c = run(xd).float().cpu()
    agree_forced = correctness.compare(c, ref, precision)
    with capsys.disabled():
        print(
            f"\n{precision}: tuned {agree}; persistent tiles chosen on {len(chosen)} layers: {', '.join(chosen)}"
        )
        print(f"{precision}: persistent on all {forced} 1×1 stride-1 layers: {agree_forced}")
        for t in res.info["layers"]:
            if t["q_error"]:
                print(f"  {t['name']}: {t['q_error'][:300]}")
    assert (
        res.info["gemm"] == "persistent" and forced >= 30
    )  # ResNet-50: 32 conv1/conv3 + layer1's downsample
    assert torch.equal(a, b) and res.info["cuda_graph"] and info["cuda_graph"]
    assert not agree.flagged and not agree_forced.flagged, (agree, agree_forced)
    assert all(t["q_error"] is None for t in res.info["layers"]), (
        "a kernel failed its self-check (printed above)"
    )


def _every_1x1_persistent(res) -> int:
    """Point every quantized 1×1 stride-1 layer of a prepared network at a persistent tile (cycling through
    `tiles.persistent_configs`' kinds, TMA epilogue included); returns how many."""
    from deepgap.measure.quant.tiles import persistent_configs

    n = 0
    for name, (backend, _) in sorted(res.tuned.items()):
        node = res.net.convs[name].node
        tiles = persistent_configs(node, 1 << 20, torch.cuda.get_device_capability(), res.net.qfmt)
        if backend == "triton" and tiles:
            res.tuned[name] = ("triton", tiles[n % len(tiles)])
            n += 1
    return n
