"""FLOP and byte counts against hand-computed values (layers, tiny models, ResNet-50's 4.1 GMAC)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deepgap.measure.models.flops import count_flops, op_counter
from deepgap.roofline.flops import cost_of_module, model_cost


def test_conv2d_forward_flops_by_hand():
    conv = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
    x = torch.randn(2, 3, 32, 32)
    # output 16×16×16 per image, each a 3·3·3 dot product: 2 FLOPs per MAC
    assert count_flops(conv, x) == 2 * 2 * (16 * 16 * 16) * (3 * 3 * 3)


def test_linear_flops_by_hand_and_bias_not_counted():
    lin = nn.Linear(16, 10)
    assert count_flops(lin, torch.randn(4, 16)) == 2 * 4 * 16 * 10


def test_grouped_conv_backward_respects_groups():
    # A depthwise conv (groups = channels): forward = 2·H·W·C·k² per image; each gradient costs as much.
    dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
    x = torch.randn(1, 8, 10, 10, requires_grad=True)
    fwd = 2 * 10 * 10 * 8 * 9
    c = op_counter()
    with c:
        dw(x).sum().backward()
    by_op = {r.op: r.flops for r in c.records if r.flops}
    assert by_op["convolution.default"] == fwd
    assert by_op["convolution_backward.default"] == 2 * fwd  # grad input + grad weight, not 8× for the weight


def test_fused_multi_head_attention_is_counted():
    e, s, b = 32, 5, 2
    mha = nn.MultiheadAttention(e, 4, batch_first=True).eval()
    x = torch.randn(b, s, e)
    expected = 2 * b * s * e * e * 4 + 2 * 2 * b * s * s * e  # q,k,v,out projections + QKᵀ and AV
    c = op_counter()
    with torch.inference_mode(), c:
        mha(x, x, x, need_weights=False)
    assert sum(r.flops for r in c.records) == expected
    c = op_counter()
    with c:  # the unfused (grad-enabled) path: linear layers + CPU flash attention
        mha.train()(x, x, x, need_weights=False)
    assert sum(r.flops for r in c.records) == expected


def test_tinycnn_costs_by_hand():
    stem = 2 * 16 * 16 * 16 * 27  # 3→16, 3×3, stride 2 at 32² → 16²
    body = 2 * 16 * 16 * 16 * 144  # 16→16, 3×3 at 16²
    fc = 2 * 16 * 10
    infer = model_cost("tinycnn", 32, "infer")
    assert infer.flops_per_image == stem + body + fc
    assert infer.params == 3 * 16 * 9 + 2 * 16 + 16 * 16 * 9 + 2 * 16 + 16 * 10 + 10
    train = model_cost("tinycnn", 32, "train")
    # backward: the stem needs only its weight gradient (the input needs none), the body both, the linear both
    assert train.flops_per_image == (stem + body + fc) + stem + 2 * body + 2 * fc
    assert train.flops(64) == 64 * train.flops_per_image


def test_bytes_fixed_and_per_image_parts_by_hand():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))  # input 3×2×2 = 12 features
    cost = cost_of_module(model, "lin", 2, "infer")
    # addmm reads bias (5) and weight (60) once per batch, x (12/image), writes y (5/image); flatten: a view
    assert cost.traffic_elements_fixed == 65
    assert cost.traffic_elements_per_image == 17
    assert cost.traffic_bytes(4, "fp32") == (65 + 4 * 17) * 4
    assert cost.min_bytes(4, "fp16") == (65 + 4 * (12 + 5)) * 2  # weights once + input + logits
    assert cost.param_bytes("bf16") == 65 * 2
    assert cost.intensity(4, "fp32", "min") == pytest.approx(4 * 2 * 12 * 5 / ((65 + 4 * 17) * 4))


def test_train_minimum_bytes_count_weights_twice():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    cost = cost_of_module(model, "lin", 2, "train")
    assert cost.min_bytes(2, "fp32") == (2 * 65 + 2 * 17) * 4


def test_resnet50_matches_the_literature_4_1_gmac():
    cost = model_cost("resnet50", 224, "infer")
    assert cost.flops_per_image / 2 == pytest.approx(4.09e9, rel=0.01)
    assert cost.params == 25_557_032
    assert cost.param_bytes("fp16") == 2 * 25_557_032


def test_training_costs_about_three_forward_passes_even_with_depthwise_convolutions():
    infer = model_cost("mobilenet_v3_large", 224, "infer")
    train = model_cost("mobilenet_v3_large", 224, "train")
    assert infer.flops_per_image / 2 == pytest.approx(0.217e9, rel=0.02)  # 0.22 GMAC (torchvision)
    assert 2.5 < train.flops_per_image / infer.flops_per_image < 3.1


# the costs the report reads from deepgap/data/model_costs.json instead of counting (roofline.cost)
TABLE_KEYS = [
    ("resnet18", 224, "infer"),
    ("resnet50", 224, "infer"),
    ("resnet101", 224, "infer"),
    ("tinycnn", 32, "infer"),
]


def test_committed_cost_table_is_what_the_counter_counts():
    """The table holds exactly a fresh count of each entry under the installed torch (else it is not used)."""
    import os
    from pathlib import Path

    from deepgap.roofline import cost, model

    counted = [model_cost(*k) for k in TABLE_KEYS]
    if os.environ.get("DEEPGAP_REGEN_GOLDEN"):
        path = Path(cost.__file__).resolve().parent.parent / "data" / cost.TABLE
        path.write_text(cost.table_json(counted), encoding="utf-8")
        cost.table.cache_clear()
    assert cost.table() == {(c.model, c.resolution, c.mode): c for c in counted}
    assert model.model_cost("resnet50", 224) is cost.known("resnet50", 224)  # the parent reads, not counts
