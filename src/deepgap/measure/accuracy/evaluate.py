"""Worker side of accuracy mode: decode the evaluation split once, score a prepared engine on it.

Decoding runs in a pool of threads (``dataset_workers`` option; default 0 on a host of ≤ 4 cores, else
2 per 1,000 images up to 8), once per worker process and resolution: the centre-cropped images are
cached as uint8 (a quarter of float32's memory: ImageNet's 50,000 validation images at 224² take
7.5 GB) and normalised per batch.
The fp32 reference is the eager model on the same device with TF32 off, computed once per model and
cached with the images; each configuration then runs its own prepared engine at its own batch size
(the last batch padded by repeating its last image, the padding's outputs dropped).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as tvf

from deepgap.core.errors import UsageError
from deepgap.core.records import is_resident
from deepgap.measure.accuracy.dataset import reload
from deepgap.measure.images import IMAGENET_MEAN, IMAGENET_STD
from deepgap.measure.resident import resident_input

REFERENCE_BATCH = 64


def decode_rgb(path: Path, data: bytes):
    """A uint8 (3, H, W) tensor of the image in RGB (PIL decodes; grey and RGBA are converted)."""
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
    img = tvf.resize(img, [round(resolution * 256 / 224)], antialias=True)
    img = tvf.center_crop(img, [resolution, resolution])
    x = img.to(torch.float32) / 255.0
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std


class _Images:
    """A map-style dataset: item i → (uint8 (3, R, R) tensor, label), decoded and centre-cropped."""

    def __init__(self, items: list[tuple[str, int]], resolution: int) -> None:
        self.items, self.resolution = items, resolution

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        img = decode_rgb(Path(path), Path(path).read_bytes())
        img = tvf.resize(img, [round(self.resolution * 256 / 224)], antialias=True)
        return tvf.center_crop(img, [self.resolution, self.resolution]), label


def workers(options: dict[str, Any], n_images: int) -> int:
    """Decoding threads: ``dataset_workers``, else 0 (≤ 4 cores, < 1000 images) or 2 per 1,000 up to 8.

    Why threads and not DataLoader processes: the measuring worker is a daemonic process, which may not
    start children, and it may hold a CUDA context, which must never be forked. PIL's decoding and
    torch's resize release the GIL, so threads decode in parallel; on a small set or a small host
    serial decoding is as fast.
    """
    n = options.get("dataset_workers")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    cores = os.cpu_count() or 1
    return 0 if cores <= 4 or n_images < 1000 else min(8, cores, 2 * (n_images // 1000))


def decode(items: list[tuple[str, int]], resolution: int, num_workers: int = 0):
    """(uint8 images (N, 3, R, R), int64 labels (N,)), in the items' order; ``num_workers`` threads."""
    ds = _Images(items, resolution)
    if num_workers:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="deepgap-decode") as pool:
            pairs = list(pool.map(ds.__getitem__, range(len(ds))))
    else:
        pairs = [ds[i] for i in range(len(ds))]
    if not pairs:
        empty = torch.empty((0, 3, resolution, resolution), dtype=torch.uint8)
        return empty, torch.empty(0, dtype=torch.long)
    return torch.stack([x for x, _ in pairs]), torch.tensor([y for _, y in pairs], dtype=torch.long)


def normalise(u8):
    """uint8 (N, 3, R, R) → float32, ImageNet mean/std (torchvision's evaluation transform)."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (u8.float() / 255.0 - mean) / std


def _scores(logits, labels) -> tuple[float, float]:
    k = min(5, logits.shape[1])
    top = logits.topk(k, 1).indices
    return float((top[:, 0] == labels).float().mean()), float((top == labels[:, None]).any(1).float().mean())


def _data(state, info: dict[str, Any], resolution: int, options: dict[str, Any]):
    cache = getattr(state, "accuracy_cache", None) or {}
    key = ("data", info["sha"], info["split_seed"], info["eval_images"], resolution)
    if key not in cache:
        _, _, ev = reload(info)
        cache = {key: decode(ev, resolution, workers(options, len(ev)))}  # one dataset in memory at a time
        state.accuracy_cache = cache
    return cache[key]


def _reference(state, model_fn, key, x_u8, device: str):
    """fp32 eager logits' argmax per image on ``device``, TF32 off; cached per model and data."""
    cache = state.accuracy_cache
    if ("ref", key) not in cache:
        m = model_fn().to(device)
        prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            with torch.inference_mode():
                out = [
                    m(normalise(x_u8[i : i + REFERENCE_BATCH]).to(device)).float().cpu()
                    for i in range(0, x_u8.shape[0], REFERENCE_BATCH)
                ]
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
        cache[("ref", key)] = torch.cat(out)
        del m
    return cache[("ref", key)]


def evaluate(state, req, prepared, min_accuracy: float | None = None) -> dict[str, Any]:
    """Top-1/top-5 of ``prepared`` on the evaluation split, its fp32 reference's, and their agreement."""
    spec, info = req.spec, req.options["dataset"]
    x_u8, labels = _data(state, info, spec.resolution, req.options)
    ref_key = (spec.model, spec.resolution, req.weights, req.seed, spec.device)
    ref = _reference(
        state,
        lambda: state.model(spec.model, spec.resolution, req.weights, req.seed),
        ref_key,
        x_u8,
        spec.device,
    )
    b, n = spec.batch_size, x_u8.shape[0]
    outs = []
    with torch.inference_mode():
        for i in range(0, n, b):
            xb = normalise(x_u8[i : i + b])
            real = xb.shape[0]
            if real < b:
                xb = torch.cat([xb, xb[-1:].expand(b - real, -1, -1, -1)])
            # a resident input (spec.input_mode) is scored as it was timed: the engine's own input of the batch
            xb = xb.to(torch.float32 if is_resident(spec.input_mode) else prepared.input_dtype)
            if spec.memory_format == "channels_last":
                xb = xb.contiguous(memory_format=torch.channels_last)
            xb = xb.to(spec.device)
            if is_resident(spec.input_mode):
                xb = resident_input(spec, prepared, xb)
            outs.append(prepared.run(xb).float().cpu()[:real].reshape(real, -1))
    logits = torch.cat(outs)
    top1, top5 = _scores(logits, labels)
    ref1, ref5 = _scores(ref, labels)
    return {
        "top1": top1,
        "top5": top5,
        "top1_fp32": ref1,
        "top5_fp32": ref5,
        "top1_relative": (top1 / ref1) if ref1 > 0 else None,
        "top1_agreement_fp32": float((logits.argmax(1) == ref.argmax(1)).float().mean()),
        "n": int(n),
        "subset": info["subset"],
        "dataset_sha": info["sha"],
        "min_relative": min_accuracy,
        "reference": "fp32 eager on the same device, TF32 off, same images",
    }


def record(state, req, prepared, result) -> None:
    """Store ``details.accuracy`` and the run's ``min_accuracy``; a failed data pass keeps the timing."""
    import traceback

    from deepgap.core.result_details import Accuracy

    mina = req.options.get("min_accuracy")
    if mina is not None:
        result.details.min_accuracy = mina
    if not req.options.get("dataset"):
        return
    try:
        result.details.accuracy = Accuracy.from_json(evaluate(state, req, prepared, mina))
    except Exception as exc:  # noqa: BLE001 - the measurement stands; say why there is no accuracy
        result.details.accuracy = Accuracy(
            error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
            traceback=traceback.format_exc()[-2000:],
        )
