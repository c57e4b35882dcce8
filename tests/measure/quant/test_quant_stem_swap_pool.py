"""The swapped super-pixel stem with its max-pool inside (`quant.stem_swap_pool`), on the CPU through Triton's
interpreter, compiled for sm_90 without a GPU, and on a GPU.

Every output must equal `stem_int8.reference`'s (the 4-byte-pixel convolution, its epilogue, then the max-pool)
bit for bit for int8 and fp16, and the unfused swapped stem's for fp8 (the interpreter's e4m3 rounding misses
the reference near binade edges, the same in both kernels).
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from conftest import case_id, stem_case, with_sizes_in_turn  # noqa: E402
from sm90 import assert_swapped_stem, compile_sm90  # noqa: E402

from deepgap.measure.quant import stem_int8, stem_s2d, stem_swap_pool  # noqa: E402
from deepgap.measure.quant.kernels import OUT_KIND  # noqa: E402


def _case(hw: tuple[int, int], out_fmt: str):
    x, weight, alpha, beta = stem_case(*hw)
    ref = stem_int8.reference(stem_int8.quantize_image(x, 0.03), stem_int8.pack_weights(weight)[0], 7, 2, 3, alpha,
                              beta, out_fmt)  # fmt: skip
    xs, ws = stem_s2d.quantize(x, 0.03), stem_s2d.pack_weights(weight, 3)[0]
    return xs, ws, alpha, beta, ref


_WALKS = {
    "one-row-bands": (1, 3, 64),
    "a-partial-last-band": (3, 2, 64),
    "more-programs-than-bands": (4, 100, 128),
}


@pytest.mark.parametrize("walk,out_fmt,hw", with_sizes_in_turn(_WALKS, ["int8", "fp16", "fp8"]), ids=case_id)
def test_the_pooled_stem_equals_the_unfused_stems(walk, out_fmt, hw):
    """Bands of 1, 3 (8 and 9 pooled rows are not multiples: the last band is partial) and 4 pooled rows; the
    programs walk several bands each (the scratch reused), or one each with programs to spare."""
    band, programs, block = _WALKS[walk]
    xs, ws, alpha, beta, ref = _case(hw, out_fmt)
    out = stem_swap_pool.stem(
        xs, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=block, band=band, num_programs=programs
    )
    assert out.shape == ref.shape == (2 * ((hw[0] + 3) // 4) * ((hw[1] + 3) // 4), 64)
    unfused = stem_s2d.stem(xs, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=64, num_programs=3, swap=2)
    assert torch.equal(out.float(), unfused.float())
    if out_fmt != "fp8":
        assert torch.equal(out.float(), ref.float())


def test_bad_inputs_are_refused():
    xs, ws, alpha, beta, _ = _case((16, 16), "int8")
    with pytest.raises(ValueError, match="3×3/2 max-pool"):
        stem_swap_pool.stem(xs, ws, 7, 2, 3, alpha, beta, "int8", pool=(2, 2, 0))
    with pytest.raises(ValueError, match="band"):
        stem_swap_pool.stem(xs, ws, 7, 2, 3, alpha, beta, "int8", band=0)
    with pytest.raises(ValueError, match="64 output channels"):
        stem_swap_pool.stem(xs, ws[:32], 7, 2, 3, alpha[:32], beta[:32], "int8")


def test_the_cpu_path_is_the_reference():
    xs, ws, alpha, beta, ref = _case((16, 20), "int8")
    out = stem_swap_pool.stem(xs, ws, 7, 2, 3, alpha, beta, "int8", backend="torch")
    assert torch.equal(out.float(), ref.float())


def test_tile_names_and_arguments():
    cfg = stem_swap_pool.TILES[0]
    assert stem_swap_pool.tile_name(cfg) == "{}x{}ws{}p{}t{}".format(*cfg)
    args = stem_swap_pool.tile_args((256, 8, 3, 2, 8))
    assert args == {"block_m": 256, "num_warps": 8, "stages": 3, "persistent": 2, "band": 8}


# The tiles that ask the most of an SM: the widest band, two programs an SM, three stages, 256 pixels and 8 warps.
# The other three (bands of 4, 2 and 1 at 128 or 64 pixels, one program an SM) need no more shared memory and
# about the same registers (at Triton 3.6: 121-181 against these tiles' 122-179 at two stages, none spilled), and
# each compile here costs 3-4 CPU-s; `benchmarks/compile_sm90.py` compiles all seven before a device call.
_HEAVIEST = [(128, 4, 2, 1, 8), (128, 4, 2, 2, 4), (128, 4, 3, 1, 4), (256, 8, 2, 1, 4)]


def test_the_heaviest_tiles_are_offered_tiles():
    assert set(_HEAVIEST) <= set(stem_swap_pool.TILES)


@pytest.mark.parametrize("cfg", _HEAVIEST, ids=stem_swap_pool.tile_name)
def test_the_heaviest_tiles_compile_for_hopper_to_one_wide_wgmma_without_spilling(cfg):
    """The convolution phase is the swapped kernel's (m64n64-128 int8 wgmma, 16-byte ``cp.async`` gathers); nothing
    spills, and the shared memory of a tile's programs fits one SM."""
    block, warps, stages, per_sm, band = cfg
    sig = {"x_ptr": "*i8", "w_ptr": "*i8", "out_ptr": "*fp8e4nv", "scratch_ptr": "*fp8e4nv", "alpha_ptr": "*fp32",
           "beta_ptr": "*fp32"}  # fmt: skip
    sig |= {k: "i32" for k in ("H2", "W2", "OH", "OW", "PH", "PW", "BANDS", "PER_IMAGE", "QP")}
    const = dict(N=64, PAD=2, OUT_KIND=OUT_KIND["fp8"], BM=block, T=band, NUM_PROGRAMS=132 * per_sm, STAGES=stages,
                 CODES=False, PDL=False)  # fmt: skip
    compiled = compile_sm90(stem_swap_pool.stem_swap_pool_kernel, sig, const, ("x_ptr", "w_ptr", "out_ptr",
                            "scratch_ptr"), num_warps=warps, enable_fp_fusion=False)  # fmt: skip
    assert "bar.sync" in assert_swapped_stem(compiled, block, warps, per_sm)  # and the band's barriers


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 256])
@pytest.mark.parametrize("out_fmt", ["int8", "fp8"])
def test_on_gpu_every_tile_equals_the_unfused_stem(batch, out_fmt):
    """ResNet's 224² stem at every tile, bit for bit against the engine's unfused super-pixel pair."""
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g).half()
    weight = torch.randn(64, 3, 7, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.2
    alpha = torch.rand(64, device="cuda", generator=g) * 0.01 + 0.001
    beta = torch.randn(64, device="cuda", generator=g)
    xs, ws = stem_s2d.quantize(x, 0.03), stem_s2d.pack_weights(weight, 3)[0].cuda()
    ref = stem_s2d.stem(xs, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=128)
    for cfg in stem_swap_pool.TILES:
        out = stem_swap_pool.stem(xs, ws, 7, 2, 3, alpha, beta, out_fmt, **stem_swap_pool.tile_args(cfg))
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int8), ref.view(torch.int8)), cfg


