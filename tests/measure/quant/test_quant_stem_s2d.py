"""The space-to-depth int8 stem (`quant.stem_s2d`) on the CPU through the Triton interpreter.

Its sums are the int8-pixel stem's integers rearranged, so every output must equal `stem_int8.reference`'s
bit for bit (int8 and fp16; fp8 loosely in the interpreter, whose e4m3 rounding misses near binade edges).
Its own torch reference works on super pixels, so agreeing with `stem_int8` checks the layout and the weight
packing too.
"""

from __future__ import annotations

import re

import pytest
import torch

triton = pytest.importorskip("triton")

from conftest import case_id, stem_case, with_sizes_in_turn  # noqa: E402
from sm90 import assert_swapped_stem, compile_sm90  # noqa: E402

from deepgap.measure.quant import stem_int8, stem_s2d  # noqa: E402
from deepgap.measure.quant.kernels import OUT_KIND  # noqa: E402
from deepgap.measure.quant.stem_choice import STEM_VARIANTS  # noqa: E402
from deepgap.measure.quant.tiles import stem_tile_args  # noqa: E402


def _assert_equal(out: torch.Tensor, ref: torch.Tensor, out_fmt: str) -> None:
    """Bit for bit, except fp8 in the interpreter (its e4m3 rounding: see the module docstring)."""
    o, r = out.float(), ref.float()
    if out_fmt != "fp8":
        assert torch.equal(o, r)
    else:
        close = (o - r).abs() <= r.abs() / 2 + 2**-8
        assert bool(close.all()) and float((o == r).float().mean()) > 0.9


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_quantize_writes_the_int8_pixels_as_super_pixels(memory_format):
    x = (torch.randn(2, 3, 10, 14, generator=torch.Generator().manual_seed(1)) * 3).half()
    x = x.contiguous(memory_format=memory_format)
    got = stem_s2d.quantize(x, 0.03)
    pixels = stem_int8.quantize_image(x, 0.03, backend="torch")
    assert got.dtype == torch.int8 and got.shape == (2, 16, 5, 7)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, stem_s2d.quantize(x, 0.03, backend="torch"))
    assert torch.equal(got, stem_s2d.to_super(pixels))
    nhwc = got.permute(0, 2, 3, 1).reshape(2, 5, 7, 2, 2, 4)  # [n, Y, X, dy, dx, c]
    assert torch.equal(
        nhwc[1, 2, 3, 1, 0, :3], pixels[1, :3, 5, 6]
    )  # pixel (5, 6) is super (2, 3), dy 1, dx 0
    assert not nhwc[..., 3].any()  # the zero channel


