"""The quant engine calibrated on a labelled set's split: the cache key names the data (CPU, torch path).

The GPU path (Triton kernels, CUDA graph, through `deepgap run --dataset`) is tests/test_accuracy_gpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torchvision import models

from deepgap.calibration import CalibrationSet
from deepgap.quant.calibrate import CalibrationKey, calibrate
from deepgap.quant.engine import QuantOptions, prepare_quant


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
    from deepgap.quant.calibrate import collect_amax

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
    from deepgap.models import weights_fingerprint

    return weights_fingerprint(model)


def test_key_with_data_needs_images():
    key = CalibrationKey("resnet18", 32, "w", 4, 0, "max", data="feedc0ffee123456")
    assert key.digest() != CalibrationKey("resnet18", 32, "w", 4, 0, "max").digest()
    with pytest.raises(ValueError, match="no images"):
        calibrate(SimpleNamespace(tensors=lambda: []), key, use_cache=False)  # type: ignore[arg-type]
