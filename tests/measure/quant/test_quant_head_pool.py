"""The head's average pool in one Triton kernel (`quant.head_pool`) against torch's path, and its choice."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import head_pool  # noqa: E402
from deepgap.measure.quant.stem_choice import choose_head  # noqa: E402


def _rows(batch, hw, c, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(batch * hw, c, generator=g).clamp(min=0) * 40
    if dtype == torch.int8:
        return y.round().clamp(max=127).to(torch.int8)
    return y.to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float16])
@pytest.mark.parametrize("hw", [1, 49, 70])  # 70: two row blocks of 64, the second partial
def test_the_kernel_sums_each_image_as_torch_does(dtype, hw):
    y = _rows(3, hw, 300, dtype)  # 300 channels: a partial block of 128
    got = head_pool.pool(y, 3, 0.05 / hw)
    ref = head_pool.pool(y, 3, 0.05 / hw, backend="torch")
    assert got.shape == ref.shape == (3, 300) and got.dtype == torch.float32
    if dtype == torch.int8:
        assert torch.equal(got, ref)  # exact integer sums, the same scale multiply
    else:
        assert torch.allclose(got, ref, rtol=1e-6, atol=0)


def test_under_pdl_it_waits_for_the_last_convolution_before_its_first_load():
    """As every kernel of the network (test_quant_pdl): sm_90 code, ahead of time, no GPU."""
    sig = {"y_ptr": "*fp8e4nv", "out_ptr": "*fp32", "HW": "i32", "C": "i32", "scale": "fp32"}
    for pdl in (True, False):
        ptx = compile_sm90(
            head_pool.pool_kernel, sig, dict(BR=64, BC=128, PDL=pdl), ("y_ptr", "out_ptr")
        ).asm["ptx"]
        if pdl:
            assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
        else:
            assert "griddepcontrol" not in ptx


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="rows"):
        head_pool.pool(torch.zeros(7, 4, dtype=torch.int8), 2, 1.0)


def test_inside_the_network_and_its_choice_on_the_cpu():
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet18().eval())
    net = build(graph, "int8", collect_amax(graph, calibration_images(2, 64, 0), method="max"), {}, 64)
    h, w, c = net.shapes[net.head.inp]
    y = _rows(2, h * w, c, torch.int8, seed=1)
    ref = net.run_head(y, 2)
    net.head_kernel = "triton"
    assert torch.equal(net.run_head(y, 2), ref)  # int8: bit for bit
    assert choose_head(net, 2, "cpu", True) == {"chosen": "torch", "reason": "not on a GPU"}
    assert net.head_kernel == "torch"
    # the fallback switch: torch's head on a GPU too, the kernel never tried (so no GPU is touched here)
    net.head_kernel = "triton"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPGAP_QUANT_HEAD", "torch")
        assert choose_head(net, 2, "cuda", True) == {"chosen": "torch", "reason": "DEEPGAP_QUANT_HEAD=torch"}
        assert net.head_kernel == "torch"
        mp.setenv("DEEPGAP_QUANT_HEAD", "off")
        with pytest.raises(UsageError, match="DEEPGAP_QUANT_HEAD"):
            choose_head(net, 2, "cuda", True)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_on_gpu_both_are_timed_and_the_faster_kept(precision):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet50().eval())
    net = build(graph, precision, collect_amax(graph, calibration_images(2, 224, 0), method="max"), {}, 224)
    net = net.to("cuda")
    for batch in (1, 256):
        info = choose_head(net, batch, "cuda", True)
        assert set(info["seconds"]) == {"torch", "triton"}, info
        assert net.head_kernel == info["chosen"] == min(info["seconds"], key=info["seconds"].get)
        print(f"\n{precision} batch {batch}: head {info}")
