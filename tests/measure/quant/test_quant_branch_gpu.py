"""The shortcut convolutions on a second stream (`quant.branch`) on a GPU: captured, replayed, chosen by time.

    python -m pytest tests/measure/quant/test_quant_branch_gpu.py -v -rA

ResNet-50 quant at batch 1 with ``DEEPGAP_QUANT_BRANCH=auto``: the engine captures the network with its four
downsamples forked onto a second stream and joined before their blocks' last convolution. The branched graph
must give the serial graph's logits bit for bit (the same kernels), replay after replay; the engine records
both times and keeps the faster.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.parametrize("qfmt", ["fp8", "int8"])
def test_the_branched_graph_gives_the_serial_logits_and_is_timed(monkeypatch, qfmt):
    from torchvision import models

    from deepgap.measure import correctness
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    monkeypatch.setenv("DEEPGAP_QUANT_BRANCH", "auto")
    torch.manual_seed(0)
    model = models.resnet50().eval()
    res = prepare_quant(model, qfmt, 1, 224, "resnet50", device=DEV, opts=QuantOptions(calib_images=4))
    b = res.info["branch"]
    assert b["side"] == [f"layer{k}.0.downsample" for k in (1, 2, 3, 4)] and "error" not in b, b
    assert set(b["seconds"]) == {"serial", "branched"} and all(v > 0 for v in b["seconds"].values()), b
    assert res.net.side is None  # the kept graph holds the branches; an eager forward runs serially
    x = torch.randn(1, 3, 224, 224, device=DEV)
    xh = x.half().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        first = res.run(xh).clone()
        for _ in range(3):
            assert torch.equal(res.run(xh), first)
        assert torch.equal(res.net.forward(xh), first)  # the serial eager forward: the same kernels
        agree = correctness.compare(first, model.cuda()(x), qfmt)
    assert not agree.flagged, agree
