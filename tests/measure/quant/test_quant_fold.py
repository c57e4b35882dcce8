"""BatchNorm folding and the ResNet → graph conversion of the quant engine (CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deepgap.measure.quant.fold import (
    ConvNode,
    HeadNode,
    PoolNode,
    UnsupportedModelError,
    conv_macs,
    fold_bn,
    infer_shapes,
    resnet_graph,
    run_float,
)


def _random_bn(c: int, g: torch.Generator) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, eps=1e-3)
    bn.running_mean.copy_(torch.randn(c, generator=g))
    bn.running_var.copy_(torch.rand(c, generator=g) + 0.2)
    bn.weight.data.copy_(torch.randn(c, generator=g))
    bn.bias.data.copy_(torch.randn(c, generator=g))
    return bn.eval()


@pytest.mark.parametrize("bias", [False, True])
def test_fold_bn_matches_conv_then_bn(bias):
    g = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(5, 7, 3, stride=2, padding=1, bias=bias)
    bn = _random_bn(7, g)
    x = torch.randn(2, 5, 9, 9, generator=g)
    w, b = fold_bn(conv, bn)
    with torch.no_grad():
        ref = bn(conv(x)).double()
    got = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 2, 1)
    assert w.dtype == torch.float32 and b.shape == (7,)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


def _randomize_bns(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)
    return model.eval()


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_graph_runs_like_the_model(name):
    from torchvision import models

    torch.manual_seed(0)
    model = _randomize_bns(models.get_model(name, weights=None))
    graph = resnet_graph(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x).double()
        got = run_float(graph, x.double())
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_graph_structure_of_resnet50():
    from torchvision import models

    g = resnet_graph(models.resnet50().eval())
    convs = g.convs()
    assert len(convs) == 53  # stem + 16 blocks × 3 + 4 downsamples
    assert isinstance(g.nodes[1], PoolNode) and isinstance(g.nodes[-1], HeadNode)
    by_name = {n.name: n for n in convs}
    c3 = by_name["layer1.0.conv3"]
    assert c3.residual == "layer1.0.downsample" and c3.relu and c3.out == "layer1.0"
    assert by_name["layer1.1.conv3"].residual == "layer1.0"
    assert not by_name["layer2.0.downsample"].relu and by_name["layer2.0.downsample"].stride == 2
    assert by_name["layer2.0.conv2"].stride == 2  # torchvision v1.5: stride on the 3×3
    shapes = infer_shapes(g, 224)
    assert (
        shapes["pool"] == (56, 56, 64)
        and shapes["layer4.2"] == (7, 7, 2048)
        and shapes["logits"] == (1, 1, 1000)
    )
    macs = conv_macs(g, 224)
    assert 4.0e9 < sum(macs.values()) < 4.2e9  # ResNet-50: 4.1 GMAC
    consumers = {(n.name, role) for n, role in g.consumers("layer1.0")}
    assert consumers == {("layer1.1.conv1", "input"), ("layer1.1.conv3", "residual")}


def test_unsupported_models_are_refused_with_a_reason():
    from torchvision import models

    from deepgap.measure.models.tiny import build_tinycnn

    with pytest.raises(UnsupportedModelError, match="torchvision ResNets"):
        resnet_graph(build_tinycnn(32).eval())
    with pytest.raises(UnsupportedModelError, match="grouped convolution"):
        resnet_graph(models.resnext50_32x4d().eval())
    with pytest.raises(UnsupportedModelError, match="training mode"):
        resnet_graph(models.resnet18().train())


def test_conv_node_geometry():
    n = ConvNode("c", "a", "b", torch.zeros(8, 4, 3, 3), torch.zeros(8), stride=2, padding=1, relu=True)
    assert (n.cin, n.cout, n.kernel_size) == (4, 8, 3)
    assert n.out_hw(56, 56) == (28, 28) and n.out_hw(7, 7) == (4, 4)