def test_the_pooled_stem_inside_the_network():
    """Chosen like any stem variant (``int8swap``): a float batch and its resident super pixels give the int8 stem's
    output; configuring another stem afterwards leaves no swap tile behind."""
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet18().eval())
    net = build(graph, "int8", collect_amax(graph, calibration_images(2, 32, 0), method="max"), {}, 32)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)).half()
    net.stem.configure("int8", 0, (64, 4))
    ref = net.run_stem(x, "torch")
    cfg = (64, 4, 2, 1, 3)
    net.stem.configure("int8swap", 0, cfg)
    assert net.stem.variant == "int8swap+64x4ws2p1t3" and net.stem.kernel == "int8" and net.stem.super_pixels
    assert net.stem.swap_cfg == cfg and net.stem.w_i8.shape == (64, 256)
    supers = net.stem.quantize(x, "triton")
    assert torch.equal(net.run_stem(x, "triton"), ref)
    assert torch.equal(net.run_stem(supers, "triton"), ref)
    assert torch.equal(net.run_stem(x, "torch"), ref)
    net.stem.configure("int8s2d", 0, (64, 4))
    assert net.stem.swap_cfg is None and net.stem.variant == "int8s2d+64x4w"


def test_which_stem_variants_are_offered(monkeypatch):
    """The swapped convolution is offered unless ``DEEPGAP_QUANT_STEM_SWAP=off``; the pooled swapped stem only with
    ``DEEPGAP_QUANT_STEM_POOL_SWAP=on``; the variants behind no switch always."""
    from deepgap.measure.quant.stem_choice import STEM_VARIANTS, offered

    swap_conv = ("int8s2d", (128, 4, 2, 2))
    pooled = ("int8swap", stem_swap_pool.TILES[0])
    for env in ("DEEPGAP_QUANT_STEM_SWAP", "DEEPGAP_QUANT_STEM_POOL_SWAP", "DEEPGAP_QUANT_STEM_POOL"):
        monkeypatch.delenv(env, raising=False)
    assert ("int8s2d", 0, swap_conv[1]) in STEM_VARIANTS
    assert offered(*swap_conv) and not offered(*pooled) and offered("int8s2d", (128, 4)) and offered("cudnn")
    monkeypatch.setenv("DEEPGAP_QUANT_STEM_SWAP", "off")
    assert not offered(*swap_conv) and offered("int8s2d", (128, 4, 3))
    monkeypatch.setenv("DEEPGAP_QUANT_STEM_POOL_SWAP", "on")
    assert offered(*pooled) and not offered("int8pool", (8, 8, 4, 3))
