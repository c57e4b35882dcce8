"""The TMA-fed 3×3 convolution (quant.conv_tma) on a Hopper GPU (skipped without CUDA or below sm_90).

    python -m pytest tests/measure/quant/test_quant_conv_tma_gpu.py -v -rA

Every tile `conv_tma.tma_configs` offers (DEEPGAP_QUANT_CONV_TMA=on) at ResNet-50's 3×3 shapes (stride 1,
and stride 2 where a stage starts), against `conv_gemm_kernel` on the same operands: int8 bit for bit, fp8
within the tuner's own check (its fp32 sums may run in another order); the output buffer poisoned first, so
a block never stored shows.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _hopper(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the TMA convolution's descriptors need compute capability ≥ 9.0")
    monkeypatch.setenv("DEEPGAP_QUANT_CONV_TMA", "on")


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize(
    "h,c,s",
    [(56, 64, 1), (28, 128, 1), (14, 256, 1), (7, 512, 1), (56, 128, 2), (28, 256, 2), (14, 512, 2)],
    ids=["l1", "l2", "l3", "l4", "l2.0", "l3.0", "l4.0"],
)
def test_every_offered_tile_equals_the_grouped_kernel(qfmt, h, c, s):
    from deepgap.measure.quant import conv_tma, kernels, layers, tuning
    from deepgap.measure.quant.fold import ConvNode
    from deepgap.measure.quant.tiles import candidate_configs

    g = torch.Generator().manual_seed(h)
    node = ConvNode("c", "a", "b", torch.randn(c, c, 3, 3, generator=g) * (2.0 / (9 * c)) ** 0.5,
                    torch.randn(c, generator=g) * 0.1, s, 1, True)  # fmt: skip
    lay = layers.make_qconv(node, qfmt, "q", dict.fromkeys("ab", qfmt), {"a": 0.05, "b": 0.05}).to(DEV)
    nb = 4
    m = nb * (h // s) ** 2
    x = tuning.rand_act(nb * h * h, c, qfmt, DEV)
    args = (x, (nb, h, h), lay.w_q, 3, s, 1, lay.alpha, lay.beta, qfmt, True)
    ref = kernels.conv_gemm(*args, candidate_configs(m, c, c, qfmt)[0])
    cfgs = conv_tma.tma_configs(node, h, h, torch.cuda.get_device_capability(), explore=True)
    assert cfgs
    for cfg in cfgs:
        out = torch.empty_like(ref).view(torch.uint8).fill_(0x80 if qfmt == "int8" else 0x7F).view(ref.dtype)
        conv_tma.conv_gemm(*args, cfg, out=out)
        torch.cuda.synchronize()
        if qfmt == "int8":
            assert torch.equal(out, ref), cfg.label
        else:
            assert tuning._agree(out, ref, "fp8") is None, cfg.label


@pytest.mark.parametrize("qfmt", ["fp8", "int8"])
@pytest.mark.parametrize("h,c,s", [(28, 128, 1), (56, 128, 2)], ids=["l2", "l2.0"])
def test_every_offered_tile_gives_the_same_bits_at_every_launch_at_batch_256(qfmt, h, c, s):
    """Session 56 (one H100): at 3 and 4 stages every fp8 launch changed 0.1-1.9% of the outputs; `MAX_STAGES`."""
    from deepgap.measure.quant import conv_tma, layers, repeats, tuning
    from deepgap.measure.quant.fold import ConvNode

    g = torch.Generator().manual_seed(h)
    node = ConvNode("c", "a", "b", torch.randn(c, c, 3, 3, generator=g) * (2.0 / (9 * c)) ** 0.5,
                    torch.randn(c, generator=g) * 0.1, s, 1, True)  # fmt: skip
    lay = layers.make_qconv(node, qfmt, "q", dict.fromkeys("ab", qfmt), {"a": 0.05, "b": 0.05}).to(DEV)
    x = tuning.rand_act(256 * h * h, c, qfmt, DEV)
    cfgs = conv_tma.tma_configs(node, h, h, torch.cuda.get_device_capability(), explore=True)
    assert cfgs and all(cfg.num_stages <= conv_tma.MAX_STAGES for cfg in cfgs)
    args = (x, (256, h, h), lay.w_q, 3, s, 1, lay.alpha, lay.beta, qfmt, True)
    for cfg in cfgs:
        for _ in range(3):
            assert repeats.at_batch(lambda cfg=cfg: conv_tma.conv_gemm(*args, cfg)) is None, cfg.label
