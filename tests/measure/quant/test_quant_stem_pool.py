"""The int8-pixel stem with the max-pool in its kernel (`quant.stem_pool`) vs the unfused stem, bit for bit.

On the CPU through the Triton interpreter: int8 and fp16 outputs equal `stem_int8.reference` exactly; fp8
outputs equal the unfused kernel pair's (`stem_int8.stem`, interpreted too: the interpreter's known e4m3
misrounding is the same in both, test_quant_stem_int8). Compiled for sm_90 with no GPU: no spills. On a GPU
(marked ``gpu``): equal to the unfused stem at ResNet's 224² and batch 1, 8, 256.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

triton = pytest.importorskip("triton")

from sm90 import compile_sm90, ptxas_usage  # noqa: E402

from deepgap.measure.quant import layers, stem_int8, stem_pool  # noqa: E402
from deepgap.measure.quant.kernels import OUT_KIND  # noqa: E402


def _case(nb, h, w, seed=0, device="cpu"):
    """Pixels, packed weights and an epilogue whose outputs span the 8-bit range (some clamp, many are 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nb, 3, h, w, generator=g)
    w_i8, _ = stem_int8.pack_weights(torch.randn(64, 3, 7, 7, generator=g, dtype=torch.float64) * 0.2)
    alpha = torch.rand(64, generator=g) * 0.01 + 0.001
    beta = torch.randn(64, generator=g)
    pixels = stem_int8.quantize_image(x.to(device), 0.03, backend="torch")
    return pixels, w_i8.to(device), alpha.to(device), beta.to(device)


def test_pooling_the_codes_is_quantizing_the_pooled_values():
    """Why the kernel may max-reduce 8-bit codes: the epilogue (α > 0, then ReLU) is monotone per channel."""
    g = torch.Generator().manual_seed(4)
    acc = torch.randn(2, 64, 15, 13, generator=g, dtype=torch.float64).mul(900).round()
    alpha, beta = torch.rand(64, generator=g) * 0.05 + 1e-3, torch.randn(64, generator=g) * 3
    for fmt in ("int8", "fp8", "fp16"):

        def epi(a, fmt=fmt):
            flat = a.permute(0, 2, 3, 1).reshape(-1, 64).float()
            return layers.epilogue_reference(flat, alpha, beta, fmt, True).float()

        codes = epi(acc).reshape(2, 15, 13, 64).permute(0, 3, 1, 2)
        pooled_codes = F.max_pool2d(codes, 3, 2, 1).permute(0, 2, 3, 1).reshape(-1, 64)
        assert torch.equal(pooled_codes, epi(F.max_pool2d(acc, 3, 2, 1)))
        assert float(codes.min()) == 0.0  # ReLU: the pool's padding (−inf, or 0 in the kernels) never wins


