"""Image files as model inputs, shared by calibration sets, labelled datasets and the serving ring.

Which files count as images, RGB decoding (PIL), torchvision's evaluation transform (resize the shorter
side, centre crop, ImageNet mean/std), and the ``calibration_images`` count, which sizes both a
calibration set (`deepgap.measure.calibration_data`) and a labelled set's calibration split
(`deepgap.measure.accuracy.dataset`). One module below both, so that neither imports the other's layer upward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepgap.core.errors import UsageError

DEFAULT_CALIBRATION_IMAGES = 64
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".pgm", ".tif", ".tiff")


def options_count(options: dict[str, Any] | None) -> int:
    """N from the sweep option ``calibration_images`` (default `DEFAULT_CALIBRATION_IMAGES`), validated."""
    n = (options or {}).get("calibration_images", DEFAULT_CALIBRATION_IMAGES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(
            f"option calibration_images must be a positive integer, got {n!r}",
            "set e.g. calibration_images = 64",
        )
    return n


def decode_rgb(path: Path, data: bytes):
    """A uint8 (3, H, W) tensor of the image in RGB (PIL decodes; grey and RGBA are converted)."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            arr = np.asarray(im.convert("RGB"))
    except Exception as exc:
        raise UsageError(
            f"calibration image {path} cannot be decoded ({type(exc).__name__}: {exc})",
            "remove it from calibration_dir",
        ) from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def preprocess(img, resolution: int):
    """uint8 (3, H, W) → float32 (3, R, R): resize the shorter side, centre crop, ImageNet-normalize."""
    import torch
    from torchvision.transforms.v2 import functional as tvf

    img = tvf.resize(img, [round(resolution * 256 / 224)], antialias=True)
    img = tvf.center_crop(img, [resolution, resolution])
    x = img.to(torch.float32) / 255.0
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std
