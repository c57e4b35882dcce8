"""One FLOP counter: the worker's ``flops_per_image`` and the roofline's `ModelCost` both come from
`deepgap.measure.models.flops`, and on the ResNets they give the number torch's own ``FlopCounterMode`` gave the
worker before (the worker used that mode directly until the two counters were merged).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from deepgap.measure.models.build import build_model
from deepgap.measure.models.flops import count_flops
from deepgap.measure.worker import WorkerState
from deepgap.roofline.flops import model_cost

BATCH = 4
RES = 224


def _torch_flops(model, x) -> float:
    """The worker's former count: torch's FlopCounterMode around one inference forward."""
    with FlopCounterMode(display=False) as fc, torch.inference_mode():
        model(x)
    return float(fc.get_total_flops())


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "resnet101"])
def test_counter_equals_torch_flop_counter_and_model_cost(name):
    model = build_model(name, RES).to("meta").eval()
    x = torch.randn(BATCH, 3, RES, RES, device="meta")
    before = _torch_flops(model, x)
    with torch.inference_mode():
        now = count_flops(model, x)
    assert before > 1e9 * BATCH  # a real count, not zero
    assert now == before
    assert model_cost(name, RES).flops_per_image * BATCH == pytest.approx(now, rel=1e-12)


def test_worker_flops_per_image_is_the_counter():
    state = WorkerState("cpu")
    flops, params, _ = state.model_facts("resnet18", 64, None, 0)
    model = build_model("resnet18", 64)
    assert flops == _torch_flops(model, torch.randn(1, 3, 64, 64))
    assert flops == model_cost("resnet18", 64).flops_per_image
    assert params == sum(p.numel() for p in model.parameters())
