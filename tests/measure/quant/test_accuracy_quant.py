"""The quant engine calibrated on a labelled set's split: the cache key names the data (CPU, torch path).

The GPU path (Triton kernels, CUDA graph, through `deepgap run --dataset`) is
tests/measure/accuracy/test_accuracy_gpu.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torchvision import models

from deepgap.measure.calibration_data import CalibrationSet
from deepgap.measure.quant.calibrate import CalibrationKey, calibrate
from deepgap.measure.quant.prepare import QuantOptions, prepare_quant


def test_prepare_quant_calibrates_on_given_images_keyed_by_their_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = models.resnet18().eval()
    images = 3.0 * torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))  # unlike N(0, 1)
    cs = CalibrationSet(
        images=images,
        source="dataset",
        fingerprint="feedc0ffee123456",
        info={"source": "dataset", "images": 4, "dataset_sha": "abc"},
    )
    opts = QuantOptions(
        calib_set=cs,
        calib_method="max",
        autotune=False,
        timing_reps=1,
        force_backend="torch",
        per_layer_choice=False,
    )
    res = prepare_quant(model, "int8", 1, 32, "resnet18", device="cpu", opts=opts)
    cal = res.info["calibration"]
    assert cal["source"] == cs.info and cal["images"] == 4 and not cal["from_cache"]
    from deepgap.measure.quant.calibrate import collect_amax

    assert res.amax == pytest.approx(collect_amax(res.graph, images, method="max"))  # ranges of these images
    key = CalibrationKey(
        "resnet18", 32, res.info.get("weights_sha") or _sha(model), 4, 0, "max", cs.fingerprint
    )
    assert key.path().is_file()  # cached under the data's key ...
    assert calibrate(res.graph, key, images=images) == (res.amax, True)
    synthetic = CalibrationKey(key.model, key.resolution, key.weights_sha, 4, 0, "max")
    assert not synthetic.path().exists()  # ... which a synthetic calibration never reads
    amax_syn, hit = calibrate(res.graph, synthetic)
    assert not hit and amax_syn != pytest.approx(res.amax)


def _sha(model):
    from deepgap.measure.models.build import weights_fingerprint

    return weights_fingerprint(model)


def test_key_with_data_needs_images():
    key = CalibrationKey("resnet18", 32, "w", 4, 0, "max", data="feedc0ffee123456")
    assert key.digest() != CalibrationKey("resnet18", 32, "w", 4, 0, "max").digest()
    with pytest.raises(ValueError, match="no images"):
        calibrate(SimpleNamespace(tensors=lambda: [], input="x"), key, use_cache=False)  # type: ignore[arg-type]


def test_engine_adapter_passes_the_calibration_split(tmp_path, monkeypatch):
    """engines/quant.py hands prepare_quant the dataset's calibration split (prepare_quant itself is stubbed:
    its GPU run is tests/measure/accuracy/test_accuracy_gpu.py)."""
    import numpy as np
    from PIL import Image

    import deepgap.measure.quant.prepare as qe
    from deepgap.core.records import ConfigSpec
    from deepgap.drive.config import SweepSpec
    from deepgap.measure.accuracy.dataset import describe, load, split
    from deepgap.measure.engines import get_engine

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for j in range(6):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / c / f"{j}.png")
    spec = SweepSpec(models=("resnet18",), dataset=str(tmp_path), options={"calibration_images": 4}, seed=3)
    info = describe(spec)
    seen = {}

    def fake(model, precision, batch, resolution, name, device="cuda", opts=None, weights_sha=None):
        seen["opts"] = opts
        return SimpleNamespace(run=lambda x: x, info={})

    monkeypatch.setattr(qe, "prepare_quant", fake)
    eng = get_engine("quant", {"dataset": info})
    cfg = ConfigSpec("resnet18", "quant", "int8", 2, "cuda", resolution=16)
    eng.prepare(None, cfg, torch.zeros(2, 3, 16, 16))
    cs = seen["opts"].calib_set
    cal, ev = split(load(str(tmp_path)), 4, None, 3)
    assert cs.images.shape == (4, 3, 16, 16) and cs.info["images"] == 4
    assert cs.info["source"] == "dataset" and cs.info["dataset_sha"] == info["sha"]
    assert len(ev) == 8 and not {p for p, _ in cal} & {p for p, _ in ev}
    from deepgap.measure.accuracy.evaluate import decode_rgb, preprocess

    want = torch.stack([preprocess(decode_rgb(Path(p), Path(p).read_bytes()), 16) for p, _ in cal])
    assert torch.allclose(cs.images, want, atol=1e-6)  # exactly the calibration split, preprocessed
