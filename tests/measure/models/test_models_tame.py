"""Random-weight networks whose activations would overflow fp16 are scaled by a power of two (exactly)."""

from __future__ import annotations

import copy

import torch

from deepgap.measure.models.build import ACTIVATION_CEILING, build_model, peak_activation, tame_activations
from deepgap.measure.models.registry import resolve_model


def _features(model, x):
    head = copy.deepcopy(model)
    head.fc = torch.nn.Identity()
    with torch.no_grad():
        return head(x)


def test_resnet101_is_scaled_exactly_below_the_ceiling():
    torch.manual_seed(0)
    raw = resolve_model("resnet101").build(64).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    assert (
        peak_activation(raw, x) > 8 * ACTIVATION_CEILING
    )  # identity BatchNorm: the residual stream grows (1e5 at 224²)
    tamed = copy.deepcopy(raw)
    factor = tame_activations(tamed, 64, 0)
    assert factor < 1 and factor == 2.0 ** round(torch.log2(torch.tensor(factor)).item())  # a power of two
    assert peak_activation(tamed, x) <= 4 * ACTIVATION_CEILING  # another input than the probe, same order
    # positively homogeneous up to the classifier: every feature scaled by exactly the factor
    assert torch.equal(_features(tamed, x), _features(raw, x) * factor)
    assert torch.equal(build_model("resnet101", 64).layer1[0].conv1.weight, raw.layer1[0].conv1.weight)


def test_networks_within_the_ceiling_are_left_alone():
    torch.manual_seed(0)
    raw = resolve_model("resnet18").build(64).eval()
    built = build_model("resnet18", 64)
    assert all(
        torch.equal(a, b) for a, b in zip(raw.state_dict().values(), built.state_dict().values(), strict=True)
    )
    assert tame_activations(copy.deepcopy(raw), 64, 0) == 1.0
