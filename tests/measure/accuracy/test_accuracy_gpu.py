"""Accuracy mode on the GPU: a ResNet-18 trained here on coloured images, scored at fp32/fp16 (eager)
and int8/fp8 (the quant engine, calibrated on the dataset's disjoint split).

Run on the device machine (no network: the dataset and the weights are made here, in seconds):
``python -m pytest tests/measure/accuracy/test_accuracy_gpu.py -v -rA``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
CLASSES = 10
PER_CLASS = 12


def _folder(root):
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = rng.integers(20, 236, (CLASSES, 3))
    for c in range(CLASSES):
        (root / f"c{c:02d}").mkdir(parents=True)
        for j in range(PER_CLASS):
            a = np.clip(colours[c][None, None, :] + rng.normal(0, 12, (72, 72, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(a).save(root / f"c{c:02d}" / f"{j:03d}.jpg", quality=95)


def _train(root, weights):
    from deepgap.measure.accuracy.dataset import load
    from deepgap.measure.accuracy.evaluate import decode, normalise
    from deepgap.measure.models.build import build_model

    ds = load(str(root))
    x, y = decode(list(ds.items), 224)
    x, y = normalise(x).cuda(), y.cuda()
    torch.manual_seed(0)
    m = build_model("resnet18", 224).cuda().train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(80):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        acc = float((m(x).argmax(1) == y).float().mean())
    assert acc >= 0.9, f"ResNet-18 learnt only {acc:.0%} of the colours"
    torch.save({k: v.cpu() for k, v in m.state_dict().items()}, weights)


def test_quant_engine_calibrated_on_the_dataset(tmp_path, monkeypatch):
    import deepgap
    from deepgap.drive.config import SweepSpec

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path / "cache"))
    _folder(tmp_path / "data")
    _train(tmp_path / "data", tmp_path / "r18.pt")
    spec = SweepSpec(
        models=("resnet18",),
        engines=("eager", "quant"),
        precisions=("fp32", "fp16", "int8", "fp8"),
        batch_sizes=(16,),
        device="cuda",
        warmup=3,
        iterations=10,
        repeats=2,
        max_time_s=10.0,
        weights=str(tmp_path / "r18.pt"),
        dataset=str(tmp_path / "data"),
        idle_s=0.0,
    )
    out = deepgap.run(spec, store=str(tmp_path / "a.sqlite"))
    by = {(r.spec.engine, r.spec.precision): r for r in out.results}
    ok = {k: r for k, r in by.items() if r.status.value == "ok"}
    assert set(ok) == {("eager", "fp32"), ("eager", "fp16"), ("quant", "int8"), ("quant", "fp8")}, {
        k: r.reason for k, r in by.items()
    }
    n_eval = CLASSES * PER_CLASS - min(64, CLASSES * PER_CLASS // 2)
    for k, r in ok.items():
        acc = r.details.accuracy.to_json()
        print(
            k,
            {a: acc.get(a) for a in ("top1", "top5", "top1_relative", "top1_agreement_fp32", "n")},
            "error" in acc and acc["error"],
        )
        assert acc["n"] == n_eval, acc
        assert acc["top1_fp32"] >= 0.9  # the trained model on held-out images
    assert ok[("eager", "fp32")].details.accuracy.top1_agreement_fp32 >= 0.98
    for p in ("int8", "fp8"):
        r = ok[("quant", p)]
        cal = r.details.engine_info.calibration
        print(p, cal)
        assert cal["source"]["source"] == "dataset" and cal["images"] == min(64, CLASSES * PER_CLASS // 2)
        assert cal["source"]["dataset_sha"] == r.details.accuracy.dataset_sha
        assert r.details.accuracy.top1_relative >= 0.95, r.details.accuracy.to_json()
    assert ok[("quant", "fp8")].details.engine_info.calibration["from_cache"]  # the ranges are shared