@pytest.mark.parametrize(
    "hw,cfg,out_fmt",
    [
        ((32, 32), (8, 8, 4, 3), "int8"),  # 8×8 pooled: one tile and its halo
        ((29, 35), (4, 8, 4, 1), "int8"),  # odd sizes: 8×9 pooled, convolution rows/columns past the edge
        ((64, 64), (8, 16, 8, 1), "fp16"),  # 16×16 pooled: tiles overlapping by one in both directions
        ((29, 35), (4, 4, 4, 3), "fp8"),
    ],
)
def test_the_fused_pool_equals_the_unfused_stem_bit_for_bit(hw, cfg, out_fmt):
    pixels, w_i8, alpha, beta = _case(2, *hw)
    args = (pixels, w_i8, 7, 2, 3, alpha, beta, out_fmt)
    out = stem_pool.stem(*args, cfg[:2], *cfg[2:])
    unfused = stem_int8.stem(*args, block_m=64)
    assert out.shape == unfused.shape == (2 * ((hw[0] + 3) // 4) * ((hw[1] + 3) // 4), 64)
    assert out.dtype == unfused.dtype and torch.equal(out.float(), unfused.float())
    assert bool((out.float() > 0).any()) and bool((out.float() == 0).any())  # not all clamped to one value
    if out_fmt != "fp8":  # the interpreter misrounds e4m3 (module docstring); the GPU test checks fp8
        assert torch.equal(out.float(), stem_int8.reference(*args).float())


def test_tiles_overlap_by_one_and_cover_the_output():
    assert stem_pool.tile_grid(56, 56, (8, 8)) == (8, 8)  # 56 = 8 tiles of 7 new rows
    assert stem_pool.tile_grid(56, 56, (8, 16)) == (8, 4)
    assert stem_pool.tile_grid(1, 1, (8, 8)) == (1, 1)


def test_bad_input_is_refused():
    pixels, w_i8, alpha, beta = _case(1, 8, 8)
    args = (pixels, w_i8, 7, 2, 3, alpha, beta)
    with pytest.raises(ValueError, match="powers of two"):
        stem_pool.stem(*args, "int8", (6, 8))
    with pytest.raises(ValueError, match="int8, fp8 or fp16"):
        stem_pool.stem(*args, "fp32")
    with pytest.raises(ValueError, match="pixels"):
        stem_pool.stem(pixels.float(), *args[1:], "int8")


@pytest.mark.parametrize(
    "cfg,out_fmt", [(cfg, "fp8") for cfg in stem_pool.CONFIGS] + [((8, 8, 4, 3), "int8")]
)
def test_it_compiles_for_hopper_to_wgmma_without_spills(cfg, out_fmt):
    """Every configuration the engine times, ahead of time for sm_90 (no GPU): int8 wgmma, no spills."""
    sig = {"x_ptr": "*i8", "w_ptr": "*i8", "out_ptr": "*fp8e4nv" if out_fmt == "fp8" else "*i8"}
    sig |= {"alpha_ptr": "*fp32", "beta_ptr": "*fp32"}
    sig |= {k: "i32" for k in ("H", "W", "OH", "OW", "PH", "PW", "TR", "TC")}
    const = dict(N=64, KH=7, KW=7, KP=7 * stem_int8.ROW, STRIDE=2, PAD=3, OUT_KIND=OUT_KIND[out_fmt],
                 R=cfg[0], C=cfg[1], BK=stem_int8.ROW, PDL=False)  # fmt: skip
    compiled = compile_sm90(
        stem_pool.stem_pool_kernel, sig, const, ("x_ptr", "w_ptr", "out_ptr", "alpha_ptr", "beta_ptr"),
        num_warps=cfg[2], num_stages=cfg[3], enable_fp_fusion=False,
    )  # fmt: skip
    assert "wgmma.mma_async.sync.aligned" in compiled.asm["ptx"] and ".s32.s8.s8" in compiled.asm["ptx"]
    use = ptxas_usage(compiled)
    assert use["spill_stores"] == use["spill_loads"] == 0, use


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 256])
@pytest.mark.parametrize("out_fmt", ["int8", "fp8"])
def test_on_gpu_it_equals_the_unfused_int8_stem(batch, out_fmt):
    """ResNet's 224² stem, every configuration the engine times, bit for bit against the unfused kernels."""
    pixels, w_i8, alpha, beta = _case(batch, 224, 224, device="cuda")
    args = (pixels, w_i8, 7, 2, 3, alpha, beta, out_fmt)
    unfused = stem_int8.stem(*args, block_m=128)
    if batch <= 8:
        assert torch.equal(unfused.float(), stem_int8.reference(*args).float())
    for cfg in stem_pool.CONFIGS:
        out = stem_pool.stem(*args, cfg[:2], *cfg[2:])
        assert out.shape == (batch * 56 * 56, 64) and torch.equal(out.float(), unfused.float()), cfg


@pytest.mark.gpu
def test_on_gpu_the_engine_times_every_fused_variant_and_names_it(monkeypatch):
    """With ``DEEPGAP_QUANT_STEM_POOL=on`` the stem choice offers each `stem_pool.CONFIGS` tile; each agrees
    with cuDNN's stem and is timed. Unset, none is offered."""
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build
    from deepgap.measure.quant.stem_choice import choose_stem

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet18().eval())
    net = build(graph, "int8", collect_amax(graph, calibration_images(2, 64, 0), method="max"), {}, 64)
    net = net.to("cuda")
    net.stem_backend = "triton"
    names = ["int8+pool{}x{}+{}w{}s".format(*cfg) for cfg in stem_pool.CONFIGS]
    monkeypatch.delenv("DEEPGAP_QUANT_STEM_POOL", raising=False)
    assert not set(names) & set(choose_stem(net, 8, 64, "cuda", use_triton=True)["seconds"])
    monkeypatch.setenv("DEEPGAP_QUANT_STEM_POOL", "on")
    info = choose_stem(net, 8, 64, "cuda", use_triton=True)
    assert all(info["seconds"].get(name, 0) > 0 for name in names), info
    assert net.stem.variant == info["chosen"]


def test_the_fused_stems_are_offered_only_when_switched_on(monkeypatch):
    from deepgap.core.errors import UsageError
    from deepgap.measure.quant.stem_choice import pool_offered

    monkeypatch.delenv("DEEPGAP_QUANT_STEM_POOL", raising=False)
    assert not pool_offered()
    monkeypatch.setenv("DEEPGAP_QUANT_STEM_POOL", "on")
    assert pool_offered()
    monkeypatch.setenv("DEEPGAP_QUANT_STEM_POOL", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_STEM_POOL"):
        pool_offered()