def test_pack_weights_keeps_the_int8_values_in_the_padded_kernel():
    w = torch.randn(8, 3, 7, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    packed, scale = stem_s2d.pack_weights(w, 3)
    w_i8, scale_px = stem_int8.pack_weights(w)
    assert packed.shape == (8, 256) and packed.dtype == torch.int8 and torch.equal(scale, scale_px)
    k = packed.reshape(8, 4, 4, 2, 2, 4)  # [co, ty, tx, dy, dx, c]
    assert not k[:, 0, :, 0].any() and not k[:, :, 0, :, 0].any()  # row and column 0 of the 8×8: the shift
    assert not k[..., 3].any()
    assert int(k[5, 1, 2, 0, 1, 2]) == int(
        stem_int8.unpack_weights(w_i8, 7, 7)[5, 2, 1, 4]
    )  # kh 2·1+0-1, kw 4
    assert torch.equal(packed.double().abs().sum(1), w_i8.double().abs().sum(1))


@pytest.mark.parametrize("out_fmt,walk,hw", with_sizes_in_turn(["int8", "fp8", "fp16"], [0, 3]), ids=case_id)
def test_the_s2d_stem_equals_the_int8_pixel_stem(out_fmt, walk, hw):
    """A program per tile, and the persistent walk of 3 programs (0 and 3 in the ids)."""
    x, weight, alpha, beta = stem_case(*hw)
    ref = stem_int8.reference(stem_int8.quantize_image(x, 0.03), stem_int8.pack_weights(weight)[0], 7, 2, 3, alpha,
                              beta, out_fmt)  # fmt: skip
    xs, ws = stem_s2d.quantize(x, 0.03), stem_s2d.pack_weights(weight, 3)[0]
    own = stem_s2d.reference(xs, ws, 7, 2, 3, alpha, beta, out_fmt)
    assert torch.equal(own.float(), ref.float())
    out = stem_s2d.stem(xs, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=64, persistent=walk, num_programs=walk)
    assert out.shape == ref.shape == (2 * ((hw[0] + 3) // 4) * ((hw[1] + 3) // 4), 64)
    _assert_equal(out, ref, out_fmt)


@pytest.mark.parametrize(
    "out_fmt,walk,hw",
    with_sizes_in_turn(["int8", "fp8", "fp16"], ["walk-3", "one-program", "spare"]),
    ids=case_id,
)
def test_the_swapped_kernel_equals_the_int8_pixel_stem(out_fmt, walk, hw):
    """`stem_s2d.stem_swap_kernel` (weights as the MMA's M side): tiles walked by 3 programs with a partial last
    one, one program for all, and more programs than tiles."""
    block, programs = {"walk-3": (64, 3), "one-program": (128, 1), "spare": (64, 100)}[walk]
    x, weight, alpha, beta = stem_case(*hw)
    ref = stem_int8.reference(stem_int8.quantize_image(x, 0.03), stem_int8.pack_weights(weight)[0], 7, 2, 3, alpha,
                              beta, out_fmt)  # fmt: skip
    xs, ws = stem_s2d.quantize(x, 0.03), stem_s2d.pack_weights(weight, 3)[0]
    out = stem_s2d.stem(xs, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=block, num_programs=programs, swap=2)
    _assert_equal(out, ref, out_fmt)


def test_bad_inputs_are_refused():
    one, zero = torch.ones(64), torch.zeros(64)
    ws = torch.zeros(64, 256, dtype=torch.int8)
    with pytest.raises(ValueError, match="super pixels"):  # 4-byte pixels into the s2d stem
        stem_s2d.stem(torch.zeros(1, 4, 8, 8, dtype=torch.int8), ws, 7, 2, 3, one, zero, "int8")
    sup = torch.zeros(1, 16, 4, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="stride 2"):
        stem_s2d.stem(sup, ws, 7, 1, 3, one, zero, "int8")
    with pytest.raises(ValueError, match=r"int8 \[C_out, 256\]"):
        stem_s2d.stem(sup, torch.zeros(64, 224, dtype=torch.int8), 7, 2, 3, one, zero, "int8")
    with pytest.raises(ValueError, match="even image size"):
        stem_s2d.quantize(torch.zeros(1, 3, 9, 8), 0.03)
    with pytest.raises(ValueError, match="64 output channels"):
        stem_s2d.stem(
            sup, torch.zeros(32, 256, dtype=torch.int8), 7, 2, 3, one[:32], zero[:32], "int8", swap=2
        )
    with pytest.raises(ValueError, match="kernels up to"):
        stem_s2d.pack_weights(torch.zeros(4, 3, 9, 9), 3)


def test_the_s2d_stem_inside_the_network():
    """Chosen like any stem variant: a float batch equals its resident super pixels and the int8 stem."""
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
    pixels = net.stem.quantize(x, "torch")
    net.stem.configure("int8s2d", 0, (64, 4, 2))
    assert net.stem.variant == "int8s2d+64x4wp2" and net.stem.kernel == "int8" and net.stem.super_pixels
    assert net.stem.w_i8.shape == (64, 256) and "space-to-depth" in net.stem.input_layout
    supers = net.stem.quantize(x, "triton")
    assert supers.shape == (2, 16, 16, 16)
    assert torch.equal(net.run_stem(x, "triton"), ref)
    assert torch.equal(net.run_stem(supers, "triton"), ref)
    assert torch.equal(net.run_stem(x, "torch"), ref)
    with pytest.raises(ValueError, match="super pixels"):
        net.run_stem(pixels, "triton")
    assert net.to("cpu").stem.variant == "int8s2d+64x4wp2" and net.stem.w_i8.shape == (
        64,
        256,
    )  # moving keeps it
    net.stem.configure("int8", 0, (64, 4))
    assert not net.stem.super_pixels and net.stem.w_i8.shape == (64, 7 * 32)


def test_for_hopper_the_gather_moves_16_bytes_at_a_time():
    """The point of the layout, read from the sm_90 PTX (no GPU): the persistent walk's pixel loads are 16-byte
    ``cp.async`` on super pixels, where the 4-byte pixels' are 4-byte ones (the weights' are 16-byte in both);
    both feed an int8 wgmma."""
    sig = {"x_ptr": "*i8", "w_ptr": "*i8", "out_ptr": "*fp8e4nv", "alpha_ptr": "*fp32", "beta_ptr": "*fp32"}
    sig |= {k: "i32" for k in ("M", "H", "W", "OH", "OW")}
    common = dict(N=64, OUT_KIND=OUT_KIND["fp8"], BM=128, NUM_SMS=396, PDL=False)
    layouts = {
        16: dict(KH=4, KW=4, STRIDE=1, PAD=2, C=stem_s2d.SUPER, BK=stem_s2d.ROW),
        4: dict(KH=7, KW=7, STRIDE=2, PAD=3, C=stem_int8.PIXEL, BK=stem_int8.ROW),
    }
    for width, const in layouts.items():
        compiled = compile_sm90(
            stem_int8.stem_conv_persistent_kernel, sig, {**common, **const}, ("x_ptr", "w_ptr", "out_ptr"),
            num_warps=4, enable_fp_fusion=False,
        )  # fmt: skip
        ptx = compiled.asm["ptx"]
        assert "wgmma.mma_async.sync.aligned" in ptx and ".s32.s8.s8" in ptx
        sizes = set(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], (0x[0-9a-f]+)", ptx))
        assert sizes == ({"0x10"} if width == 16 else {"0x4", "0x10"}), (width, sizes)  # weights: 16 bytes


@pytest.mark.parametrize("cfg", stem_s2d.SWAP_TILES)
def test_the_swapped_kernel_compiles_for_hopper_to_one_wide_wgmma(cfg):
    """Each tile timed (no GPU): the 64 channels are the wgmma's M and the tile's pixels its N (64-128 wide),
    the pixels' gather 16-byte ``cp.async``, no spill; the shared memory of its programs fits one SM."""
    block, warps, stages, per_sm = cfg
    sig = {"x_ptr": "*i8", "w_ptr": "*i8", "out_ptr": "*fp8e4nv", "alpha_ptr": "*fp32", "beta_ptr": "*fp32"}
    sig |= {k: "i32" for k in ("M", "H2", "W2", "OH", "OW")}
    const = dict(
        N=64, PAD=2, OUT_KIND=OUT_KIND["fp8"], BM=block, NUM_PROGRAMS=132 * per_sm, STAGES=stages, PDL=False
    )
    compiled = compile_sm90(stem_s2d.stem_swap_kernel, sig, const, ("x_ptr", "w_ptr", "out_ptr"), num_warps=warps,
                            enable_fp_fusion=False)  # fmt: skip
    assert_swapped_stem(compiled, block, warps, per_sm)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 256])
@pytest.mark.parametrize("out_fmt", ["int8", "fp8"])
def test_on_gpu_every_offered_tile_equals_the_int8_pixel_stem(batch, out_fmt):
    """ResNet's 224² stem at each space-to-depth tile the engine times, bit for bit against the 4-byte pixels'."""
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g).half()
    weight = torch.randn(64, 3, 7, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.2
    alpha = torch.rand(64, device="cuda", generator=g) * 0.01 + 0.001
    beta = torch.randn(64, device="cuda", generator=g)
    pixels, supers = stem_int8.quantize_image(x, 0.03), stem_s2d.quantize(x, 0.03)
    assert torch.equal(supers, stem_s2d.to_super(pixels))
    w_i8 = stem_int8.pack_weights(weight)[0].cuda()
    ws = stem_s2d.pack_weights(weight, 3)[0].cuda()
    ref = stem_int8.stem(pixels, w_i8, 7, 2, 3, alpha, beta, out_fmt, block_m=128)
    if batch <= 8:
        assert torch.equal(ref.float(), stem_s2d.reference(supers, ws, 7, 2, 3, alpha, beta, out_fmt).float())
    for cfg in [cfg for kind, _, cfg in STEM_VARIANTS if kind == "int8s2d"] + [(128, 8, 2), (256, 8, 1)]:
        out = stem_s2d.stem(supers, ws, 7, 2, 3, alpha, beta, out_fmt, **stem_tile_args(cfg))
        assert torch.equal(out.float(), ref.float()), cfg
    for block, warps, stages, per_sm in stem_s2d.SWAP_TILES:
        out = stem_s2d.stem(supers, ws, 7, 2, 3, alpha, beta, out_fmt, block_m=block, num_warps=warps,
                            persistent=per_sm, swap=stages)  # fmt: skip
        assert torch.equal(out.float(), ref.float()), (block, warps, stages, per_sm)
