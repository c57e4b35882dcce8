"""The whole-network kernel (quant.whole) on a GPU: one program an SM, grid barriers, CUDA-graph replays.

    python -m pytest tests/measure/quant/test_quant_whole_gpu.py -v -rA

ResNet-50 at 224² and batch 1 with every split-K slice its plan deals: each layer's output against the exact
reference of that layer on the kernel's own input (int8 bit for bit; fp8 by the tuner's rule), the barrier and
split-K counters back to zero after each launch, and graph replays equal to the first launch. Then the engine's
choice at batch 1, end to end.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"
_FORM = {"barrier": 1, "warps": 8, "stages": 3}  # the engine's (`whole_choice`)


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def _net(name: str, qfmt: str):
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.get_model(name, weights=None).eval())
    amax = collect_amax(graph, calibration_images(2, 224, 0), method="max")
    return build(graph, qfmt, amax, {}, 224).to(DEV)


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("flow", [False, True], ids=["barriers", "dataflow"])
def test_resnet50_batch_1_on_every_sm_equals_each_layers_reference_and_replays(qfmt, flow):
    from deepgap.measure.quant import layers, whole_choice, whole_plan

    net = _net("resnet50", qfmt)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = whole_plan.build(net, 1, sms, flow=flow, **_FORM)
    images = torch.randn(1, 3, 224, 224, device=DEV).half().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        x = net.run_stem(images, "torch").contiguous()
        assert whole_choice.check_plan(net, plan, x) is None
        if qfmt == "int8":  # the tuner's rule allows ±1 in 0.1%; the kernel's int32 sums are exact
            seen = {plan.input: x}
            for name in plan.names:
                n = net.convs[name].node
                h, w, _ = net.shapes[n.inp]
                ref = layers.conv_reference(net.convs[name], seen[n.inp], (1, h, w), seen.get(n.residual))
                assert torch.equal(plan.view(n.out), ref), name
                seen[n.out] = plan.view(n.out)
        first = plan.run(x).clone()
        torch.cuda.synchronize()
        assert not plan.sync.any() and not plan.cnt.any()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=stream):
            plan.run(x)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(plan.view(plan.output), first)
        assert not plan.sync.any() and not plan.cnt.any() and not plan.counters.any() and not plan.flagged()


def test_the_engine_times_it_at_batch_1_and_its_logits_hold(monkeypatch):
    from torchvision import models

    from deepgap.measure import correctness
    from deepgap.measure.quant.network import WHOLE_STEP
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    monkeypatch.setenv("DEEPGAP_QUANT_WHOLE", "on")
    torch.manual_seed(0)
    model = models.resnet18().eval()
    res = prepare_quant(model, "fp8", 1, 224, "resnet18", device=DEV, opts=QuantOptions(calib_images=4))
    w = res.info["whole"]
    assert w["mode"] == "on" and w["per_layer_s"] > 0, w
    assert w["seconds"] and all(isinstance(v, float) for v in w["seconds"].values()), w
    assert (w["kept"] is None) == (res.net.whole is None)
    if w["kept"]:
        assert [n for n, _ in res.net.steps(1)][1] == WHOLE_STEP
    x = torch.randn(1, 3, 224, 224, device=DEV)
    with torch.inference_mode():
        agree = correctness.compare(
            res.run(x.half().contiguous(memory_format=torch.channels_last)), model.cuda()(x), "fp8"
        )
    assert not agree.flagged, agree
