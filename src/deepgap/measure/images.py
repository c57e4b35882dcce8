"""Image files as model inputs, shared by calibration sets, labelled datasets and the serving ring.

Which files count as images, ImageNet's mean/std, and the ``calibration_images`` count, which sizes both a
calibration set (`deepgap.measure.calibration_data`) and a labelled set's calibration split
(`deepgap.measure.accuracy.dataset`). One module below both, so that neither imports the other's layer upward;
torch-free, as the parent checks these options. Decoding and the evaluation transform are worker side
(`deepgap.measure.accuracy.evaluate`).
"""

from __future__ import annotations

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
