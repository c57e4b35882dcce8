"""Calibration images for post-training quantization (ORT static INT8, TensorRT INT8, the quant engine).

Not `deepgap.measure.quant.calibrate`, which turns images (in accuracy mode, `from_dataset`'s) into the quant
engine's activation ranges: this module only says which images calibrate. The paper calibrated TensorRT
on random Gaussian images and never said so; INT8 numbers are only meaningful when the calibration data
is stated. Three sources, recorded in every result:

- ``folder``: the user's images (sweep option ``calibration_dir``), a seeded sample of N files,
  decoded to RGB (PIL), resized (shorter side to ``resolution × 256/224``), centre-cropped to the
  resolution and normalized with the ImageNet mean/std — the torchvision evaluation transform;
- ``synthetic`` (default): N seeded images of N(0, 1) pixels. That is the distribution of the
  benchmark's own inputs and of the correctness check's images (drawn from other seeds, so
  quantization is never calibrated on the images it is checked on);
- ``dataset`` (accuracy mode): the labelled set's calibration split (`from_dataset`), disjoint from the
  images accuracy is scored on. This is why the module sits above `deepgap.measure.accuracy`; decoding and the
  evaluation transform are `deepgap.measure.accuracy.evaluate`'s.

``fingerprint`` identifies the set (file contents or seed), and goes into every cache key.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deepgap.core.errors import UsageError
from deepgap.measure.accuracy.dataset import reload
from deepgap.measure.accuracy.evaluate import decode, decode_rgb, normalise, preprocess, workers
from deepgap.measure.images import IMAGE_SUFFIXES, options_count

CALIBRATION_SEED_OFFSET = 7919  # keeps calibration images apart from the correctness/benchmark inputs


@dataclass
class CalibrationSet:
    """N calibration images, ``images`` a float32 tensor (N, 3, R, R) on the CPU, and where they came from."""

    images: Any
    source: str  # "folder" | "synthetic" | "dataset" (accuracy mode's calibration split)
    fingerprint: str
    info: dict[str, Any] = field(default_factory=dict)

    def batches(self, batch_size: int) -> Iterator[Any]:
        """The images in order, ``batch_size`` at a time (the last batch may be smaller)."""
        for i in range(0, int(self.images.shape[0]), batch_size):
            yield self.images[i : i + batch_size]


def calibration_set(resolution: int, options: dict[str, Any] | None = None, seed: int = 0) -> CalibrationSet:
    """The calibration set the sweep's ``options`` ask for (``calibration_dir``, ``calibration_images``)."""
    options = options or {}
    if options.get(
        "dataset"
    ):  # accuracy mode: the labelled set's calibration split (deepgap.measure.accuracy)
        return from_dataset(options["dataset"], resolution, options)
    n = options_count(options)
    directory = options.get("calibration_dir")
    if directory:
        return from_folder(str(directory), resolution, n, seed)
    return synthetic(resolution, n, seed)


def synthetic(resolution: int, n: int, seed: int = 0) -> CalibrationSet:
    """N seeded N(0, 1) images: the benchmark's input distribution, never its correctness images."""
    s = seed + CALIBRATION_SEED_OFFSET
    g = torch.Generator().manual_seed(s)
    images = torch.randn(n, 3, resolution, resolution, generator=g)
    fp = hashlib.sha256(f"synthetic:normal:{s}:{n}:{resolution}".encode()).hexdigest()[:16]
    info = {
        "source": "synthetic",
        "images": n,
        "seed": s,
        "resolution": resolution,
        "distribution": "N(0,1) per pixel, as the benchmark inputs (other seeds than the correctness images)",
    }
    return CalibrationSet(images=images, source="synthetic", fingerprint=fp, info=info)


def list_images(directory: str) -> list[Path]:
    """Image files under ``directory`` (recursive), sorted by relative path."""
    root = Path(os.path.expanduser(directory))
    if not root.is_dir():
        raise UsageError(
            f"calibration_dir {directory!r} is not a folder", "point calibration_dir at a folder of images"
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UsageError(
            f"calibration_dir {directory!r} holds no images ({', '.join(IMAGE_SUFFIXES)})",
            "add images or drop calibration_dir to calibrate on the synthetic set",
        )
    return files


def from_folder(directory: str, resolution: int, n: int, seed: int = 0) -> CalibrationSet:
    """A seeded sample of ``n`` images from ``directory``, preprocessed as torchvision's evaluation transform."""
    files = list_images(directory)
    if len(files) > n:
        files = sorted(random.Random(seed + CALIBRATION_SEED_OFFSET).sample(files, n))
    h = hashlib.sha256(f"folder:{resolution}".encode())
    images = []
    for path in files:
        data = path.read_bytes()
        h.update(hashlib.sha256(data).digest())
        images.append(preprocess(decode_rgb(path, data), resolution))
    info = {
        "source": "folder",
        "directory": str(Path(directory).expanduser().resolve()),
        "images": len(files),
        "seed": seed + CALIBRATION_SEED_OFFSET,
        "resolution": resolution,
        "transform": (
            f"resize shorter side to {round(resolution * 256 / 224)}, centre crop {resolution}, ImageNet mean/std"
        ),
    }
    if len(files) < n:
        info["note"] = f"asked for {n} images, the folder has {len(files)}"
    return CalibrationSet(
        images=torch.stack(images), source="folder", fingerprint=h.hexdigest()[:16], info=info
    )


def from_dataset(
    info: dict[str, Any], resolution: int, options: dict[str, Any] | None = None
) -> CalibrationSet:
    """The labelled set's calibration split (``info`` is ``options['dataset']``); its fingerprint names it."""
    ds, cal, _ = reload(info)
    x, _ = decode(cal, resolution, workers(options or {}, len(cal)))
    fp = hashlib.sha256(
        f"dataset:{ds.sha}:{info['split_seed']}:{len(cal)}:{resolution}".encode()
    ).hexdigest()[:16]
    meta = {
        "source": "dataset",
        "dataset": ds.path,
        "dataset_sha": ds.sha,
        "images": len(cal),
        "split_seed": info["split_seed"],
        "resolution": resolution,
        "transform": f"resize shorter side to {round(resolution * 256 / 224)}, centre crop {resolution}, "
        "ImageNet mean/std",
        "disjoint_from": f"the {info['eval_images']} evaluation images",
    }
    return CalibrationSet(images=normalise(x), source="dataset", fingerprint=fp, info=meta)
