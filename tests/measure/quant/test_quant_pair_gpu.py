"""The fused pair of 1×1 convolutions (quant.pair) on a Hopper GPU (skipped without CUDA or below sm_90).

    python -m pytest tests/measure/quant/test_quant_pair_gpu.py -v -rA

Every offered tile against the two layers run by the separate kernels at ResNet-50's layer1 pair shapes
(int8 bit for bit; fp8 within the tuner's own check, as its fp32 sums may run in another order), with enough
rows that each program walks several tiles; and ResNet-50 with its layer1 pairs forced in, against the same
network run layer by layer.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the pair kernel's TMA descriptors need compute capability ≥ 9.0")


def _layer(name, inp, out, qfmt, cin, cout, res, seed):
    from deepgap.measure.quant import layers
    from deepgap.measure.quant.fold import ConvNode

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(cout, cin, 1, 1, generator=g) * (2.0 / cin) ** 0.5
    node = ConvNode(name, inp, out, w, torch.randn(cout, generator=g) * 0.1, 1, 0, True, "r" if res else None)
    fmts = dict.fromkeys((inp, out, "r"), qfmt)
    return layers.make_qconv(node, qfmt, "q", fmts, dict.fromkeys((inp, out, "r"), 0.05)).to(DEV)


def _poisoned(ref: torch.Tensor) -> torch.Tensor:
    """A tensor like ``ref`` of a code no kernel writes: −128 in int8 (outputs clamp to ±127), NaN in fp8."""
    return (
        torch.empty_like(ref)
        .view(torch.uint8)
        .fill_(0x80 if ref.dtype == torch.int8 else 0x7F)
        .view(ref.dtype)
    )


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("n2", [64, 128], ids=["layer1", "layer1-to-layer2"])
def test_every_offered_tile_equals_the_separate_kernels(qfmt, n2):
    from deepgap.measure.quant import kernels, pair, tuning
    from deepgap.measure.quant.tiles import candidate_configs

    first = _layer("c3", "a", "t", qfmt, 64, 256, True, seed=n2)
    second = _layer("c1", "t", "u", qfmt, 256, n2, False, seed=n2 + 1)
    m = 8 * 56 * 56  # 25,088 rows: 196 tiles of 128 over 132 programs
    x, res = tuning.rand_act(m, 64, qfmt, DEV), tuning.rand_act(m, 256, qfmt, DEV)

    def alone(layer, inp, r):
        n = layer.node
        cfg = candidate_configs(m, n.cout, n.cin, qfmt, r is not None)[0]
        return kernels.conv_gemm(inp, (1, m, 1), layer.w_q, 1, 1, 0, layer.alpha, layer.beta, qfmt, True, cfg,
                                 r, layer.gamma)  # fmt: skip

    t_ref = alone(first, x, res)
    u_ref = alone(second, t_ref, None)
    cfgs = pair.pair_configs(64, 256, n2, qfmt)
    assert cfgs
    for cfg in cfgs:
        t, u = _poisoned(t_ref), _poisoned(u_ref)  # a tile never written shows
        pair.run(first, second, x, res, cfg, out=(t, u))
        torch.cuda.synchronize()
        if qfmt == "int8":
            assert torch.equal(t, t_ref) and torch.equal(u, u_ref), cfg.label
        else:
            assert tuning._agree(t, t_ref, "fp8") is None, cfg.label
            assert tuning._agree(u, u_ref, "fp8") is None, cfg.label


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
def test_resnet50_with_its_layer1_pairs_equals_it_layer_by_layer(qfmt):
    """Pairs forced in (the two layers' times set huge), tiles from the heuristic, eager forward at batch 32."""
    from torchvision import models

    from deepgap.measure.quant import pair_choice
    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build
    from deepgap.measure.quant.tiles import LayerTiming

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet50().eval())
    amax = collect_amax(graph, calibration_images(2, 224, 0), method="max")
    net = build(graph, qfmt, amax, {}, 224).to(DEV)
    net.backend = dict.fromkeys(net.convs, "triton")
    net.stem_backend = "triton"
    batch = 32
    slow = [LayerTiming(n, 0, q_s=1.0) for n in net.convs]
    rows = pair_choice.choose_pairs(net, batch, slow, reps=3)
    assert [r["first"] for r in rows] == ["layer1.0.conv3", "layer1.1.conv3", "layer1.2.conv3"]
    assert all(r["kept"] for r in rows), rows
    x = torch.randn(batch, 3, 224, 224, device=DEV).half().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        fused = net.forward(x)
        plain = dataclasses.replace(net, pairs={}).forward(x)
    if qfmt == "int8":
        assert torch.equal(fused, plain)
    else:
        rel = float((fused - plain).norm() / plain.norm())
        assert rel < 0.02, rel
